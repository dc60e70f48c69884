"""The validation of whole files (no Prefect): reports in chunk order, bounded concurrency, edge-case inputs."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from config.settings import RetrySettings, TlsSettings
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.validator import MB, Validator
from tasks.core.errors import StepError
from tests.support.ndjson import iter_resources
from tasks.validation import FileValidation, failure_message, validate_path
from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer
from tests.support.ndjson import write_lines
from tests.support.validation import marks, varied_patients

FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)


def run_file(
    server: LoopbackServer, source: Path, dest: Path, chunk_bytes: int = MB, window: int = 4
) -> FileValidation:
    endpoint = ServiceEndpoint("validation", server.base_url)
    with ServiceClient(endpoint, TlsSettings(), FAST_RETRY) as client:
        return validate_path(
            source,
            dest,
            Validator(client),
            chunk_bytes=chunk_bytes,
            concurrency=window,
            level="fastest",
            max_line_bytes=8 * MB,
        )


def report_lines(path: Path) -> list[dict[str, Any]]:
    return [outcome for _, outcome in iter_resources(path, 1 << 30)]


# --- the shared validation data --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "resources", "with_errors", "errors", "first_error"),
    [
        ("Patient.ndjson", 2, 0, 0, None),
        (
            "InvalidPatient.ndjson",
            2,
            2,
            4,
            "Patient/val-invalid-1 at Bundle.entry[0].resource.birthDate: Value error, Date value string does not "
            "match spec regex.",
        ),
        ("Condition.ndjson", 1, 1, 2, "Condition/val-condition-1 at Bundle.entry[0].resource.subject: Field required"),
    ],
)
def test_the_shared_validation_data_gives_the_expected_findings(
    validator_fake, tmp_path, name, resources, with_errors, errors, first_error
):
    result = run_file(validator_fake, TESTDATA / "validation" / name, tmp_path / f"{name}.zst")

    assert (result.resources, result.chunks, result.resources_with_errors, result.errors) == (
        resources,
        1,
        with_errors,
        errors,
    )
    assert result.first_errors[:1] == ([first_error] if first_error else [])
    (outcome,) = report_lines(tmp_path / f"{name}.zst")
    assert marks(outcome) == (
        1,
        [f"{r['resourceType']}/{r['id']}" for _, r in iter_resources(TESTDATA / "validation" / name, MB)],
    )
    assert result.report.name == f"{name}.zst" and result.report.resources == 1


def test_the_condition_with_a_bad_clinical_status_code_is_reported_with_its_location(validator_fake, tmp_path):
    result = run_file(validator_fake, TESTDATA / "validation" / "Condition.ndjson", tmp_path / "c.ndjson")
    assert any(
        "at Bundle.entry[0].resource.clinicalStatus.coding[0].code:" in e and "'bogus-status'" in e
        for e in result.first_errors
    )


def test_a_valid_file_counts_the_validators_information_but_no_warnings_or_errors(validator_fake, tmp_path):
    result = run_file(validator_fake, TESTDATA / "validation" / "Patient.ndjson", tmp_path / "p.ndjson")
    assert (result.errors, result.warnings, result.information) == (0, 0, 1)


def test_findings_answered_with_422_are_findings_in_the_report(validator_fake, tmp_path):
    validator_fake.state.reset(findings_status=422)
    result = run_file(validator_fake, TESTDATA / "validation" / "InvalidPatient.ndjson", tmp_path / "i.ndjson")
    assert (result.resources_with_errors, result.errors) == (2, 4)


# --- order, concurrency, sizes ---------------------------------------------------------------------------------


def test_reports_keep_chunk_order_when_answers_finish_out_of_order_with_the_window_in_flight(validator_fake, tmp_path):
    rng = random.Random(3)
    state = validator_fake.state
    filled = threading.Event()

    def delay(index: int) -> float:
        # Hold every answer until the whole window has been in flight once (then let them finish out of order):
        # waiting for the first alone could wait forever on a busy machine, once the others were answered.
        deadline = time.monotonic() + 20
        while not filled.is_set() and time.monotonic() < deadline:
            if state.in_flight >= 4:
                filled.set()
            time.sleep(0.005)
        return rng.choice([0.0, 0.03, 0.08])

    state.reset(delay_for=delay)
    patients = varied_patients(600, max_pad=2000)
    patients[437]["birthDate"] = "yesterday"
    source = write_lines(tmp_path / "Patient.ndjson", patients)

    result = run_file(validator_fake, source, tmp_path / "report.ndjson.zst", chunk_bytes=32 * 1024, window=4)

    lines = report_lines(tmp_path / "report.ndjson.zst")
    assert [marks(o)[0] for o in lines] == list(range(1, result.chunks + 1)) and result.chunks > 12
    assert [label for o in lines for label in marks(o)[1]] == [f"Patient/p{i}" for i in range(600)]
    assert validator_fake.state.most_in_flight == 4
    assert sorted(r.entries for r in validator_fake.state.requests) == sorted(len(marks(o)[1]) for o in lines)
    (held,) = [marks(o)[1] for o in lines if "Patient/p437" in marks(o)[1]]
    assert (result.resources_with_errors, result.errors) == (1, 1)
    assert result.first_errors == [
        f"Patient/p437 at Bundle.entry[{held.index('Patient/p437')}].resource.birthDate: Value error, Date value "
        "string does not match spec regex."
    ]


def test_a_resource_larger_than_the_chunk_size_is_sent_alone_with_a_warning(validator_fake, tmp_path, caplog):
    patients = varied_patients(5, max_pad=50)
    patients[2]["name"][0]["family"] = "x" * (2 * MB)
    source = write_lines(tmp_path / "big.ndjson", patients)

    with caplog.at_level(logging.WARNING, logger="dupflow.validation"):
        result = run_file(validator_fake, source, tmp_path / "big.ndjson.zst", chunk_bytes=MB)

    assert [marks(o)[1] for o in report_lines(tmp_path / "big.ndjson.zst")] == [
        ["Patient/p0", "Patient/p1"],
        ["Patient/p2"],
        ["Patient/p3", "Patient/p4"],
    ]
    assert result.errors == 0 and result.resources == 5
    assert "big.ndjson: Patient/p2 is 2.0 MB, larger than services.validation.bundle_chunk_size_mb" in caplog.text


def test_an_empty_file_gets_an_empty_report_without_any_request(validator_fake, tmp_path):
    source = tmp_path / "empty.ndjson"
    source.write_bytes(b"")

    result = run_file(validator_fake, source, tmp_path / "empty.ndjson.zst")

    assert (result.resources, result.chunks, result.errors) == (0, 0, 0)
    assert report_lines(tmp_path / "empty.ndjson.zst") == [] and validator_fake.state.requests == []


def test_a_file_of_50000_resources_is_validated_in_order_in_chunks_of_the_set_size(validator_fake, tmp_path):
    validator_fake.state.reset(shallow=True)  # the client's work at this size; findings are tested above
    source = write_lines(tmp_path / "many.ndjson", varied_patients(50_000, max_pad=60))

    result = run_file(validator_fake, source, tmp_path / "many.ndjson.zst", chunk_bytes=MB)

    lines = report_lines(tmp_path / "many.ndjson.zst")
    assert result.resources == 50_000 and result.chunks == len(lines) == len(validator_fake.state.requests) > 3
    assert [marks(o)[0] for o in lines] == list(range(1, len(lines) + 1))
    assert [label for o in lines for label in marks(o)[1]] == [f"Patient/p{i}" for i in range(50_000)]
    assert sum(r.entries for r in validator_fake.state.requests) == 50_000
    assert all(r.size <= MB for r in validator_fake.state.requests)


# --- infrastructure failures -----------------------------------------------------------------------------------


def test_a_service_failure_after_the_retries_fails_naming_file_and_chunk_and_leaves_no_report(validator_fake, tmp_path):
    validator_fake.state.reset(fail_next=100, fail_status=502)
    source = write_lines(tmp_path / "a.ndjson", varied_patients(3))

    with pytest.raises(StepError) as caught:
        run_file(validator_fake, source, tmp_path / "out" / "a.ndjson.zst")

    message = str(caught.value)
    assert f"{source}: validation of chunk 1 (3 resources: Patient/p0 … Patient/p2) failed" in message
    assert "HTTP 502" in message and "not a finding in the data" in message
    assert list((tmp_path / "out").iterdir()) == []


def deep_bundle_line(levels: int) -> bytes:
    """A Bundle whose one entry (without a fullUrl) holds a resource nested ``levels`` deep: orjson, which checks
    every line, reads up to 1024 levels; ``json``, which keeps the decimals' digits, recurses once per level."""
    inner = b'{"a":' * levels + b"1" + b"}" * levels
    head = b'{"resourceType":"Bundle","type":"collection","entry":[{"resource":{"resourceType":"Basic","a":'
    return head + inner + b"}}]}"


