"""The pseudonymization client speaks ``$de-identify`` as spec/protocols.md says, against the fake service."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from pathlib import Path

import orjson
import pytest
from pydantic import SecretStr

from config.services import AuthSettings
from tasks.clients.errors import ServiceError
from tasks.core.jsonfile import JsonFileError
from tasks.clients.pseudonymizer import (
    MB,
    AnonymizationConfig,
    EntryTooLargeError,
    PseudonymizationError,
    checked_answer,
    compact_size,
    needs_split,
    reassemble_bundle,
    request_body,
    resource_label,
    split_bundle,
)
from tasks.pseudonymizer import pseudonymize_path
from tests.support.ndjson import write_lines
from tests.support.pseudonymization import (
    OVERRIDE_CONFIG,
    ConcurrencyProbe,
    observation_bundle,
    open_service,
    patient,
    pseudonymize,
    server_side,
)

# --- shared helpers (also used by test_pseudonymizer_step) -----------------------------------------------------


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

    body = orjson.loads(request_body(config)(resource_json))

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
    assert resource_json in request_body(config)(resource_json)  # sent as read, decimals as written
    assert request_body(None)(resource_json) == resource_json


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
    assert out["id"] == server_side({"resourceType": "Bundle", "id": "b1"}, pseudonymizer_fake)["id"]


def test_splitting_does_not_change_the_answer_the_bundle_id_entry_order_and_meta_are_as_if_sent_whole(
    pseudonymizer_fake,
):
    bundle = {**observation_bundle(count=30, pad=100_000), "meta": {"source": "#torch", "tag": [{"code": "t"}]}}

    split = pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)
    whole = pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=100)

    assert split.split and not whole.split
    assert orjson.loads(split.line) == orjson.loads(whole.line)


def test_a_bundle_at_or_below_the_threshold_is_sent_whole(pseudonymizer_fake):
    bundle = observation_bundle(count=3, pad=10)
    result = pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)
    assert (result.requests, result.split, len(pseudonymizer_fake.state.requests)) == (1, False, 1)
    assert orjson.loads(result.line) == server_side(bundle, pseudonymizer_fake)


@pytest.mark.parametrize(
    "entry", ["x" * 2000, {"resource": {"resourceType": "Patient", "id": "p", "note": "x" * 2000}}]
)
def test_a_bundle_whose_entry_is_not_an_array_is_never_split(entry):
    """A string was split into its characters, and the Bundle put together again held a list of them."""
    assert not needs_split({"resourceType": "Bundle", "id": "b", "entry": entry}, 1000)


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


def test_reassembly_takes_the_bundles_own_fields_the_original_type_and_all_entries_in_order():
    original = {"resourceType": "Bundle", "id": "b", "type": "transaction", "entry": [{"n": 1}, {"n": 2}, {"n": 3}]}
    fields = {"resourceType": "Bundle", "id": "hb", "type": "batch", "meta": {"tag": [0]}}
    chunks = [
        {"resourceType": "Bundle", "id": "h0", "type": "batch", "meta": {"tag": [1]}, "entry": [{"n": 1}, {"n": 2}]},
        {"resourceType": "Bundle", "id": "h1", "type": "batch", "entry": [{"n": 3}]},
    ]
    assert reassemble_bundle(original, fields, chunks) == {
        "resourceType": "Bundle",
        "id": "hb",
        "type": "transaction",
        "meta": {"tag": [0]},
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
    assert "if needed, the body limit of the server (or of a proxy before it, such as nginx's" in message
    assert pseudonymizer_fake.state.requests == []


def test_an_entry_below_the_threshold_that_fits_no_chunk_with_the_bundles_own_fields_says_so(pseudonymizer_fake):
    """The entry alone was called "larger than the split threshold" although it was smaller."""
    bundle = observation_bundle(count=3, pad=10)
    bundle["entry"][1]["resource"]["note"][0]["text"] = "y" * int(0.6 * MB)
    bundle["signature"] = {"data": "z" * int(0.6 * MB)}

    with pytest.raises(EntryTooLargeError) as caught:
        pseudonymize(pseudonymizer_fake, bundle, split_threshold_mb=1)

    message = str(caught.value)
    assert "entry 1 (Observation/o1) is 0.6 MB and the Bundle's own fields" in message
    assert "0.6 MB: together more than the split threshold of 1 MB" in message


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
        )
    assert caught.value.status_code == 422


def test_no_more_than_max_concurrent_requests_are_in_flight(pseudonymizer_fake, tmp_path):
    probe = ConcurrencyProbe(pseudonymizer_fake, hold_seconds=0.03, fill=3)
    pseudonymizer_fake.state.reset(status_hook=probe)
    source = write_lines(tmp_path / "Patient.ndjson", [patient(i) for i in range(12)])

    with open_service(pseudonymizer_fake) as service:
        written = {"level": None, "max_line_bytes": MB}
        pseudonymize_path(source, tmp_path / "out.ndjson", service, **written, concurrency=3)
    assert probe.most_in_flight == 3


# --- answers -----------------------------------------------------------------------------------------------------


def test_an_answer_of_another_type_is_refused():
    with pytest.raises(PseudonymizationError, match="'OperationOutcome' instead of a de-identified Patient"):
        checked_answer(b'{"resourceType":"OperationOutcome"}', patient(1))


def test_an_answer_nested_deeper_than_json_is_written_is_refused_as_no_json():
    """orjson reads 1,024 levels of JSON but writes 254: the text of such an answer's type raised a RecursionError."""
    deep = b'{"resourceType":' * 1000 + b"1" + b"}" * 1000
    with pytest.raises(PseudonymizationError, match="the service answered with something that is not JSON"):
        checked_answer(deep, patient(1))


