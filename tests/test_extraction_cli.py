"""``extraction …`` and ``cohort preview`` against the fake extraction server: the spec's behaviour and the real
server's deviations (412 for a stale If-Match, $pause from PENDING, a repeated $cancel answered 200), with Basic,
OAuth and API-key auth.

Commands run in-process through the real argument parser (``flows.run.main``); the server's clock is manual,
so a job is exactly where the test put it.
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from flows.extraction_cli import service_failure_text
from flows.run import main
from tasks.clients.bounds import Deadline, answer_too_large
from tasks.clients.errors import ServiceError
from tasks.job.record import JobRecord, changing_record, read_facts, record_facts
from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.extraction_server import ExtractionServer, JobStatus, start_extraction_server
from tests.fakes.extraction_state import BATCH_STAGES, ManualClock
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.support.jobs import put_flow_run, start_cli_process, wait_for

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
CONSENT_CRTDL = TESTDATA / "crtdl" / "CRTDL_test_consent-ext.json"
PASSWORD = "cli-basic-pw-4711"
API_KEY = "cli-api-key-0815"
LONG_AGO = "2026-01-01T00:00:00+00:00"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def torch(clock):
    with start_extraction_server(clock=clock, cohort_size=6, batch_size=2, max_concurrency=2) as server:
        yield server


def extractor_config(server: ExtractionServer, auth: dict | None = None, **extractor) -> dict:
    """The configuration tree of an extractor-only pipeline against ``server`` (quick retries, no jobs_dir)."""
    return extractor_config_at(server.base_url, auth, **extractor)


def extractor_config_at(base_url: str, auth: dict | None = None, **extractor) -> dict:
    """``extractor_config`` against the server at ``base_url``."""
    extractor = {"base_url": base_url, **extractor}
    if auth is not None:
        extractor["auth"] = auth
    return {
        "pipeline": {"enabled_steps": ["extractor"]},
        "retry": {"max_attempts": 2, "initial_backoff_ms": 1, "max_backoff_ms": 5},
        "services": {"extractor": extractor},
    }


@pytest.fixture
def config(write_config, torch) -> Path:
    return write_config(extractor_config(torch), jobs_dir=None)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def submit(server: ExtractionServer, crtdl: Path = CRTDL) -> str:
    crtdl_bytes = crtdl.read_bytes()
    from tests.fakes.extraction_crtdl import parse_crtdl

    return server.state.submit(parse_crtdl(crtdl_bytes), []).id


def status_of(server: ExtractionServer, job_id: str) -> JobStatus:
    return server.state.job(job_id).status


# --- list -----------------------------------------------------------------------------------------------------


def test_list_shows_a_table_of_jobs_with_status_priority_batches_cohort_and_age(capsys, torch, clock, config):
    running = submit(torch)
    clock.tick(0.11)  # pending 0.05 + cohort 0.05: batches are being processed
    queued = submit(torch)

    code, out, _ = cli(capsys, "extraction", "list", str(config))

    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATUS", "PRIORITY", "BATCHES", "COHORT", "AGE"]
    assert rows[0].split() == [running, "RUNNING_PROCESS_BATCH", "NORMAL", "0/3", "6", "0s", "ago"]
    assert rows[1].split() == [queued, "PENDING", "NORMAL", "-", "-", "0s", "ago"]


def test_list_filters_by_status_and_id_and_prints_json(capsys, torch, clock, config):
    first, second = submit(torch), submit(torch)
    clock.tick(0.06)
    torch.state.force_status(second, JobStatus.PAUSED)

    code, out, _ = cli(capsys, "extraction", "list", str(config), "--status", "paused", "--json")
    assert code == 0
    assert [job["id"] for job in json.loads(out)["jobs"]] == [second]
    assert json.loads(out)["jobs"][0]["status"] == "PAUSED"

    code, out, _ = cli(capsys, "extraction", "list", str(config), "--id", f"{first},{second}", "--json")
    assert {job["id"] for job in json.loads(out)["jobs"]} == {first, second}

    code, out, _ = cli(capsys, "extraction", "list", str(config), "--status", "COMPLETED")
    assert (code, out.strip()) == (0, "no extraction jobs match")


@pytest.mark.parametrize("strict", [[], ["--strict"]], ids=["default", "--strict"])
def test_list_shows_the_servers_400_for_bad_filter_values_as_a_list_of_problems(capsys, torch, config, strict):
    submit(torch)
    code, out, err = cli(
        capsys, "extraction", "list", str(config), "--id", "not-a-uuid", "--status", "SLEEPING", *strict
    )
    assert code == 2 and out == ""
    assert "the extraction server rejected the search:\n" in err
    assert "  - Invalid _id values: [not-a-uuid]\n" in err
    assert "  - Invalid status values: [SLEEPING]\n" in err
    assert torch.state.requests_to("/fhir/Task")[-1].header("Prefer") == "handling=strict"

    code, out, _ = cli(capsys, "extraction", "list", str(config), "--status", "SLEEPING", "--strict", "--json")
    assert code == 2 and json.loads(out)["problems"] == ["Invalid status values: [SLEEPING]"]


def test_a_mistyped_status_filter_lists_no_job_instead_of_every_job(capsys, torch, clock, config):
    cancelled, running = submit(torch), submit(torch)
    clock.tick(0.06)
    torch.state.force_status(cancelled, JobStatus.CANCELLED)

    # The server ignores a value it does not know unless asked to be strict: CANCELED would match every job, and a
    # script deleting what the list shows would delete the running one.
    code, out, err = cli(capsys, "extraction", "list", str(config), "--status", "CANCELED", "--json")
    assert code == 2 and running not in out
    assert json.loads(out)["problems"] == ["Invalid status values: [CANCELED]"]


# --- show -----------------------------------------------------------------------------------------------------


def test_show_prints_progress_with_active_batches_and_their_stages(capsys, torch, clock, config):
    job_id = submit(torch)
    clock.tick(0.11)

    code, out, _ = cli(capsys, "extraction", "show", str(config), job_id)

    assert code == 0
    assert f"extraction job {job_id}\n" in out
    assert "  status:    RUNNING_PROCESS_BATCH\n" in out
    assert "  cohort:    6 patients, batch size 2\n" in out
    assert "  batches:   0/3 done, 2 active\n" in out
    active = [line.split() for line in out.splitlines() if line.startswith("    ")]
    assert len(active) == 2 and {stage for _, stage in active} <= set(BATCH_STAGES)


def test_show_lists_consent_audit_files_and_json_carries_the_task(capsys, torch, clock, config):
    job_id = submit(torch, CONSENT_CRTDL)
    clock.tick(10)

    code, out, _ = cli(capsys, "extraction", "show", str(config), job_id)
    assert code == 0
    assert "  consent audit files (3):\n" in out
    assert out.count("_consent.ndjson") == 3

    code, out, _ = cli(capsys, "extraction", "show", str(config), job_id, "--json")
    shown = json.loads(out)
    assert (shown["status"], shown["batches_completed"], shown["batches_total"]) == ("COMPLETED", 3, 3)
    assert len(shown["consent_audit_files"]) == 3 and shown["task"]["resourceType"] == "Task"


def test_a_dupflow_job_id_resolves_to_its_recorded_extraction_job(capsys, tmp_path, torch, config):
    job_id = submit(torch)
    jobs_dir = tmp_path / "jobs"
    dupflow_job = "3f2a7c5e-1d2b-4c3d-9e8f-0a1b2c3d4e5f"
    (jobs_dir / dupflow_job).mkdir(parents=True)
    record_facts(jobs_dir / dupflow_job, extraction_job_id=job_id)

    code, out, _ = cli(capsys, "extraction", "show", str(config), dupflow_job, "--jobs-dir", str(jobs_dir), "--json")
    assert code == 0 and json.loads(out)["id"] == job_id

    not_submitted = "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d"
    (jobs_dir / not_submitted).mkdir()
    code, _, err = cli(capsys, "extraction", "show", str(config), not_submitted, "--jobs-dir", str(jobs_dir))
    assert code == 2 and "has no extraction job yet" in err


@pytest.mark.slow  # a process of its own: Ctrl+C as from a terminal
def test_ctrl_c_while_a_command_waits_for_a_server_is_exit_130_without_a_traceback(write_config):
    state = EchoState(replies=[Reply(delay=60)])
    with LoopbackServer(EchoHandler, state) as server:
        config = write_config(extractor_config_at(server.base_url), jobs_dir=None)
        process = start_cli_process("extraction", "list", str(config))
        wait_for(lambda: state.requests or None, process)  # the command waits for its answer
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err


def test_a_server_where_nothing_listens_is_named_by_its_url(capsys, write_config, unused_tcp_port):
    dead = f"http://127.0.0.1:{unused_tcp_port}"
    config = write_config(extractor_config_at(dead), jobs_dir=None)

    code, out, err = cli(capsys, "extraction", "list", str(config))

    assert code == 1, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"nothing answers at {dead}" in line and "services.extractor.base_url right?" in line
    assert line.count("services.extractor.base_url") == 1  # said once, by the client


def test_only_a_missing_answer_is_told_as_no_answer_from_the_server():
    server = "http://torch.example/fhir"
    too_large = answer_too_large("over 1.0 MB", 1 << 20, operation="list jobs", service="extractor", hint="-")
    with pytest.raises(ServiceError) as deadline:  # a deadline already passed
        Deadline(timedelta(0), "services.extractor.timeout").check("list jobs", "extractor")

    assert "no answer" not in service_failure_text(too_large, server)
    assert f"no answer from the extraction server at {server}" in service_failure_text(deadline.value, server)


def test_an_unknown_job_is_explained(capsys, torch, config):
    code, _, err = cli(capsys, "extraction", "show", str(config), "6f1b8ad4-0000-4000-8000-000000000000")
    assert code == 1
    assert "the extraction server has no job 6f1b8ad4-0000-4000-8000-000000000000" in err


# --- pause, resume, cancel ---------------------------------------------------------------------------------------


def test_pause_and_resume_a_running_job(capsys, torch, clock, config):
    job_id = submit(torch)
    clock.tick(0.11)

    code, out, _ = cli(capsys, "extraction", "pause", str(config), job_id)
    assert (code, out.strip()) == (0, f"extraction job {job_id}: paused (status PAUSED)")
    clock.tick(60)  # a paused job does not advance
    assert status_of(torch, job_id) is JobStatus.PAUSED

    code, out, _ = cli(capsys, "extraction", "pause", str(config), job_id)
    assert (code, out.strip()) == (0, f"extraction job {job_id}: already paused (status PAUSED)")

    code, out, _ = cli(capsys, "extraction", "resume", str(config), job_id, "--json")
    assert code == 0
    assert json.loads(out) | {"job": None} == {"ok": True, "operation": "resume", "changed": True, "job": None}
    assert json.loads(out)["job"]["status"] == "RUNNING_PROCESS_BATCH"


def test_a_409_is_explained_with_the_jobs_state(capsys, torch, clock, config):
    job_id = submit(torch)
    clock.tick(10)

    code, _, err = cli(capsys, "extraction", "pause", str(config), job_id)
    assert code == 1
    assert f"job {job_id} is COMPLETED; only running jobs can be paused" in err
    code, _, err = cli(capsys, "extraction", "cancel", str(config), job_id, "--json")
    assert code == 1
    assert "is COMPLETED; only jobs that have not finished can be cancelled" in err


@pytest.mark.parametrize("lenient", [False, True], ids=["spec", "real-server"])
def test_pause_from_pending_is_refused_by_the_spec_and_allowed_by_the_real_server(capsys, torch, config, lenient):
    torch.state.lenient_transitions = lenient
    job_id = submit(torch)

    code, out, err = cli(capsys, "extraction", "pause", str(config), job_id)

    if lenient:
        assert (code, status_of(torch, job_id)) == (0, JobStatus.PAUSED)
    else:
        assert code == 1 and f"job {job_id} is PENDING; only running jobs can be paused" in err


@pytest.mark.parametrize("lenient", [False, True], ids=["spec-409", "real-server-200"])
def test_cancelling_a_cancelled_job_says_it_already_is(capsys, torch, clock, config, lenient):
    torch.state.lenient_transitions = lenient
    job_id = submit(torch)
    clock.tick(0.11)
    assert cli(capsys, "extraction", "cancel", str(config), job_id)[0] == 0

    code, out, _ = cli(capsys, "extraction", "cancel", str(config), job_id)

    assert (code, out.strip()) == (0, f"extraction job {job_id}: already cancelled (status CANCELLED)")


def recorded_failed_job(jobs_dir: Path, job_id: str, config: Path, api: Any, **facts) -> None:
    """A job whose flow run failed (on the fake Prefect API ``api``) before its extractor step finished."""
    record = JobRecord(job_id=job_id, config_path=str(config), enabled_steps=["extractor", "send"])
    with changing_record(jobs_dir / job_id, new=record) as job:
        job.facts.update(facts)
    put_flow_run(api, jobs_dir / job_id, "FAILED", "Failed")


def test_prune_names_the_extraction_a_removed_job_left_running_with_a_command_that_cancels_it(
    capsys, tmp_path, torch, clock, config, empty_prefect_api
):
    """Once a Failed job's directory is pruned nothing names its extraction, which may still run on the server."""
    extraction, jobs, api = submit(torch), tmp_path / "jobs", empty_prefect_api
    clock.tick(0.11)
    left, in_doubt = "00000000-0000-4000-8000-000000000021", "00000000-0000-4000-8000-000000000022"
    status_url = f"{torch.base_url}/fhir/__status/{extraction}"
    recorded_failed_job(jobs, left, config, api, extraction_job_id=extraction, extraction_status_url=status_url)
    recorded_failed_job(jobs, in_doubt, config, api, extraction_submission={"generation": 1, "started_at": LONG_AGO})

    code, listed, _ = cli(capsys, "prune", "--jobs-dir", str(jobs))
    code_yes, removed, _ = cli(capsys, "prune", "--jobs-dir", str(jobs), "--yes")

    assert (code, code_yes) == (0, 0) and not (jobs / left).exists()
    assert status_of(torch, extraction) != JobStatus.CANCELLED  # prune itself cancels nothing
    assert f"note {left}: its extraction job {extraction} may still run ({status_url}); to cancel it: " in listed
    assert f"note {in_doubt}: an extraction it submitted may run on the extraction server, named nowhere" in listed
    assert "extraction list" in listed and "--status PENDING,RUNNING_GET_COHORT" in listed
    command = removed.split("to cancel it: ", 1)[1].splitlines()[0]
    argv = shlex.split(command)
    assert cli(capsys, *argv[argv.index("flows.run") + 1 :])[0] == 0
    assert status_of(torch, extraction) == JobStatus.CANCELLED