def test_a_bundle_nested_deeper_than_the_exact_parser_follows_fails_validation_naming_the_line(
    validator_fake, tmp_path
):
    """The validation step gives a Bundle's entries their fullUrl by taking the line apart with the exact parser:
    a line orjson had accepted (1,000 levels) ended the step in a bare RecursionError."""
    source = tmp_path / "a.ndjson"
    source.write_bytes(orjson.dumps({"resourceType": "Patient", "id": "p1"}) + b"\n" + deep_bundle_line(1000) + b"\n")
    orjson.loads(deep_bundle_line(1000))  # the line check lets it through

    with pytest.raises(StepError, match=f"{source}: line 2: the Bundle is nested too deep"):
        run_file(validator_fake, source, tmp_path / "out" / "a.ndjson.zst")


def test_a_413_fails_with_the_hint_to_lower_the_chunk_size(validator_fake, tmp_path):
    validator_fake.state.reset(max_body_bytes=200)
    source = write_lines(tmp_path / "a.ndjson", varied_patients(3))

    with pytest.raises(StepError, match="HTTP 413.*lower services.validation.bundle_chunk_size_mb"):
        run_file(validator_fake, source, tmp_path / "a.ndjson.zst")
    assert len(validator_fake.state.requests) == 1


def test_a_413_for_a_chunk_of_one_resource_does_not_advise_a_smaller_chunk(validator_fake, tmp_path):
    """A chunk holding one resource over the service's limit: lowering bundle_chunk_size_mb cannot help."""
    validator_fake.state.reset(max_body_bytes=200)
    source = write_lines(tmp_path / "a.ndjson", varied_patients(1))

    with pytest.raises(StepError) as failed:
        run_file(validator_fake, source, tmp_path / "a.ndjson.zst")
    assert "cannot help): raise the body limit of the server (or of a proxy before it, such as nginx's" in str(
        failed.value
    )
    assert "lower services.validation.bundle_chunk_size_mb" not in str(failed.value)


def test_the_fail_on_error_message_gives_resources_with_errors_per_file_and_where_the_reports_are(tmp_path):
    def checked(name: str, resources: int, with_errors: int, errors: int) -> FileValidation:
        report = {"name": name, "size": 1, "resources": 1}
        return FileValidation(
            file=name, report=report, resources=resources, chunks=1, resources_with_errors=with_errors,
            errors=errors, warnings=0, information=0, first_errors=[],
        )  # fmt: skip

    message = failure_message(
        tmp_path / "validation",
        [checked("ok.ndjson", 3, 0, 0), checked("a.ndjson", 5, 2, 3), checked("b.ndjson", 1, 1, 1)],
    )

    assert "a.ndjson: 2 of 5 resources with errors (3 errors); b.ndjson: 1 of 1 resources with errors" in message
    assert "ok.ndjson" not in message and str(tmp_path / "validation") in message
    assert "services.validation.fail_on_error: false" in message
