"""The pseudonymization client speaks ``$de-identify`` as spec/protocols.md says, against the fake service."""

from __future__ import annotations

import asyncio
import itertools
import base64
import hashlib
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from config.services import AuthSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceEndpoint, build_async_client
from tasks.clients.pseudonymizer import (
    MB,
    AnonymizationConfig,
    EntryTooLargeError,
    PseudonymizationError,
    Pseudonymizer,
    RequestBody,
    checked_answer,
    compact_size,
    reassemble_bundle,
    split_bundle,
)
from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer
from tests.fakes.pseudonymizer import DEFAULT_SERVER_CONFIG, RecordedRequest, deidentify

OVERRIDE_DIR = TESTDATA / "pseudonymizer" / "request-override"
OVERRIDE_CONFIG = OVERRIDE_DIR / "anonymization.yaml"
FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)


# --- shared helpers (also used by test_pseudonymizer_step) -----------------------------------------------------


@asynccontextmanager
async def open_service(
    pseudonymizer_fake: LoopbackServer, auth: AuthSettings | None = None, **options: Any
) -> AsyncIterator[Pseudonymizer]:
    endpoint = ServiceEndpoint("pseudonymizer", pseudonymizer_fake.base_url, auth or AuthSettings())
    async with build_async_client(endpoint, TlsSettings()) as client:
        yield Pseudonymizer(client, FAST_RETRY, **options)


def pseudonymize(pseudonymizer_fake: LoopbackServer, resource: dict[str, Any], **options: Any):
    async def run():
        async with open_service(pseudonymizer_fake, **options) as service:
            return await service.pseudonymize(orjson.dumps(resource), resource)

    return asyncio.run(run())


def server_side(resource: dict[str, Any], pseudonymizer_fake: LoopbackServer) -> dict[str, Any]:
    """What the fake makes of ``resource`` with its own config (computed by the fake's code, not ours)."""
    return deidentify(resource, pseudonymizer_fake.state.config_for(DEFAULT_SERVER_CONFIG))