# --- priority -----------------------------------------------------------------------------------------------------


def test_priority_puts_the_task_with_a_weak_etag_of_its_version(capsys, torch, config):
    job_id = submit(torch)

    code, out, _ = cli(capsys, "extraction", "priority", str(config), job_id, "high")

    assert (code, out.strip()) == (0, f"extraction job {job_id}: priority set to HIGH (status PENDING)")
    assert torch.state.job(job_id).priority == "asap"
    [put] = [r for r in torch.state.requests if r.method == "PUT"]
    assert put.header("If-Match") == 'W/"1"' and put.header("Content-Type") == "application/fhir+json"

    code, out, _ = cli(capsys, "extraction", "priority", str(config), job_id, "high")
    assert out.strip() == f"extraction job {job_id}: priority already HIGH (status PENDING)"
    assert cli(capsys, "extraction", "priority", str(config), job_id, "normal")[0] == 0
    assert torch.state.job(job_id).priority == "routine"


@pytest.mark.parametrize("stale_status", [409, 412], ids=["spec-409", "real-server-412"])
def test_a_version_that_moved_on_is_read_again_and_the_put_repeated(capsys, torch, config, stale_status):
    torch.state.stale_version_status = stale_status
    torch.state.move_version_on_put = 2
    job_id = submit(torch)

    code, _, _ = cli(capsys, "extraction", "priority", str(config), job_id, "high")

    assert code == 0 and torch.state.job(job_id).priority == "asap"
    puts = [r.header("If-Match") for r in torch.state.requests if r.method == "PUT"]
    assert puts == ['W/"1"', 'W/"2"', 'W/"3"']  # each attempt carries the version it just read


