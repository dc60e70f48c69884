"""direct_resource_load: transactions against the real sekmet-fhir server (what it stores is searched back), and
the faults only the fake produces (503 storms, resets, a failed entry, 401 then a fresh token)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from prefect import flow

from config.settings import Settings
from tasks.clients.fhir_server import FhirServer
from tasks.core.errors import StepError
from tasks.job.contract import DataFile, StepInput, StepResult, stored_in_job
from tasks.clients.transaction_bundles import SEND_ENTRY_TAG_SYSTEM, entry_tag, iter_batches
from tasks.send import refuse_csv_input, send, send_resources
from tests.conftest import REPO_ROOT, TESTDATA
from tests.fakes._server import LoopbackServer
from tests.fakes.fhir_server import start_fhir_fake
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.sekmet import PASSWORD, start_sekmet
from tests.support.sending import MB, generated, send_config, send_file, stored_as_sent, write_ndjson

BLAZE_BUNDLE = TESTDATA / "extraction" / "BlazeBundle.json"
TORCH_RESULT = TESTDATA / "extraction" / "example-result" / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"


@pytest.fixture(scope="module")
def sekmet(tmp_path_factory):
    server = start_sekmet(tmp_path_factory.mktemp("sekmet"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake():
    server = start_fhir_fake()
    yield server
    server.stop()


@pytest.fixture
def fhir_fake(fake):
    fake.state.reset()
    return fake


# --- against the real server --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("zstd", [False, True])
def test_real_torch_data_lands_on_the_server_as_it_was(sekmet, tmp_path, zstd):
    """The TORCH result file (one transaction Bundle per line) and the test patients, plain and zstd."""
    blaze = json.loads(BLAZE_BUNDLE.read_text())
    batch_file = write_ndjson(tmp_path / "in" / "batch-1.ndjson", [blaze], zstd=zstd)
    torch_file = tmp_path / "in" / "b4a838f8.ndjson"
    torch_file.write_bytes(TORCH_RESULT.read_bytes())

    first = send_file(sekmet.url, batch_file, tmp_path / "send", batch_size=10)
    second = send_file(sekmet.url, torch_file, tmp_path / "send", batch_size=0)

    assert (first.entries, first.batches) == (23, 3)
    stored_as_sent(sekmet, [entry["resource"] for entry in blaze["entry"]])
    torch_bundle = json.loads(TORCH_RESULT.read_text())
    stored_as_sent(sekmet, [entry["resource"] for entry in torch_bundle["entry"]])
    assert second.entries == len(torch_bundle["entry"])


@pytest.mark.slow
def test_generated_resources_in_batches_all_arrive_once(sekmet, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    resources = generated(95, prefix)
    source = write_ndjson(tmp_path / "core.ndjson", resources, zstd=True)

    report = send_file(sekmet.url, source, tmp_path / "send", batch_size=10)

    assert (report.batches, report.entries) == (10, 95)
    stored = stored_as_sent(sekmet, resources)
    assert {resource["meta"]["versionId"] for resource in stored.values()} == {"1"}


@pytest.mark.slow
def test_resources_without_id_are_created_once_even_when_the_batch_is_sent_again(sekmet, tmp_path):
    """POST entries are conditional creates on a stable tag: a batch re-sent (its answer lost, or a resumed job
    whose progress record missed it) does not create them twice."""
    job = uuid.uuid4().hex
    no_ids = [{"resourceType": "Observation", "status": "final", "code": {"text": f"x{i}"}} for i in range(5)]
    source = write_ndjson(tmp_path / "core.ndjson", no_ids)

    send_file(sekmet.url, source, tmp_path / "send", job_id=job)
    (tmp_path / "send" / "progress" / "core.ndjson.json").unlink()  # as if killed before the record was written
    send_file(sekmet.url, source, tmp_path / "send", job_id=job)

    for line in range(1, 6):
        code = entry_tag(f"{job}:core.ndjson:{line}", orjson.dumps(no_ids[line - 1]))
        tagged = sekmet.search("Observation", _tag=f"{SEND_ENTRY_TAG_SYSTEM}|{code}")
        assert len(tagged) == 1
        assert tagged[0]["code"] == {"text": f"x{line - 1}"}


@pytest.mark.slow
def test_resources_without_id_written_anew_are_created_with_their_new_content(sekmet, tmp_path):
    """A file written anew is sent again from its start, but an id-less resource's conditional create looked for a
    tag of its job, file and line alone: the server found the old resource and the new content was never stored."""
    job = uuid.uuid4().hex
    old, new = ({"resourceType": "Observation", "status": "final", "code": {"text": t}} for t in ("old", "new"))
    source = write_ndjson(tmp_path / "core.ndjson", [old])
    send_file(sekmet.url, source, tmp_path / "send", job_id=job)
    stamp = source.stat().st_mtime_ns
    write_ndjson(source, [new])
    os.utime(source, ns=(stamp + 1_000_000, stamp + 1_000_000))  # a file system's coarse clock
    send_file(sekmet.url, source, tmp_path / "send", job_id=job)
    (tmp_path / "send" / "progress" / "core.ndjson.json").unlink()  # as if killed before the record was written
    send_file(sekmet.url, source, tmp_path / "send", job_id=job)

    for resource in (old, new):  # each stored once
        code = entry_tag(f"{job}:core.ndjson:1", orjson.dumps(resource))
        tagged = sekmet.search("Observation", _tag=f"{SEND_ENTRY_TAG_SYSTEM}|{code}")
        assert [r["code"] for r in tagged] == [resource["code"]]


@pytest.mark.slow
def test_a_batch_of_large_resources_gets_a_minimal_answer_within_the_bound(sekmet, tmp_path):
    """sekmet, like many servers, sends every resource of a transaction back unless asked for return=minimal: a
    batch of large resources then got an answer over the client's bound, refused after the server applied it."""
    prefix = uuid.uuid4().hex[:8]
    resources = [
        {
            "resourceType": "Patient",
            "id": f"{prefix}-{i}",
            "text": {"status": "generated", "div": f"<div>{'x' * 20_000}</div>"},
        }
        for i in range(10)
    ]
    source = write_ndjson(tmp_path / "core.ndjson", resources)
    settings = Settings.model_validate(send_config(sekmet.url))
    with FhirServer.connect(settings.services.send, settings.tls, settings.retry, max_answer_bytes=64 * 1024) as server:
        report = send_resources(server, source, tmp_path / "send", job_id="j", batch_size=10, max_line_bytes=MB)

    assert (report.batches, report.entries) == (1, 10)
    stored_as_sent(sekmet, resources)


