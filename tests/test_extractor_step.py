"""The extractor step end to end through the command line, against the fake extraction server.

The fake runs in the test process; jobs run in-process (``flows.run.main``) or, where a test kills the run,
as a CLI subprocess. polling_interval is the spec's minimum of 1 s, so each job takes a second or more.
"""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import zstandard

from flows.run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from config.runtime import CLI
from tasks.job.record import read_facts
from tests.conftest import TESTDATA, complete_results, extraction_tree, run_cli
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply, operation_outcome
from tests.fakes.extraction_server import ExtractionServer, JobStatus, start_extraction_server
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.support.extraction import submit
from tests.support.jobs import job_file, only_job_dir, start_cli_process, step_results, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"


@pytest.fixture
def torch():
    with start_extraction_server() as server:
        yield server


@pytest.fixture
def extractor_config(write_config):
    """``extractor_config(server, stall=..., **services)``: a configuration of the extractor step against
    ``server`` (polling at the spec's minimum of 1 s), with more ``services`` blocks if given."""

    def write(server: ExtractionServer, *, stall: str = "PT10S", **services: dict) -> Path:
        extractor = {
            "base_url": server.base_url,
            "polling_interval": "PT1S",
            "max_polling_interval": "PT1S",
            "file_ready_interval": "PT1S",
            "download_stall_timeout": stall,
        }
        return write_config(
            {
                "pipeline": {"enabled_steps": ["extractor"]},
                "compression": {"level": "fastest"},
                "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 50},
                "services": {"extractor": extractor, **services},
            }
        )

    return write


def submitted_crtdl(server: ExtractionServer, index: int = 0) -> bytes:
    parameters = json.loads(server.state.submissions[index].body)
    return base64.b64decode(parameters["parameter"][0]["valueBase64Binary"])


def decompressed_lines(path: Path) -> int:
    data = zstandard.ZstdDecompressor().decompressobj(read_across_frames=True).decompress(path.read_bytes())
    return len(data.splitlines())


def jobs_dir_of(tmp_path: Path) -> Path:
    return tmp_path / "jobs"


def step_result(job_dir: Path) -> dict:
    return step_results(job_dir)[0]