def test_type_and_id_from_data_or_an_answer_show_escaped_and_bounded_in_messages():
    """They come from the data (an invalid id is what the service refuses) and the service: one forged line, an
    escape sequence or a megabyte of id would go into the step's error as it was."""
    forged = "p1\n12:00:00 INFO step done\x1b[2J\u202e" + "x" * 1_000_000
    label = resource_label({"resourceType": "Patient", "id": forged})
    assert label.startswith("Patient/'p1\\n12:00:00 INFO step done\\x1b[2J\\u202e") and len(label) < 200
    with pytest.raises(PseudonymizationError) as refused:
        checked_answer(orjson.dumps({"resourceType": forged}), patient(1))
    assert len(str(refused.value)) < 300 and str(refused.value).isprintable()


def test_an_answer_that_drops_bundle_entries_is_refused():
    sent = observation_bundle(count=3, pad=1)
    answer = orjson.dumps({**sent, "entry": sent["entry"][:2]})
    with pytest.raises(PseudonymizationError, match="2 Bundle entries for 3 sent"):
        checked_answer(answer, sent)


def test_a_pretty_printed_answer_becomes_one_line_and_every_answer_keeps_its_numbers_as_written():
    pretty = b'{\n  "resourceType": "Observation",\r\n  "valueDecimal": 1.50, "n": 12345678901234567890123\n}\n'
    compact = b'{"resourceType":"Observation","valueDecimal":1.50}'
    sent = {"resourceType": "Observation"}
    line = b'{   "resourceType": "Observation",    "valueDecimal": 1.50, "n": 12345678901234567890123 }'
    assert checked_answer(pretty, sent) == line
    assert checked_answer(compact, sent) == compact


def test_a_split_bundle_keeps_every_numbers_digits(pseudonymizer_fake):
    """Chunks were written from orjson's parse and the Bundle put back the same way: 1.50 came back as 1.5 and 30
    digits as 17, while the same Bundle sent whole kept them (FHIR's decimal precision is significant)."""
    bundle = observation_bundle(count=6, pad=250_000)
    bundle["entry"][3]["resource"]["valueQuantity"] = {"value": "DECIMAL"}
    bundle["entry"][5]["resource"]["valueQuantity"] = {"value": "PI"}
    line = orjson.dumps(bundle).replace(b'"DECIMAL"', b"1.50").replace(b'"PI"', b"3.14159265358979323846264338327")

    result = pseudonymize_line(pseudonymizer_fake, line, split_threshold_mb=1)
    assert result.split and b'"valueQuantity":{"value":1.50}' in result.line
    assert b'"valueQuantity":{"value":3.14159265358979323846264338327}' in result.line


def test_a_missing_config_file_is_an_error_naming_the_setting(tmp_path: Path):
    with pytest.raises(JsonFileError, match="services.pseudonymizer.anonymization_config: cannot read"):
        AnonymizationConfig.read(tmp_path / "missing.yaml")


def test_a_bundle_nested_deeper_than_json_is_written_fails_clearly_before_any_request(pseudonymizer_fake):
    """orjson reads 1024 levels but writes 254: the size check of every Bundle raised a bare JSONEncodeError."""
    extension = {"url": "u", "valueString": "x"}
    for _ in range(300):
        extension = {"url": "u", "extension": [extension]}
    bundle = observation_bundle(count=1, pad=1)
    bundle["entry"][0]["resource"]["extension"] = [extension]
    with pytest.raises(PseudonymizationError, match="cannot be written as JSON again .*it is no FHIR resource"):
        pseudonymize_line(pseudonymizer_fake, json.dumps(bundle).encode())
    assert pseudonymizer_fake.state.requests == []


def pseudonymize_line(pseudonymizer_fake, line: bytes, **options):
    """``pseudonymize`` of a line as written (numbers as they are), not of a dict orjson writes."""

    with open_service(pseudonymizer_fake, **options) as service:
        return service.pseudonymize(line, orjson.loads(line))
