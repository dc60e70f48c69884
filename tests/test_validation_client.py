"""The validator client: chunks cut by size from NDJSON lines, fullUrls, findings, and the service's answers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest

from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.validator import (
    BODY_PREFIX,
    BODY_SUFFIX,
    CHUNK_EXTENSION,
    RESOURCE_EXTENSION,
    Chunk,
    ValidationServiceError,
    Validator,
    annotated,
    iter_chunks,
    read_findings,
)
from tasks.streams.ndjson import NdjsonError
from tests.fakes._server import LoopbackServer
from tests.support.validation import shared_data

FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)


def lines_of(*resources: dict[str, Any]) -> list[tuple[int, bytes]]:
    return [(number, orjson.dumps(r)) for number, r in enumerate(resources, start=1)]


def patient(i: int, pad: int = 0) -> dict[str, Any]:
    return {
        "resourceType": "Patient",
        "id": f"p{i}",
        "gender": "male",
        "text": {"status": "generated", "div": "x" * pad},
    }


def entries(chunk: Chunk) -> list[dict[str, Any]]:
    body = orjson.loads(chunk.body)
    assert (body["resourceType"], body["type"]) == ("Bundle", "collection")
    return body["entry"]


def validate(server: LoopbackServer, chunk: Chunk, read_timeout: float = 10) -> dict[str, Any]:
    endpoint = ServiceEndpoint("validation", server.base_url, None, timedelta(seconds=read_timeout))
    with ServiceClient(endpoint, TlsSettings(), FAST_RETRY) as client:
        return Validator(client).validate(chunk, "a.ndjson")


def one_chunk(*resources: dict[str, Any]) -> Chunk:
    (chunk,) = iter_chunks(lines_of(*resources), 1 << 20, "a.ndjson")
    return chunk


# --- chunks ------------------------------------------------------------------------------------------------------


def test_entries_carry_a_full_url_and_the_resource_bytes_as_read():
    line = b'{"resourceType":"Patient","id":"p1","birthDate":"1970-01-01"}'
    (chunk,) = iter_chunks([(1, line)], 1 << 20, "a.ndjson")

    assert (
        chunk.body
        == BODY_PREFIX + b'{"fullUrl":"http://localhost/fhir/Patient/p1","resource":' + line + b"}" + BODY_SUFFIX
    )
    assert (chunk.number, chunk.labels, chunk.oversized) == (1, ("Patient/p1",), False)


def test_a_bundle_given_full_urls_keeps_every_number_as_written():
    """A TORCH Bundle's entries have no fullUrl: the Bundle is written anew with them, and orjson made 1.5 of 1.50."""
    line = (
        b'{"resourceType":"Bundle","id":"b1","type":"transaction","entry":[{"resource":{"resourceType":"Observation",'
        b'"id":"o1","valueQuantity":{"value":1.50},"extension":[{"url":"u","valueDecimal":123456789012345678901.0}]},'
        b'"request":{"method":"PUT","url":"Observation/o1"}}]}'
    )
    (chunk,) = iter_chunks([(1, line)], 1 << 20, "a.ndjson")

    assert b'"value":1.50' in chunk.body and b"123456789012345678901.0" in chunk.body
    assert b'"fullUrl":"http://localhost/fhir/Observation/o1"' in chunk.body


def test_a_bundle_too_deep_to_be_written_anew_names_file_and_line():
    deep = b'{"a":' * 300 + b"1" + b"}" * 300
    line = (
        b'{"resourceType":"Bundle","type":"collection","entry":[{"resource":{"resourceType":"Basic","x":'
        + deep
        + b"}}]}"
    )
    with pytest.raises(NdjsonError, match=r"a\.ndjson: line 1: the Bundle is nested too deep"):
        list(iter_chunks([(1, line)], 1 << 20, "a.ndjson"))


def test_chunks_are_greedy_by_serialized_size_keep_order_and_never_exceed_the_limit():
    resources = [patient(i, pad=(i * 37) % 300) for i in range(200)]
    limit = 4000

    chunks = list(iter_chunks(lines_of(*resources), limit, "a.ndjson"))

    assert all(len(c.body) <= limit for c in chunks)
    assert [c.number for c in chunks] == list(range(1, len(chunks) + 1))
    assert [e["resource"] for c in chunks for e in entries(c)] == resources
    assert [label for c in chunks for label in c.labels] == [f"Patient/p{i}" for i in range(200)]
    for chunk, following in zip(chunks, chunks[1:], strict=False):  # greedy: the next entry would not have fit
        first_entry = orjson.dumps(entries(following)[0])
        assert len(chunk.body) + 1 + len(first_entry) > limit