@pytest.mark.slow
def test_a_rejected_batch_names_file_batch_entry_and_the_servers_text_and_is_kept(sekmet, tmp_path):
    prefix = uuid.uuid4().hex[:8]
    resources = generated(12, prefix)
    resources[7] = {"resourceType": "NotAType", "id": f"{prefix}-bad"}
    source = write_ndjson(tmp_path / "batch-3.ndjson", resources)

    with pytest.raises(StepError) as caught:
        send_file(sekmet.url, source, tmp_path / "send", batch_size=5)

    message = str(caught.value)
    assert "batch-3.ndjson: batch 2 (5 entries)" in message
    assert f"entry 3 (NotAType/{prefix}-bad)" in message
    assert "NotAType' is not supported" in message  # sekmet's OperationOutcome text
    kept = tmp_path / "send" / "failed"
    request = json.loads((kept / "batch-3.ndjson-batch-2.request.json").read_bytes())
    assert [e["resource"]["id"] for e in request["entry"]] == [r["id"] for r in resources[5:10]]
    assert "HTTP 404" in (kept / "batch-3.ndjson-batch-2.response.txt").read_text()
    assert sekmet.read("Patient", f"{prefix}-p0") is not None  # batch 1 went through
    assert sekmet.read("Patient", f"{prefix}-p6") is None  # batch 2 was rolled back as a whole