def test_a_version_that_keeps_moving_gives_up_after_a_bounded_number_of_attempts(capsys, torch, config):
    torch.state.move_version_on_put = 100
    job_id = submit(torch)

    code, _, err = cli(capsys, "extraction", "priority", str(config), job_id, "high")

    assert code == 1 and "kept changing" in err
    assert len([r for r in torch.state.requests if r.method == "PUT"]) == 5
    assert not any(r.method == "PUT" and r.header("If-Match") is None for r in torch.state.requests)


# --- delete -------------------------------------------------------------------------------------------------------


def test_delete_with_yes_then_again_is_explained(capsys, torch, clock, config):
    job_id = submit(torch)
    clock.tick(10)

    code, out, _ = cli(capsys, "extraction", "delete", str(config), job_id, "--yes")
    assert (code, out.strip()) == (0, f"extraction job {job_id}: deleted; the server removes its result files")

    code, _, err = cli(capsys, "extraction", "delete", str(config), job_id, "--yes")
    assert code == 1 and f"the extraction server has no job {job_id}" in err


def test_delete_asks_for_confirmation(capsys, monkeypatch, torch, config):
    job_id = submit(torch)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, out, err = cli(capsys, "extraction", "delete", str(config), job_id)
    assert code == 0 and f"Delete extraction job {job_id} and its result files" in err and "error" not in err
    assert out == f"extraction job {job_id}: nothing deleted\n"
    assert torch.state.job(job_id) is not None

    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))  # Enter: the default, no
    code, out, _ = cli(capsys, "extraction", "delete", str(config), job_id, "--json")
    assert code == 0 and json.loads(out) == {"ok": True, "operation": "delete", "job_id": job_id, "deleted": False}

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal, no answer: not deleted, and said to be
    code, _, err = cli(capsys, "extraction", "delete", str(config), job_id)
    assert code == 1 and "no answer" in err and "--yes" in err

    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    assert cli(capsys, "extraction", "delete", str(config), job_id)[0] == 0
    assert torch.state.job(job_id) is None