def test_a_resource_larger_than_the_chunk_size_goes_alone_in_its_own_chunk_flagged_oversized():
    small, big = patient(1), patient(2, pad=5000)

    chunks = list(iter_chunks(lines_of(small, big, patient(3)), 2000, "a.ndjson"))

    assert [(c.labels, c.oversized) for c in chunks] == [
        (("Patient/p1",), False),
        (("Patient/p2",), True),
        (("Patient/p3",), False),
    ]


def test_an_empty_input_gives_no_chunk():
    assert list(iter_chunks([], 1000, "a.ndjson")) == []


@pytest.mark.parametrize("entry", [5, "abc", {"resource": patient(1)}])
def test_a_bundle_whose_entry_is_not_an_array_goes_to_the_validator_as_it_is(entry):
    """The validator says what is wrong with it (an integer failed the chunking with a bare TypeError)."""
    bundle = {"resourceType": "Bundle", "id": "b1", "type": "collection", "entry": entry}
    assert entries(one_chunk(bundle)) == [{"fullUrl": "http://localhost/fhir/Bundle/b1", "resource": bundle}]


def test_bundle_entries_without_a_full_url_get_one_nested_ones_too_and_existing_ones_are_kept():
    inner = {"resourceType": "Bundle", "id": "inner", "type": "collection", "entry": [{"resource": patient(9)}]}
    bundle = {
        "resourceType": "Bundle",
        "id": "b1",
        "type": "transaction",
        "entry": [
            {"fullUrl": "urn:uuid:keep-me", "resource": patient(1)},
            {"resource": patient(2), "request": {"method": "PUT", "url": "Patient/p2"}},
            {"resource": inner},
            {"resource": {"resourceType": "Observation"}},
        ],
    }

    (entry,) = entries(one_chunk(bundle))

    assert entry["fullUrl"] == "http://localhost/fhir/Bundle/b1"
    sent = entry["resource"]["entry"]
    assert [e["fullUrl"] for e in sent[:3]] == [
        "urn:uuid:keep-me",
        "http://localhost/fhir/Patient/p2",
        "http://localhost/fhir/Bundle/inner",
    ]
    assert sent[3]["fullUrl"].startswith("urn:uuid:") and sent[1]["request"] == {"method": "PUT", "url": "Patient/p2"}
    assert sent[2]["resource"]["entry"][0]["fullUrl"] == "http://localhost/fhir/Patient/p9"


def test_a_resource_without_an_id_gets_a_urn_uuid_and_is_labelled_by_its_line():
    chunk = one_chunk(patient(1), {"resourceType": "Observation"})
    assert entries(chunk)[1]["fullUrl"].startswith("urn:uuid:")
    assert chunk.labels == ("Patient/p1", "Observation (line 2)")


def test_a_line_that_is_not_a_json_object_names_the_file_and_line():
    with pytest.raises(NdjsonError, match=r"a\.ndjson: line 2 is not valid JSON"):
        list(iter_chunks([(1, orjson.dumps(patient(1))), (2, b"{nope")], 1000, "a.ndjson"))


# --- findings ----------------------------------------------------------------------------------------------------


def test_findings_count_severities_map_errors_to_resources_and_keep_the_first_few():
    outcome = {
        "resourceType": "OperationOutcome",
        "issue": [
            {
                "severity": "error",
                "code": "value",
                "expression": ["Bundle.entry[1].resource.birthDate"],
                "details": {"text": "bad date"},
            },
            {
                "severity": "fatal",
                "code": "structure",
                "location": ["Bundle.entry[1].resource"],
                "diagnostics": "broken",
            },
            {"severity": "error", "code": "code-invalid", "expression": ["Bundle.entry[2].resource.gender"]},
            {"severity": "error", "code": "invalid", "details": {"text": "no location"}},
            {"severity": "warning", "code": "not-found"},
            {"severity": "information", "code": "informational"},
        ],
    }

    found = read_findings(outcome, ("Patient/a", "Patient/b", "Patient/c"), keep=3)

    assert (found.errors, found.warnings, found.information) == (4, 1, 1)
    assert found.resources_with_errors == {1, 2}
    assert [f.describe() for f in found.findings] == [
        "Patient/b at Bundle.entry[1].resource.birthDate: bad date",
        "Patient/b at Bundle.entry[1].resource: broken",
        "Patient/c at Bundle.entry[2].resource.gender: (code-invalid, no message)",
    ]


def test_an_error_without_location_belongs_to_the_resource_of_a_single_resource_chunk():
    found = read_findings({"issue": [{"severity": "error", "code": "invalid"}]}, ("Patient/a",), keep=5)
    assert found.resources_with_errors == {0} and found.findings[0].resource == "Patient/a"