def test_bundles_are_unwrapped_into_entries_and_a_batch_counts_entries(tmp_path):
    resources = generated(7, "u")
    collection = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in resources[:4]]}
    searchset = {"resourceType": "Bundle", "type": "searchset", "entry": [{"resource": r} for r in resources[4:6]]}
    document = {"resourceType": "Bundle", "id": "doc-1", "type": "document", "entry": [{"resource": resources[6]}]}
    source = write_ndjson(tmp_path / "x.ndjson", [collection, searchset, document])

    batches = list(iter_batches(source, 3, tag_prefix="t", max_line_bytes=MB))

    assert [b.labels for b in batches] == [
        ["Patient/u-p0", "Observation/u-o1", "Observation/u-o2"],
        ["Patient/u-p3", "Observation/u-o4", "Observation/u-o5"],
        ["Bundle/doc-1"],
    ]
    assert [(b.next_line, b.next_entry) for b in batches] == [(1, 3), (2, 2), (3, 1)]
    resumed = list(iter_batches(source, 3, tag_prefix="t", max_line_bytes=MB, start_line=2, start_entry=1))
    assert [b.labels for b in resumed] == [["Observation/u-o5", "Bundle/doc-1"]]


def test_a_searchsets_own_operation_outcome_is_not_sent_as_data(tmp_path):
    """A searchset may carry the source server's OperationOutcome about the search (search.mode outcome): it was
    stored on the destination as a resource, beside the data."""
    resources = generated(2, "q")
    outcome = {"resourceType": "OperationOutcome", "id": "warn-1", "issue": [{"severity": "warning", "code": "x"}]}
    searchset = {
        "resourceType": "Bundle",
        "type": "searchset",
        "entry": [
            {"resource": resources[0], "search": {"mode": "match"}},
            {"resource": outcome, "search": {"mode": "outcome"}},
            {"resource": resources[1], "search": {"mode": "include"}},
        ],
    }
    source = write_ndjson(tmp_path / "x.ndjson", [searchset, outcome])

    batches = list(iter_batches(source, 10, tag_prefix="t", max_line_bytes=MB))

    assert [b.labels for b in batches] == [["Patient/q-p0", "Observation/q-o1", "OperationOutcome/warn-1"]]


@pytest.mark.parametrize("entry", [5, "abc", {"resource": {"resourceType": "Patient", "id": "p"}}, {}, "", 0, False])
def test_a_bundle_whose_entry_is_not_an_array_fails_naming_its_line(tmp_path, entry):
    """It was taken as holding nothing (a string's characters passed over one by one): the line was sent as nothing."""
    source = write_ndjson(
        tmp_path / "x.ndjson", [generated(1, "a")[0], {"resourceType": "Bundle", "type": "collection", "entry": entry}]
    )
    with pytest.raises(StepError) as refused:
        list(iter_batches(source, 3, tag_prefix="t", max_line_bytes=MB))
    assert str(refused.value) == (
        "x.ndjson line 2: the Bundle's entry is not an array, so it holds no resource to send; fix it"
    )


def test_a_bundle_that_fits_in_a_batch_is_never_cut_across_two_transactions(tmp_path):
    """A Patient's Bundle cut in two: its Conditions in one transaction, the Patient (or the urn:uuid entry they
    reference) in the next, which a server with referential integrity refuses."""
    patient = {"resourceType": "Patient", "id": "p1"}
    condition = {"resourceType": "Condition", "id": "c1", "subject": {"reference": "urn:uuid:p1"}}
    bundle = {
        "resourceType": "Bundle",
        "type": "transaction",
        "entry": [{"fullUrl": "urn:uuid:p1", "resource": patient}, {"resource": condition}],
    }
    singles = [{"resourceType": "Observation", "id": f"o{n}"} for n in (1, 2)]
    source = write_ndjson(tmp_path / "x.ndjson", [*singles, bundle])

    batches = list(iter_batches(source, 3, tag_prefix="t", max_line_bytes=MB))

    assert [b.labels for b in batches] == [["Observation/o1", "Observation/o2"], ["Patient/p1", "Condition/c1"]]
    assert [(b.next_line, b.next_entry) for b in batches] == [(2, 1), (3, 2)]