def test_an_extraction_job_downloads_every_file_core_first_and_records_the_handle(
    tmp_path, torch, capsys, extractor_config
):
    assert main(["start", str(extractor_config(torch)), str(CRTDL), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    (submission,) = torch.state.submissions
    assert (job_dir / "crtdl.json").read_bytes() == CRTDL.read_bytes() == submitted_crtdl(torch)

    result = step_result(job_dir)
    files = result["files"]
    assert files[0]["name"] == "core.ndjson.zst" and len(files) == 4
    for record in files:
        assert decompressed_lines(job_dir / "import" / record["name"]) == record["resources"] > 0
        assert (job_dir / "import" / record["name"]).stat().st_size == record["size"]
    facts = read_facts(job_dir)
    assert facts["extraction_job_id"] == submission.job_id
    assert facts["extraction_status_url"] == f"{torch.base_url}/fhir/__status/{submission.job_id}"
    assert facts["crtdl_path"] == str(job_dir / "crtdl.json")
    assert "extraction_submission" not in facts
    assert not list((job_dir / "import").glob(".*"))

    capsys.readouterr()
    main(["status", str(job_dir)])
    assert f"extraction_job_id: {submission.job_id}" in capsys.readouterr().out


def test_extraction_progress_is_published_as_a_prefect_artifact(tmp_path, extractor_config):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with start_extraction_server(
        durations={
            "PENDING": 1.5,
            "RUNNING_GET_COHORT": 0.05,
            "RUNNING_PROCESS_BATCH": 0.05,
            "RUNNING_PROCESS_CORE": 0.05,
        }
    ) as torch:
        assert main(["start", str(extractor_config(torch)), str(CRTDL), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    key = f"job-{job_dir.name}-01-extractor-progress"
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
        )
    assert artifacts and artifacts[0].type == "progress" and float(artifacts[0].data) == 100.0


def test_an_invalid_crtdl_is_refused_at_start_naming_the_file_and_sends_nothing(
    tmp_path, torch, capsys, extractor_config
):
    broken = tmp_path / "broken.json"
    broken.write_text('{"cohortDefinition": ')
    assert main(["start", str(extractor_config(torch)), str(broken), "--no-progress"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"invalid CRTDL {broken}" in err and "not valid JSON" in err
    assert torch.state.submissions == [] and torch.state.requests == []
    assert not jobs_dir_of(tmp_path).exists() or not list(jobs_dir_of(tmp_path).iterdir())


def test_enrichment_rules_write_an_enriched_crtdl_that_is_what_gets_submitted(tmp_path, torch, extractor_config):
    group = (
        "https://www.medizininformatik-initiative.de/fhir/core/modul-person/StructureDefinition/PatientPseudonymisiert"
    )
    rules = {
        "enabled": True,
        "enrichments": [
            {
                "group_reference": group,
                "attributes_to_add": [{"attribute_ref": "Patient.identifier", "must_have": True}],
            }
        ],
    }
    assert (
        main(["start", str(extractor_config(torch, crtdl_preprocessing=rules)), str(CRTDL), "--no-progress"]) == EXIT_OK
    )
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    enriched = job_dir / "enriched-crtdl.json"
    assert not (job_dir / "crtdl.json").exists()
    assert json.loads(submitted_crtdl(torch)) == json.loads(enriched.read_bytes())
    assert "Patient.identifier" in enriched.read_text()
    assert read_facts(job_dir)["crtdl_path"] == str(enriched)


def test_a_complete_result_url_as_input_is_downloaded_without_submitting(tmp_path, torch, extractor_config):
    import httpx

    from tests.support.extraction import poll_until_done, submit

    with httpx.Client() as client:
        status_url = submit(client, torch)
        assert poll_until_done(client, status_url).status_code == 200
    assert main(["start", str(extractor_config(torch)), status_url, "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    assert len(torch.state.submissions) == 1  # the test's own
    assert len(step_result(job_dir)["files"]) == 4
    assert "crtdl_path" not in read_facts(job_dir)


def test_a_server_restart_mid_job_leads_to_exactly_one_fresh_submission(tmp_path, extractor_config):
    slow = {"PENDING": 1.5, "RUNNING_GET_COHORT": 0.05, "RUNNING_PROCESS_BATCH": 0.05, "RUNNING_PROCESS_CORE": 0.05}
    with start_extraction_server(durations=slow) as torch:
        restart = threading.Thread(target=forget_jobs_after_first_poll, args=(torch,), daemon=True)
        restart.start()
        assert main(["start", str(extractor_config(torch)), str(CRTDL), "--no-progress"]) == EXIT_OK
        restart.join(5)
        first, second = torch.state.submissions
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    facts = read_facts(job_dir)
    assert facts["extraction_job_id"] == second.job_id != first.job_id and facts["extraction_generation"] == 1
    assert len(step_result(job_dir)["files"]) == 4


def forget_jobs_after_first_poll(server: ExtractionServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not server.state.polls and time.monotonic() < deadline:
        time.sleep(0.01)
    server.state.forget_jobs()


def recorded_generation(jobs_dir: Path) -> int | None:
    """The extraction generation the job record holds (1 after one fresh submission), once it holds a handle."""
    for job_dir in jobs_dir.glob("*"):
        facts = read_facts(job_dir)
        if facts.get("extraction_status_url"):
            return facts.get("extraction_generation")
    return None


@pytest.mark.slow
def test_killed_while_polling_continue_reattaches_without_submitting_again(tmp_path, extractor_config):
    with start_extraction_server(
        durations={
            "PENDING": 4.0,
            "RUNNING_GET_COHORT": 0.05,
            "RUNNING_PROCESS_BATCH": 0.05,
            "RUNNING_PROCESS_CORE": 0.05,
        }
    ) as torch:
        process = start_cli_process("start", str(extractor_config(torch)), str(CRTDL), "--no-progress")
        wait_for(lambda: torch.state.polls or None, process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        job_dir = only_job_dir(jobs_dir_of(tmp_path))
        result = run_cli("continue", str(job_dir), "--no-progress")
        assert result.returncode == EXIT_OK, result.stderr
        assert len(torch.state.submissions) == 1
    assert job_file(job_dir)["state"] == "Completed"
    assert len(step_result(job_dir)["files"]) == 4


@pytest.mark.slow
def test_killed_after_a_resubmission_continue_reattaches_to_the_newest_job(tmp_path, extractor_config):
    slow = {"PENDING": 4.0, "RUNNING_GET_COHORT": 0.05, "RUNNING_PROCESS_BATCH": 0.05, "RUNNING_PROCESS_CORE": 0.05}
    with start_extraction_server(durations=slow) as torch:
        process = start_cli_process("start", str(extractor_config(torch)), str(CRTDL), "--no-progress")
        wait_for(lambda: torch.state.polls or None, process)
        torch.state.forget_jobs()
        wait_for(lambda: recorded_generation(jobs_dir_of(tmp_path)) == 1 or None, process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        job_dir = only_job_dir(jobs_dir_of(tmp_path))
        result = run_cli("continue", str(job_dir), "--no-progress")
        assert result.returncode == EXIT_OK, result.stderr
        first, second = torch.state.submissions
    assert read_facts(job_dir)["extraction_job_id"] == second.job_id


def killed_while_polling(torch: ExtractionServer, config: Path, job_input: str, tmp_path: Path) -> Path:
    """A job of ``job_input`` started as a command and killed (-9) once it polls the extraction; its directory."""
    process = start_cli_process("start", str(config), job_input, "--no-progress")
    wait_for(lambda: torch.state.polls or None, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return only_job_dir(jobs_dir_of(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--resubmit", "--attach"])
def test_resubmit_or_attach_elsewhere_cancels_the_unfinished_extraction_the_job_had(tmp_path, extractor_config, flag):
    """The job's recorded extraction is stuck (TEMP_FAILED: the server answers 503 and may take it up again); the
    operator replaces it. Left alone, it would run on beside its replacement, taking the server's batch slots."""
    slow = {"PENDING": 4.0, "RUNNING_GET_COHORT": 0.05, "RUNNING_PROCESS_BATCH": 0.05, "RUNNING_PROCESS_CORE": 0.05}
    with start_extraction_server(durations=slow) as torch:
        job_dir = killed_while_polling(torch, extractor_config(torch), str(CRTDL), tmp_path)
        first = torch.state.submissions[0].job_id
        torch.state.force_status(first, JobStatus.TEMP_FAILED)
        if flag == "--attach":
            with httpx.Client() as client:
                replacement = ["--attach", submit(client, torch)]  # the job the operator chose instead
        else:
            replacement = ["--resubmit"]

        result = run_cli("continue", str(job_dir), *replacement, "--no-progress")

        assert result.returncode == EXIT_OK, result.stderr
        assert len(torch.state.submissions) == 2
        assert torch.state.job(first).status is JobStatus.CANCELLED
        assert read_facts(job_dir)["extraction_job_id"] == torch.state.submissions[1].job_id
    assert f"cancelled extraction job {first}" in result.stderr + result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--resubmit", "--attach"])
def test_resubmit_or_attach_of_a_job_that_follows_a_given_status_url_cancels_nothing(tmp_path, extractor_config, flag):
    """A job started with the status URL of an extraction (one started by hand, or another job's) follows it, it
    does not own it: continue --resubmit (or --attach) cancelled that extraction on the server as the job's
    replaced one, and the job, which follows its input's URL whatever the flags say, then stopped on the cancel."""
    slow = {"PENDING": 4.0, "RUNNING_GET_COHORT": 0.05, "RUNNING_PROCESS_BATCH": 0.05, "RUNNING_PROCESS_CORE": 0.05}
    with start_extraction_server(durations=slow) as torch:
        with httpx.Client() as client:
            given, other = submit(client, torch), submit(client, torch)
        job_dir = killed_while_polling(torch, extractor_config(torch), given, tmp_path)

        result = run_cli("continue", str(job_dir), *([flag, other] if flag == "--attach" else [flag]), "--no-progress")

        assert [r.path for r in torch.state.requests if "$cancel" in r.path] == []
        assert result.returncode == EXIT_USAGE, result.stderr
        assert f"{flag} applies to a job that submits its CRTDL" in result.stderr, result.stderr
        assert len(torch.state.submissions) == 2  # the test's own


@pytest.mark.slow
def test_attach_to_the_job_it_already_follows_cancels_nothing(tmp_path, extractor_config):
    slow = {"PENDING": 3.0, "RUNNING_GET_COHORT": 0.05, "RUNNING_PROCESS_BATCH": 0.05, "RUNNING_PROCESS_CORE": 0.05}
    with start_extraction_server(durations=slow) as torch:
        job_dir = killed_while_polling(torch, extractor_config(torch), str(CRTDL), tmp_path)
        status_url = read_facts(job_dir)["extraction_status_url"]

        result = run_cli("continue", str(job_dir), "--attach", status_url, "--no-progress")

        assert result.returncode == EXIT_OK, result.stderr
        assert len(torch.state.submissions) == 1
        assert [r for r in torch.state.requests if "$cancel" in r.path] == []


@pytest.mark.slow
def test_killed_during_downloads_continue_fetches_only_the_unfinished_file(tmp_path, extractor_config):
    with start_extraction_server(cohort_size=8, stall_downloads=1, stall_after_bytes=10, stall_seconds=20) as torch:
        config = extractor_config(torch, stall="PT60S")
        process = start_cli_process("start", str(config), str(CRTDL), "--no-progress")
        # Four files finished means four persisted per-file results (a renamed file whose result is not yet
        # written would be fetched again, harmlessly but not what this test counts).
        wait_for(
            lambda: complete_results(jobs_dir_of(tmp_path), "00-extractor-download-result-file") == 4 or None,
            process,
        )
        process.send_signal(signal.SIGKILL)
        process.wait()
        job_dir = only_job_dir(jobs_dir_of(tmp_path))
        fetched_before = dict(torch.state.file_gets)
        result = run_cli("continue", str(job_dir), "--no-progress")
        assert result.returncode == EXIT_OK, result.stderr
        fetched_again = {k: n - fetched_before.get(k, 0) for k, n in torch.state.file_gets.items()}
    assert len(fetched_before) == 5
    assert sorted(fetched_again.values()) == [0, 0, 0, 0, 1]
    assert len(torch.state.submissions) == 1
    assert len(step_result(job_dir)["files"]) == 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "sent", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "Ctrl+C", "SIGHUP-closed-terminal"]
)
def test_a_signal_during_stalled_downloads_ends_the_run_at_once_in_one_line_without_partial_files(
    tmp_path, extractor_config, sent
):
    with start_extraction_server(cohort_size=8, stall_downloads=5, stall_after_bytes=10, stall_seconds=30) as torch:
        config = extractor_config(torch, stall="PT60S")
        process = start_cli_process("start", str(config), str(CRTDL), "--no-progress")
        wait_for(lambda: next(jobs_dir_of(tmp_path).glob("*/import/.*.part"), None), process)
        signalled = time.monotonic()
        process.send_signal(sent)
        _, err = process.communicate(timeout=30)
        took = time.monotonic() - signalled
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    assert process.returncode == 130, err
    assert took < 15, f"the run needed {took:.0f} s to stop"
    lines = err.strip().splitlines()  # the run's INFO lines, then the interruption's one line, no echo of it
    expected = f"job {job_dir.name} interrupted (Ctrl+C or SIGTERM); resume with: {CLI} continue {job_dir}"
    assert lines[-1] == expected, err
    assert not [line for line in lines if "| ERROR " in line or "Traceback" in line], err
    assert list((job_dir / "import").glob(".*.part")) == []
    assert job_file(job_dir)["state"] == "Cancelled"


def test_a_handle_that_keeps_dying_gives_up_after_max_attempts_fresh_submissions(tmp_path, capsys, extractor_config):
    def accepted(n: int) -> Reply:
        return Reply(202, {"Content-Location": f"/fhir/__status/job-{n}"}, b"")

    # Each job's status answers 404, and so does its Task (a lost job, not one a person deleted).
    state = EchoState(replies=[r for n in range(4) for r in (accepted(n), Reply(404), Reply(404))])
    with LoopbackServer(EchoHandler, state) as server:
        config = extractor_config(server)
        assert main(["start", str(config), str(CRTDL), "--no-progress"]) == EXIT_FAILED
    posts = [r for r in state.requests if r.method == "POST"]
    assert len(posts) == 4  # the first submission and retry.max_attempts = 3 fresh ones
    err = capsys.readouterr().err
    assert "job-3 is gone" in err and "3 fresh submission(s)" in err and "retry.max_attempts" in err


def kickoffs(server: ExtractionServer) -> int:
    """The kick-off POSTs the fake received, refused ones included (a 401 is answered before it counts as a
    submission)."""
    return len([r for r in server.state.requests if r.method == "POST" and r.path == "/fhir/$extract-data"])


def basic_header(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_a_kickoff_refused_for_wrong_credentials_is_submitted_again_by_continue_once_they_are_fixed(
    tmp_path, torch, capsys, write_config
):
    torch.state.auth_check = lambda headers: headers.get("authorization") == basic_header("dupflow", "the-right-one")
    config = write_config(extraction_tree(torch.base_url, auth={"username": "dupflow", "password": "wrong"}))
    assert main(["start", str(config), str(CRTDL), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "Authentication required" in err and "may or may not have that job" not in err
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    assert "extraction_submission" not in read_facts(job_dir)  # refused: no job exists, nothing is in doubt

    write_config(extraction_tree(torch.base_url, auth={"username": "dupflow", "password": "the-right-one"}))
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK, capsys.readouterr().err
    assert kickoffs(torch) == 2 and len(torch.state.submissions) == 1
    facts = read_facts(job_dir)
    assert facts["extraction_job_id"] == torch.state.submissions[0].job_id and "extraction_submission" not in facts
    assert job_file(job_dir)["state"] == "Completed" and len(step_result(job_dir)["files"]) == 4


def test_an_identity_provider_failing_before_the_kickoff_leaves_nothing_in_doubt_and_continue_submits(
    tmp_path, torch, capsys, write_config
):
    oauth = OAuthState(unavailable_next=1)  # Keycloak answers the kick-off's token request 503: nothing is sent
    with LoopbackServer(OAuthHandler, oauth) as issuer:
        torch.state.auth_check = lambda headers: oauth.is_valid(headers.get("authorization", "")[len("Bearer ") :])
        auth = {
            "oauth_issuer_uri": f"{issuer.base_url}{REALM_PATH}",
            "oauth_client_id": oauth.client_id,
            "oauth_client_secret": oauth.client_secret,
        }
        config = write_config(extraction_tree(torch.base_url, auth=auth))
        assert main(["start", str(config), str(CRTDL), "--no-progress"]) == EXIT_FAILED
        err = capsys.readouterr().err
        assert "fetch OAuth token failed with HTTP 503" in err and "may or may not have that job" not in err
        job_dir = only_job_dir(jobs_dir_of(tmp_path))
        assert kickoffs(torch) == 0 and "extraction_submission" not in read_facts(job_dir)

        assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_OK, capsys.readouterr().err
    assert len(torch.state.submissions) == 1 and job_file(job_dir)["state"] == "Completed"


def test_a_kickoff_refused_with_400_reports_the_diagnostics_and_continue_submits_again(
    tmp_path, torch, capsys, extractor_config
):
    crtdl = json.loads(CRTDL.read_text())
    unknown = "https://example.org/fhir/StructureDefinition/NoSuchProfile"
    crtdl["dataExtraction"]["attributeGroups"].append({"id": "unknown", "groupReference": unknown, "attributes": []})
    refused = tmp_path / "unknown-profile.json"
    refused.write_text(json.dumps(crtdl))
    config = extractor_config(torch)

    assert main(["start", str(config), str(refused), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "HTTP 400" in err and f"Unknown Profile: {unknown}" in err  # the server's diagnostics, verbatim
    job_dir = only_job_dir(jobs_dir_of(tmp_path))
    assert "extraction_submission" not in read_facts(job_dir)

    # No --resubmit needed: continue submits again (here the same CRTDL, refused the same way, not "in doubt").
    assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert f"Unknown Profile: {unknown}" in err and "may or may not have that job" not in err
    assert [s.status for s in torch.state.submissions] == [400, 400]
    assert "extraction_submission" not in read_facts(job_dir)


def test_a_lost_kickoff_answer_stays_in_doubt_with_a_token_in_the_base_urls_query(capsys, extractor_config):
    """The request goes with base_url's query (``ServiceAuth`` adds it): the failed kick-off was taken for another
    request (the identity provider's), its attempt cleared, and continue submitted the extraction again."""
    state = EchoState(replies=[Reply(reset=True)])
    with LoopbackServer(EchoHandler, state) as server:
        config = extractor_config(SimpleNamespace(base_url=f"{server.base_url}?access_token=Tok3n-abcdef123"))
        assert main(["start", str(config), str(CRTDL), "--no-progress"]) == EXIT_FAILED
        job_dir = only_job_dir(jobs_dir_of(config.parent))
        assert "extraction_submission" in read_facts(job_dir)
        assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_FAILED
    assert "may or may not have that job" in capsys.readouterr().err
    assert len([r for r in state.requests if r.method == "POST"]) == 1


@pytest.mark.parametrize(
    "answer",
    [Reply(502, body=operation_outcome("Bad Gateway")), Reply(503), Reply(reset=True)],
    ids=["502", "503", "connection-reset"],
)
def test_a_kickoff_answered_with_5xx_or_no_answer_leaves_the_submission_in_doubt(
    tmp_path, capsys, extractor_config, answer
):
    state = EchoState(replies=[answer])
    with LoopbackServer(EchoHandler, state) as server:
        (config := tmp_path / "site config" / "torch.yaml").parent.mkdir()  # a space: the advice is quoted
        extractor_config(server).rename(config)
        assert main(["start", str(config), str(CRTDL), "--no-progress"]) == EXIT_FAILED
        job_dir = only_job_dir(jobs_dir_of(tmp_path))
        assert "extraction_submission" in read_facts(job_dir)  # a proxy's 5xx or a lost answer may hide a job
        first = capsys.readouterr().err  # the first run says so at once, the command filled in as typed
        assert "may or may not have that job" in first and f"extraction list '{config}' --status" in first
        assert main(["continue", str(job_dir), "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "may or may not have that job" in err and f"continue {job_dir} --resubmit" in err
    assert len([r for r in state.requests if r.method == "POST"]) == 1