def patient(i: int, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Patient", "id": f"p{i}", "name": [{"family": f"Doe{i}"}], "gender": "female", **extra}


def observation_bundle(count: int, pad: int, bundle_id: str = "b1") -> dict[str, Any]:
    entries = [
        {
            "fullUrl": f"urn:uuid:obs-{i}",
            "resource": {
                "resourceType": "Observation",
                "id": f"o{i}",
                "valueInteger": i,
                "note": [{"text": "x" * pad}],
            },
        }
        for i in range(count)
    ]
    return {
        "resourceType": "Bundle",
        "id": bundle_id,
        "type": "collection",
        "timestamp": "2024-05-01T10:00:00Z",
        "entry": entries,
    }


class ConcurrencyProbe:
    """A fake status hook that holds each request a while (random when ``jitter``) and records how many overlap
    and in which order they finish (as indices of arrival).

    With ``fill``, the first requests are held until ``fill`` of them are in flight at once (or ``fill_timeout``
    passed), so the overlap the client allows is seen whatever the machine's load, not only when timing permits.
    """

    def __init__(
        self,
        pseudonymizer_fake: LoopbackServer,
        hold_seconds: float,
        jitter: bool = False,
        fill: int = 0,
        fill_timeout: float = 30.0,
    ):
        self._fake, self._hold, self._jitter = pseudonymizer_fake, hold_seconds, jitter
        self._fill, self._fill_timeout = fill, fill_timeout
        self._filled = threading.Event()
        self._lock = threading.Lock()
        self._current = 0
        self.most_in_flight = 0
        self.finished: list[int] = []

    def __call__(self, recorded: RecordedRequest) -> None:
        with self._lock:
            self._current += 1
            self.most_in_flight = max(self.most_in_flight, self._current)
            arrival = next(i for i, r in enumerate(self._fake.state.requests) if r is recorded)
            if self._current >= self._fill:
                self._filled.set()
        self._filled.wait(self._fill_timeout)
        time.sleep(self._hold * ((hash((arrival, 7)) % 100) / 100 if self._jitter else 1))
        with self._lock:
            self._current -= 1
            self.finished.append(arrival)
        return None


# --- request shapes ---------------------------------------------------------------------------------------------


def test_without_a_config_the_bare_resource_is_posted_as_fhir_json_and_the_answer_is_the_resource(pseudonymizer_fake):
    result = pseudonymize(pseudonymizer_fake, patient(1))

    (request,) = pseudonymizer_fake.state.requests
    assert (request.path, request.body_kind, request.status) == ("/fhir/$de-identify", "resource", 200)
    assert request.headers["content-type"] == "application/fhir+json"
    assert request.headers["accept"] == "application/fhir+json"
    assert orjson.loads(result.line) == server_side(patient(1), pseudonymizer_fake)
    assert (result.requests, result.split) == (1, False)


def test_with_a_config_the_body_is_parameters_with_the_config_part_then_the_resource_part(pseudonymizer_fake):
    config = AnonymizationConfig.read(OVERRIDE_CONFIG)
    result = pseudonymize(pseudonymizer_fake, patient(1), config=config)

    (request,) = pseudonymizer_fake.state.requests
    assert request.body_kind == "parameters"
    assert request.parameter_names == ["config", "resource"]
    assert request.config_sha256 == hashlib.sha256(OVERRIDE_CONFIG.read_bytes()).hexdigest()
    # The request's rules were applied, not the server's: name and id kept, gender removed.
    assert orjson.loads(result.line) == {"resourceType": "Patient", "id": "p1", "name": [{"family": "Doe1"}]}


def test_the_parameters_body_carries_the_yaml_as_a_base64_attachment_and_the_resource_unchanged():
    config = AnonymizationConfig("x.yaml", b"fhirPathRules: []\n")
    resource_json = b'{"resourceType":"Observation","valueDecimal":1.50}'

    body = orjson.loads(RequestBody(config)(resource_json))

    assert body == {
        "resourceType": "Parameters",
        "parameter": [
            {
                "name": "config",
                "valueAttachment": {"contentType": "application/yaml", "data": base64.b64encode(config.data).decode()},
            },
            {"name": "resource", "resource": {"resourceType": "Observation", "valueDecimal": 1.5}},
        ],
    }
    assert resource_json in RequestBody(config)(resource_json)  # sent as read, decimals as written
    assert RequestBody(None)(resource_json) == resource_json


def test_the_config_bytes_stay_out_of_its_repr():
    assert "secret-hash-key" not in repr(AnonymizationConfig("a.yaml", b"parameters: {cryptoHashKey: secret-hash-key}"))


def test_the_api_key_is_sent_in_its_header(pseudonymizer_fake):
    pseudonymizer_fake.state.reset(api_key="k-123")
    result = pseudonymize(pseudonymizer_fake, patient(1), auth=AuthSettings(api_key=SecretStr("k-123")))
    assert orjson.loads(result.line)["resourceType"] == "Patient"
    assert pseudonymizer_fake.state.requests[0].status == 200


# --- splitting ---------------------------------------------------------------------------------------------------


def test_a_bundle_above_the_threshold_is_split_and_reassembled_with_every_entry_in_order(pseudonymizer_fake):
    bundle = observation_bundle(count=30, pad=100_000)  # ~3 MB, threshold 1 MB

    result = pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)

    requests = pseudonymizer_fake.state.requests
    assert result.split and result.requests == len(requests) >= 3
    assert all(r.body_kind == "bundle" and r.status == 200 and r.size <= 1 * MB for r in requests)
    out = orjson.loads(result.line)
    assert [e["resource"]["valueInteger"] for e in out["entry"]] == list(range(30))
    assert [e["resource"]["id"] for e in out["entry"]] == [
        e["resource"]["id"] for e in server_side(bundle, pseudonymizer_fake)["entry"]
    ]
    assert (out["type"], out["timestamp"]) == ("collection", "2024-05-01T10:00:00Z")
    assert out["id"] == server_side({"resourceType": "Bundle", "id": "b1-chunk-0"}, pseudonymizer_fake)["id"]


def test_a_bundle_at_or_below_the_threshold_is_sent_whole(pseudonymizer_fake):
    bundle = observation_bundle(count=3, pad=10)
    result = pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)
    assert (result.requests, result.split, len(pseudonymizer_fake.state.requests)) == (1, False, 1)
    assert orjson.loads(result.line) == server_side(bundle, pseudonymizer_fake)


def test_split_chunks_are_greedy_within_the_threshold_keep_bundle_fields_and_number_their_ids():
    bundle = observation_bundle(count=25, pad=100_000)
    threshold = 1 * MB

    chunks = split_bundle(bundle, threshold)

    assert [c["id"] for c in chunks] == [f"b1-chunk-{i}" for i in range(len(chunks))]
    assert all(c["type"] == "collection" and c["timestamp"] == bundle["timestamp"] for c in chunks)
    assert all(compact_size(c) <= threshold for c in chunks)
    assert [e for c in chunks for e in c["entry"]] == bundle["entry"]
    # Greedy: no chunk could have taken the next chunk's first entry.
    for chunk, following in itertools.pairwise(chunks):
        assert compact_size({**chunk, "entry": chunk["entry"] + following["entry"][:1]}) > threshold


def test_reassembly_takes_the_first_chunks_bundle_fields_the_original_type_and_all_entries_in_order():
    original = {"resourceType": "Bundle", "id": "b", "type": "transaction", "entry": [{"n": 1}, {"n": 2}, {"n": 3}]}
    chunks = [
        {"resourceType": "Bundle", "id": "h0", "type": "batch", "meta": {"tag": [1]}, "entry": [{"n": 1}, {"n": 2}]},
        {"resourceType": "Bundle", "id": "h1", "type": "batch", "entry": [{"n": 3}]},
    ]
    assert reassemble_bundle(original, chunks) == {
        "resourceType": "Bundle",
        "id": "h0",
        "type": "transaction",
        "meta": {"tag": [1]},
        "entry": [{"n": 1}, {"n": 2}, {"n": 3}],
    }