def test_entries_taken_apart_keep_every_number_as_written(tmp_path):
    """FHIR's decimal precision counts: an unwrapped Bundle's entries and a resource without id are written anew,
    and orjson made 1.5 of 1.50 and a float of an integer beyond 64 bits."""
    line = (
        b'{"resourceType":"Bundle","type":"collection","entry":[{"resource":{"resourceType":"Observation","id":"o1",'
        b'"valueQuantity":{"value":1.50}}}]}\n'
        b'{"resourceType":"Observation","valueQuantity":{"value":0.100},"note":[{"text":"x"}],'
        b'"extension":[{"url":"u","valueInteger64":123456789012345678901234567890}]}\n'
    )
    source = tmp_path / "x.ndjson"
    source.write_bytes(line)

    (batch,) = list(iter_batches(source, 10, tag_prefix="t", max_line_bytes=MB))

    body = batch.body()
    assert b'"value":1.50' in body and b'"value":0.100' in body and b"123456789012345678901234567890" in body


def test_a_file_written_anew_to_the_same_size_is_sent_again(fhir_fake, tmp_path):
    """Another import or new pseudonyms can give a file of the same name and size: its progress record is of another
    input (it was taken as complete, and the server kept the old resources)."""
    source = write_ndjson(tmp_path / "core.ndjson", [{"resourceType": "Patient", "id": "pAAAA"}])
    send_file(fhir_fake.base_url, source, tmp_path / "send")
    write_ndjson(source, [{"resourceType": "Patient", "id": "pBBBB"}])
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000))  # a coarse clock

    report = send_file(fhir_fake.base_url, source, tmp_path / "send")

    assert dict(fhir_fake.state.applied) == {"Patient/pAAAA": 1, "Patient/pBBBB": 1}
    assert (report.batches, report.entries) == (1, 1)


def test_batch_size_zero_means_one_hundred(fhir_fake, tmp_path):
    source = write_ndjson(tmp_path / "core.ndjson", generated(250, "z"))

    report = send_file(fhir_fake.base_url, source, tmp_path / "send", batch_size=0)

    assert [len(t["entries"]) for t in fhir_fake.state.transactions] == [100, 100, 50]
    assert report.batches == 3


def test_csv_input_is_refused_with_a_way_out():
    with pytest.raises(StepError, match="send_as transfer_load or s3_upload"):
        refuse_csv_input(
            [DataFile(name="core.ndjson", size=1, resources=1), DataFile(name="Patient.csv", size=1, resources=1)]
        )


# --- faults (the fake) --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nesting", "said"),
    [
        (0, ["entry 3 (Observation/f-o2)", "profile validation failed"]),
        (300, ["the answer is not a Bundle; the server's answer cannot confirm the batch"]),
    ],
    ids=["outcome", "outcome-nested-too-deeply"],
)
def test_a_failed_entry_in_a_200_transaction_response_stops_the_step(fhir_fake, tmp_path, nesting, said):
    """orjson reads 1,024 levels of JSON but writes 254: the copy of an outcome nested deeper failed the step with a
    bare TypeError, and the rejected batch was not kept."""
    fhir_fake.state.fail_entry, fhir_fake.state.outcome_nesting = 2, nesting
    source = write_ndjson(tmp_path / "core.ndjson", generated(4, "f"))

    with pytest.raises(StepError) as caught:
        send_file(fhir_fake.base_url, source, tmp_path / "send")

    message = str(caught.value)
    assert "core.ndjson: batch 1 (4 entries) was rejected (HTTP 200)" in message
    assert all(text in message for text in said)
    assert "422" in (tmp_path / "send" / "failed" / "core.ndjson-batch-1.response.txt").read_text()
    assert not (tmp_path / "send" / "progress" / "core.ndjson.json").exists()  # nothing was confirmed


def test_a_413_then_a_smaller_batch_size_goes_on_after_the_last_confirmed_batch(fhir_fake, tmp_path):
    """The 413's advice is to lower services.send.batch_size: the progress record was then taken as another input's,
    and the confirmed batches were sent all over again."""
    resources = generated(40, "l")
    for resource in resources[20:]:
        resource["text"] = {"status": "generated", "div": f"<div>{'x' * 2000}</div>"}
    source = write_ndjson(tmp_path / "core.ndjson", resources)
    fhir_fake.state.max_body_bytes = 15_000

    with pytest.raises(
        StepError, match=r"batch 3 \(10 entries\) was rejected \(HTTP 413\).*lower services.send.batch_size"
    ):
        send_file(fhir_fake.base_url, source, tmp_path / "send", batch_size=10)
    report = send_file(fhir_fake.base_url, source, tmp_path / "send", batch_size=5)

    assert [len(t["entries"]) for t in fhir_fake.state.transactions] == [10, 10, 5, 5, 5, 5]
    assert set(fhir_fake.state.applied.values()) == {1}  # nothing sent twice, nothing lost
    assert len(fhir_fake.state.applied) == 40
    assert (report.resumed_at_batch, report.batches, report.entries) == (3, 6, 40)