def test_a_delete_the_server_could_not_finish_is_explained_and_attempted_once(capsys, torch, config):
    torch.state.delete_fails = True
    job_id = submit(torch)

    code, _, err = cli(capsys, "extraction", "delete", str(config), job_id, "--yes", "--json")

    assert code == 1 and "could not remove the result files" in err
    assert len([r for r in torch.state.requests if r.method == "DELETE"]) == 1


# --- cohort preview -----------------------------------------------------------------------------------------------


def test_cohort_preview_posts_the_crtdl_as_plain_json_and_prints_the_size(capsys, torch, config):
    code, out, _ = cli(capsys, "cohort", "preview", str(config), str(CRTDL))
    assert (code, out.strip()) == (0, "cohort size: 6 patients")

    code, out, _ = cli(capsys, "cohort", "preview", str(config), str(CRTDL), "--ids", "--json")
    preview = json.loads(out)
    assert preview["cohort_size"] == 6 and len(preview["patient_ids"]) == 6
    [request] = torch.state.requests_to("/fhir/$evaluate-cohort")[-1:]
    assert request.header("Content-Type") == "application/json"
    assert torch.state.jobs == {}  # no job is created

    code, out, _ = cli(capsys, "cohort", "preview", str(config), str(CRTDL), "--ids")
    assert out.splitlines()[1:] == preview["patient_ids"]