def test_an_entry_larger_than_the_threshold_fails_naming_it_its_size_and_the_remedies_without_a_request(
    pseudonymizer_fake,
):
    bundle = observation_bundle(count=3, pad=10)
    bundle["entry"][1]["resource"]["note"][0]["text"] = "y" * int(1.5 * MB)

    with pytest.raises(EntryTooLargeError) as caught:
        pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)

    message = str(caught.value)
    assert "entry 1 (Observation/o1)" in message and "1.5 MB" in message and "threshold of 1 MB" in message
    assert "services.pseudonymizer.bundle_split_threshold_mb (up to 100)" in message
    assert "request body limit" in message
    assert pseudonymizer_fake.state.requests == []


# --- errors and retry --------------------------------------------------------------------------------------------


def test_a_413_is_terminal_and_the_bundle_is_not_split_again(pseudonymizer_fake):
    pseudonymizer_fake.state.reset(max_body_bytes=2_000)
    bundle = observation_bundle(count=5, pad=1_000)  # ~5 KB: above the server limit, below the split threshold

    with pytest.raises(ServiceError) as caught:
        pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)

    assert (caught.value.status_code, caught.value.transient) == (413, False)
    assert [r.status for r in pseudonymizer_fake.state.requests] == [413]


def test_a_5xx_is_retried_until_it_succeeds(pseudonymizer_fake):
    pseudonymizer_fake.state.reset(fail_next=2, fail_status=503)
    result = pseudonymize(pseudonymizer_fake, patient(1))
    assert [r.status for r in pseudonymizer_fake.state.requests] == [503, 503, 200]
    assert orjson.loads(result.line) == server_side(patient(1), pseudonymizer_fake)


def test_a_connection_reset_is_retried(pseudonymizer_fake):
    pseudonymizer_fake.state.reset(reset_next=1)
    pseudonymize(pseudonymizer_fake, patient(1))
    assert [r.status for r in pseudonymizer_fake.state.requests] == [0, 200]


def test_another_4xx_is_terminal_and_carries_the_services_operation_outcome_text(pseudonymizer_fake):
    with pytest.raises(ServiceError) as caught:
        pseudonymize(pseudonymizer_fake, patient(1), config=AnonymizationConfig("bad.yaml", b"- not a mapping\n"))
    assert (caught.value.status_code, caught.value.transient) == (400, False)
    assert "anonymization config must be a YAML mapping" in str(caught.value)
    assert len(pseudonymizer_fake.state.requests) == 1


def test_a_failing_chunk_fails_the_bundle_with_the_services_error(pseudonymizer_fake):
    pseudonymizer_fake.state.reset(status_hook=lambda r: 422 if len(pseudonymizer_fake.state.requests) == 2 else None)
    with pytest.raises(ServiceError) as caught:
        pseudonymize(
            pseudonymizer_fake,
            observation_bundle(count=30, pad=100_000),
            split_threshold_mb=1,
            max_concurrent_requests=1,
        )
    assert caught.value.status_code == 422


def test_no_more_than_max_concurrent_requests_are_in_flight(pseudonymizer_fake):
    probe = ConcurrencyProbe(pseudonymizer_fake, hold_seconds=0.03, fill=3)
    pseudonymizer_fake.state.reset(status_hook=probe)

    async def run():
        async with open_service(pseudonymizer_fake, max_concurrent_requests=3) as service:
            await asyncio.gather(*(service.pseudonymize(orjson.dumps(patient(i)), patient(i)) for i in range(12)))

    asyncio.run(run())
    assert probe.most_in_flight == 3


# --- answers -----------------------------------------------------------------------------------------------------


def test_an_answer_of_another_type_is_refused():
    with pytest.raises(PseudonymizationError, match="'OperationOutcome' instead of a de-identified Patient"):
        checked_answer(b'{"resourceType":"OperationOutcome"}', patient(1))


def test_an_answer_that_drops_bundle_entries_is_refused():
    sent = observation_bundle(count=3, pad=1)
    answer = orjson.dumps({**sent, "entry": sent["entry"][:2]})
    with pytest.raises(PseudonymizationError, match="2 Bundle entries for 3 sent"):
        checked_answer(answer, sent)


def test_a_pretty_printed_answer_becomes_one_compact_line_and_a_compact_one_is_kept_as_written():
    pretty = b'{\n  "resourceType": "Observation",\n  "valueDecimal": 1.50\n}\n'
    compact = b'{"resourceType":"Observation","valueDecimal":1.50}'
    sent = {"resourceType": "Observation"}
    assert checked_answer(pretty, sent)[0] == b'{"resourceType":"Observation","valueDecimal":1.5}'
    assert checked_answer(compact, sent)[0] == compact


def test_a_missing_config_file_raises_os_error(tmp_path: Path):
    with pytest.raises(OSError):
        AnonymizationConfig.read(tmp_path / "missing.yaml")