def test_a_report_line_is_the_outcome_with_the_chunk_number_and_the_resources_it_held():
    chunk = Chunk(7, b"", ("Patient/a", "Condition/b"))
    outcome = {"resourceType": "OperationOutcome", "extension": [{"url": "x", "valueString": "y"}], "issue": []}

    assert annotated(outcome, chunk)["extension"] == [
        {"url": "x", "valueString": "y"},
        {"url": CHUNK_EXTENSION, "valueInteger": 7},
        {"url": RESOURCE_EXTENSION, "valueString": "Patient/a"},
        {"url": RESOURCE_EXTENSION, "valueString": "Condition/b"},
    ]


# --- the service -------------------------------------------------------------------------------------------------


def test_a_chunk_is_posted_as_fhir_json_to_validate_resource_and_the_outcome_returned(validator_fake):
    outcome = validate(validator_fake, one_chunk(*shared_data("InvalidPatient.ndjson")))

    assert outcome["resourceType"] == "OperationOutcome"
    assert len([i for i in outcome["issue"] if i["severity"] == "error"]) == 4
    (recorded,) = validator_fake.state.requests
    assert (recorded.path, recorded.content_type, recorded.entries) == ("/validateResource", "application/fhir+json", 2)


@pytest.mark.parametrize("status", [412, 422])
def test_a_412_or_422_with_an_operation_outcome_is_taken_as_findings_not_retried(validator_fake, status):
    validator_fake.state.reset(findings_status=status)

    outcome = validate(validator_fake, one_chunk(*shared_data("Condition.ndjson")))

    assert any(i["severity"] == "error" for i in outcome["issue"])
    assert [r.status for r in validator_fake.state.requests] == [status]


def test_a_5xx_storm_is_retried_and_the_findings_come_through(validator_fake):
    validator_fake.state.reset(fail_next=2, fail_status=503)
    outcome = validate(validator_fake, one_chunk(*shared_data("Patient.ndjson")))
    assert outcome["issue"][0]["details"]["text"] == "All OK"
    assert [r.status for r in validator_fake.state.requests] == [503, 503, 200]


def test_a_5xx_that_outlasts_the_retries_is_an_infrastructure_failure_not_findings(validator_fake):
    validator_fake.state.reset(fail_next=10, fail_status=500)
    with pytest.raises(ServiceError) as caught:
        validate(validator_fake, one_chunk(patient(1)))
    assert caught.value.status_code == 500 and "validate a.ndjson chunk 1" in str(caught.value)
    assert len(validator_fake.state.requests) == FAST_RETRY.max_attempts


def test_a_413_is_terminal_at_once(validator_fake):
    validator_fake.state.reset(max_body_bytes=50)
    with pytest.raises(ServiceError) as caught:
        validate(validator_fake, one_chunk(patient(1)))
    assert caught.value.status_code == 413 and not caught.value.transient
    assert len(validator_fake.state.requests) == 1


def test_a_200_that_is_not_an_operation_outcome_is_refused():
    from tests.fakes.echo import EchoHandler, EchoState

    with LoopbackServer(EchoHandler, EchoState()) as echo:
        with pytest.raises(ValidationServiceError, match="without an OperationOutcome"):
            validate(echo, one_chunk(patient(1)))


@pytest.mark.parametrize("status", [412, 422])
def test_a_412_or_422_without_an_operation_outcome_is_the_service_error_of_its_status(status):
    """A proxy's page answered with a findings status: an error naming the status (not findings, not retried)."""
    from tests.fakes.echo import EchoHandler, EchoState, Reply

    page = Reply(status, {"Content-Type": "text/html"}, b"<html><body>Unprocessable</body></html>")
    with LoopbackServer(EchoHandler, EchoState(replies=[page])) as echo:
        with pytest.raises(ServiceError) as caught:
            validate(echo, one_chunk(patient(1)))
    assert caught.value.status_code == status and not caught.value.transient
    assert f"HTTP {status}" in str(caught.value) and len(echo.state.requests) == 1


def test_a_slow_drip_longer_than_the_read_timeout_completes_while_bytes_keep_coming(validator_fake):
    validator_fake.state.reset(drip_seconds=1.5)
    outcome = validate(validator_fake, one_chunk(*shared_data("InvalidPatient.ndjson")), read_timeout=1.0)
    assert len([i for i in outcome["issue"] if i["severity"] == "error"]) == 4


def test_an_answer_that_never_starts_times_out_as_a_transient_network_failure(validator_fake):
    validator_fake.state.reset(latency_seconds=1.0)
    with pytest.raises(ServiceError, match="network error: ReadTimeout"):
        validate(validator_fake, one_chunk(patient(1)), read_timeout=0.2)


class ClosedPort:
    base_url = "http://127.0.0.1:9"


def test_a_connection_failure_is_an_infrastructure_failure_never_findings():
    with pytest.raises(ServiceError) as caught:
        validate(ClosedPort(), one_chunk(patient(1)))
    assert caught.value.status_code is None and caught.value.transient