def test_cohort_preview_agrees_with_the_cohort_an_extraction_gets(capsys, torch, config):
    _, out, _ = cli(capsys, "cohort", "preview", str(config), str(CRTDL), "--ids", "--json")
    job_id = submit(torch)
    assert tuple(json.loads(out)["patient_ids"]) == torch.state.job(job_id).patient_ids


def test_an_older_server_without_cohort_preview_is_explained(capsys, torch, config):
    torch.state.cohort_preview = False
    code, _, err = cli(capsys, "cohort", "preview", str(config), str(CRTDL))
    assert code == 1 and "does not support cohort preview" in err


def test_a_crtdl_that_is_not_json_is_a_usage_error(capsys, tmp_path, torch, config):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    code, _, err = cli(capsys, "cohort", "preview", str(config), str(broken))
    assert code == 2 and "not valid JSON" in err
    code, _, err = cli(capsys, "cohort", "preview", str(config), str(tmp_path / "missing.json"))
    assert code == 2 and f"CRTDL {tmp_path / 'missing.json'} not found" in err
    assert torch.state.requests_to("/fhir/$evaluate-cohort") == []


# --- configuration and auth ---------------------------------------------------------------------------------------


def test_configuration_problems_are_usage_errors(capsys, tmp_path, write_config, torch):
    no_url = write_config({"pipeline": {"enabled_steps": ["local_import"]}}, tmp_path / "no-url.yaml", jobs_dir=None)
    code, _, err = cli(capsys, "extraction", "list", str(no_url))
    assert code == 2 and "services.extractor.base_url is not set" in err

    too_many_attempts = {"pipeline": {"enabled_steps": ["extractor"]}, "retry": {"max_attempts": 99}}
    invalid = write_config(too_many_attempts, tmp_path / "invalid.yaml", jobs_dir=None)
    code, out, err = cli(capsys, "extraction", "list", str(invalid), "--json")
    assert code == 2 and "invalid configuration" in json.loads(out)["error"]