def test_a_failing_dump_does_not_hide_the_send_error(fhir_fake, tmp_path):
    fhir_fake.state.fail_entry = 0
    (tmp_path / "send").mkdir()
    (tmp_path / "send" / "failed").write_text("a file where the folder should be")
    source = write_ndjson(tmp_path / "core.ndjson", generated(2, "d"))

    with pytest.raises(StepError) as caught:
        send_file(fhir_fake.base_url, source, tmp_path / "send")

    assert "entry 1 (Patient/d-p0)" in str(caught.value)
    assert "could not be kept" in str(caught.value)


def test_a_503_storm_is_retried_and_an_endless_one_is_a_transient_failure(fhir_fake, tmp_path):
    source = write_ndjson(tmp_path / "core.ndjson", generated(3, "s"))
    fhir_fake.state.unavailable = 2

    assert send_file(fhir_fake.base_url, source, tmp_path / "send").entries == 3

    fhir_fake.state.unavailable = 100
    with pytest.raises(StepError) as caught:
        send_file(fhir_fake.base_url, source, tmp_path / "other")
    assert caught.value.transient
    assert "HTTP 503" in str(caught.value)


def test_a_reset_mid_response_is_retried_and_the_batch_applies_idempotently(fhir_fake, tmp_path):
    resources = generated(3, "r") + [{"resourceType": "Observation", "status": "final", "code": {"text": "no id"}}]
    source = write_ndjson(tmp_path / "core.ndjson", resources)
    fhir_fake.state.reset_mid_response = 1

    send_file(fhir_fake.base_url, source, tmp_path / "send")

    first, again = fhir_fake.state.transactions
    assert first["entries"] == again["entries"]  # the same batch, sent once more after the lost answer
    assert first["entries"][:3] == ["Patient/r-p0", "Observation/r-o1", "Observation/r-o2"]
    assert first["entries"][3].startswith(f"Observation?_tag={SEND_ENTRY_TAG_SYSTEM}|")


def test_oauth_401_fetches_a_fresh_token_once_and_succeeds(fhir_fake, tmp_path):
    oauth = OAuthState()
    with LoopbackServer(OAuthHandler, oauth) as issuer:
        fhir_fake.state.oauth = oauth
        settings = Settings.model_validate(
            {
                "pipeline": {"enabled_steps": ["local_import"]},
                "services": {
                    "send": {
                        "send_as": "direct_resource_load",
                        "url": fhir_fake.base_url,
                        "auth": {
                            "oauth_issuer_uri": issuer.base_url + REALM_PATH,
                            "oauth_client_id": oauth.client_id,
                            "oauth_client_secret": oauth.client_secret,
                        },
                    }
                },
            }
        )
        source = write_ndjson(tmp_path / "core.ndjson", generated(6, "o"))
        with FhirServer.connect(settings.services.send, settings.tls, settings.retry) as server:
            send_resources(server, source, tmp_path / "send", job_id="j", batch_size=3, max_line_bytes=MB)
            oauth.revoke_all()
            (tmp_path / "send" / "progress" / "core.ndjson.json").unlink()
            send_resources(server, source, tmp_path / "send", job_id="j", batch_size=3, max_line_bytes=MB)

    assert len(oauth.token_requests) == 2  # the first token, then one fresh one after the 401
    assert len(fhir_fake.state.transactions) == 4


@pytest.mark.slow  # a second sekmet server
def test_no_auth_is_possible_against_an_open_server(tmp_path):
    server = start_sekmet(tmp_path / "open", basic_auth=False)
    try:
        resources = generated(4, "n")
        send_file(server.url, write_ndjson(tmp_path / "core.ndjson", resources), tmp_path / "send", basic=False)
        stored_as_sent(server, resources)
    finally:
        server.stop()