def basic_header(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def oauth_issuer():
    state = OAuthState()
    with LoopbackServer(OAuthHandler, state) as server:
        yield server, state


def auth_variants(oauth_issuer) -> dict:
    issuer, oauth = oauth_issuer
    return {
        "basic": (
            {"username": "dupflow", "password": PASSWORD},
            lambda h: h.get("authorization") == basic_header("dupflow", PASSWORD),
        ),
        "oauth": (
            {
                "oauth_issuer_uri": f"{issuer.base_url}{REALM_PATH}",
                "oauth_client_id": oauth.client_id,
                "oauth_client_secret": oauth.client_secret,
            },
            lambda h: oauth.is_valid(h.get("authorization", "").removeprefix("Bearer ")),
        ),
        "api-key": (
            {"api_key": API_KEY, "api_key_header": "X-Api-Key"},
            lambda h: h.get("x-api-key") == API_KEY,
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["basic", "oauth", "api-key"])
def test_every_command_authenticates_as_configured(capsys, write_config, torch, clock, oauth_issuer, scheme):
    auth, check = auth_variants(oauth_issuer)[scheme]
    torch.state.auth_check = check
    config = write_config(extractor_config(torch, auth), jobs_dir=None)
    job_id = submit(torch)
    clock.tick(0.11)

    commands = [  # one of each kind of call: search, read + PUT, read + POST, DELETE, $evaluate-cohort
        ("extraction", "list"),
        ("extraction", "priority", job_id, "high"),
        ("extraction", "pause", job_id),
        ("extraction", "delete", job_id, "--yes"),
        ("cohort", "preview", str(CRTDL)),
    ]
    for group, name, *rest in commands:
        code, _, err = cli(capsys, group, name, str(config), *rest)
        assert code == 0, (name, err)
    assert torch.state.job(job_id) is None
    assert len(torch.state.requests) == 7 and all(check(r.headers) for r in torch.state.requests)


def test_refused_credentials_fail_without_showing_the_secret(capsys, write_config, torch):
    torch.state.auth_check = lambda h: h.get("authorization") == basic_header("dupflow", "the-right-one")
    auth = {"username": "dupflow", "password": PASSWORD}
    config = write_config(extractor_config(torch, auth), jobs_dir=None)

    code, out, err = cli(capsys, "extraction", "list", str(config), "--json")

    assert code == 1 and "HTTP 401" in err
    assert PASSWORD not in out + err and base64.b64encode(PASSWORD.encode()).decode() not in out + err


# --- the operator's story -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_an_operator_pauses_and_resumes_a_running_pipeline_extraction(capsys, tmp_path, write_config):
    """Start an extraction through the pipeline, see it running, pause it (the pipeline keeps polling, 202,
    without failing), resume it, and the pipeline completes."""
    from tests.support.jobs import job_file, only_job_dir, start_cli_process, wait_for

    # Batches take a minute until the test has paused and resumed the job, so it cannot finish in between.
    slow_batches = {
        "PENDING": 0.05,
        "RUNNING_GET_COHORT": 0.05,
        "RUNNING_PROCESS_BATCH": 60.0,
        "RUNNING_PROCESS_CORE": 0.05,
    }
    with start_extraction_server(durations=slow_batches) as torch:
        jobs_dir = tmp_path / "jobs"
        every_second = {"polling_interval": "PT1S", "max_polling_interval": "PT1S", "file_ready_interval": "PT1S"}
        tree = extractor_config(torch, **every_second)
        config = write_config({**tree, "compression": {"level": "fastest"}}, jobs_dir=jobs_dir)
        process = start_cli_process("start", str(config), str(CRTDL), "--no-progress")
        try:
            wait_for(lambda: (jobs_dir.is_dir() and list(jobs_dir.glob("*/job.json"))) or None, process)
            job_dir = only_job_dir(jobs_dir)
            extraction_id = wait_for(lambda: read_facts(job_dir).get("extraction_job_id"), process)
            wait_for(lambda: status_of(torch, extraction_id) is JobStatus.RUNNING_PROCESS_BATCH or None, process)

            code, out, _ = cli(capsys, "extraction", "list", str(config), "--json")
            assert code == 0
            assert [(j["id"], j["status"]) for j in json.loads(out)["jobs"]] == [
                (extraction_id, "RUNNING_PROCESS_BATCH")
            ]

            pause = cli(capsys, "extraction", "pause", str(config), job_dir.name, "--jobs-dir", str(jobs_dir))
            assert pause[0] == 0 and status_of(torch, extraction_id) is JobStatus.PAUSED
            polls_when_paused = torch.state.polls[extraction_id]
            wait_for(lambda: torch.state.polls[extraction_id] >= polls_when_paused + 2 or None, process)
            assert process.poll() is None  # still polling, not failed

            torch.state.durations["RUNNING_PROCESS_BATCH"] = 0.05
            assert cli(capsys, "extraction", "resume", str(config), extraction_id)[0] == 0
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        stdout, stderr = process.communicate()
    assert process.returncode == 0, stderr
    assert job_file(job_dir)["state"] == "Completed"
    assert len(torch.state.submissions) == 1