# --- resume after kill -9 -----------------------------------------------------------------------------------

KILLABLE_SEND = """
import sys
from pathlib import Path
from tests.support.sending import send_file
url, source, records, job = sys.argv[1:5]
send_file(url, Path(source), Path(records), batch_size=10, job_id=job)
"""


@pytest.mark.slow
def test_kill_9_mid_file_then_continue_resumes_at_the_first_unsent_batch(sekmet, tmp_path):
    job, prefix = uuid.uuid4().hex, uuid.uuid4().hex[:8]
    resources = generated(1500, prefix)
    for r in resources[::50]:
        del r["id"]  # some POST entries, which must still arrive exactly once
    source = write_ndjson(tmp_path / "batch-1.ndjson", resources, zstd=True)
    progress = tmp_path / "send" / "progress" / "batch-1.ndjson.json"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_SEND, sekmet.url, str(source), str(tmp_path / "send"), job],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("APP_")} | {"PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        while recorded_batches(progress) < 5:
            assert process.poll() is None, "the sender ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    killed_at = recorded_batches(progress)
    assert killed_at < 150

    report = send_file(sekmet.url, source, tmp_path / "send", batch_size=10, job_id=job)

    assert report.resumed_at_batch == killed_at + 1
    assert (report.batches, report.entries) == (150, 1500)
    with_ids = [r for r in resources if "id" in r]
    stored = stored_as_sent(sekmet, with_ids)
    assert (
        sum(r["meta"]["versionId"] != "1" for r in stored.values()) <= 10
    )  # at most the one batch in flight at the kill was sent twice
    without = [i for i, r in enumerate(resources) if "id" not in r]
    for index in without:
        code = entry_tag(f"{job}:batch-1.ndjson:{index + 1}", orjson.dumps(resources[index]))
        assert (
            len(sekmet.search("Observation", _tag=f"{SEND_ENTRY_TAG_SYSTEM}|{code}"))
            + len(sekmet.search("Patient", _tag=f"{SEND_ENTRY_TAG_SYSTEM}|{code}"))
            == 1
        )


def recorded_batches(progress: Path) -> int:
    try:
        return orjson.loads(progress.read_bytes())["batches"]
    except (OSError, orjson.JSONDecodeError):
        return 0


# --- the Prefect step -----------------------------------------------------------------------------------------


@flow
def run_send_step(step: StepInput) -> StepResult:
    return stored_in_job(send, step)(step)


@pytest.mark.slow  # a Prefect test server
def test_the_step_task_sends_core_first_and_a_second_run_is_served_from_the_job_cache(
    sekmet, tmp_path, prefect_api, write_config, monkeypatch
):
    prefix = uuid.uuid4().hex[:8]
    resources = generated(30, prefix)
    job_dir = tmp_path / "job"
    core = write_ndjson(job_dir / "import" / "core.ndjson.zst", resources[:3], zstd=True)
    batch = write_ndjson(job_dir / "import" / "batch-1.ndjson", resources[3:])
    monkeypatch.setenv("SEKMET_PASSWORD", PASSWORD)  # the secret stays out of the file, as in production
    config = write_config(send_config(sekmet.url, password="${SEKMET_PASSWORD}", batch_size=7))
    step = StepInput(
        job_id=f"job-{prefix}",
        job_dir=str(job_dir),
        position=1,
        step="send",
        folder="import",
        files=[DataFile(name=p.name, size=p.stat().st_size, resources=n) for p, n in ((batch, 27), (core, 3))],
        config_path=str(config),
    )

    result = run_send_step(step)
    again = run_send_step(step)

    assert result.folder == "import"
    assert [f.name for f in result.files] == ["core.ndjson.zst", "batch-1.ndjson"]
    assert result.summary["entries"] == 30 and result.summary["transactions"] == 1 + 4
    assert again.summary == result.summary
    stored = stored_as_sent(sekmet, resources)
    assert {resource["meta"]["versionId"] for resource in stored.values()} == {"1"}  # nothing sent twice
    assert orjson.loads((job_dir / "send" / "progress" / "batch-1.ndjson.json").read_bytes())["complete"]
