"""Prefect's controls on a job the command line started: Cancel, Suspend, Resume, Retry and Delete, pressed as the UI
presses them (its API calls), against a real local Prefect server; each does what it says within seconds."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from config.runtime import CLI
from flows.job_state import newest_run
from flows.job_stop import CANCELLED_ON_SERVER, stop_watch
from flows.run import EXIT_INTERRUPTED
from tasks.job.layout import JobPaths
from tests.conftest import run_cli_here, wait_until
from tests.fakes.fhir_server import FhirFakeState, start_fhir_fake
from tests.support.controls import finished, home_command, press, released_note, server_state
from tests.support.deployments import api
from tests.support.jobs import only_job_dir, source_dir, start_cli_process, wait_for
from tests.support.prefect_servers import stop_runner_of, wait_until_stopped
from tests.support.sending import generated, write_ndjson

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "no_runner_left")]


@pytest.fixture(scope="module")
def no_runner_left(prefect_api):
    """The home's runner these tests' commands start stops with the module: later modules share the server."""
    yield
    stop_runner_of(Path(prefect_api["database"]).parent)


def send_job(tmp_path: Path, write_config: Any, url: str, resources: int) -> tuple[Path, Path]:
    """A job that imports ``resources`` and sends them to ``url``, one transaction each; config and input."""
    source = tmp_path / "in"
    write_ndjson(source / "data.ndjson", generated(resources // 2, "p"))
    auth = {"username": "dupflow", "password": "not-a-secret-here"}
    send = {"send_as": "direct_resource_load", "url": url, "batch_size": 1, "auth": auth}
    tree = {"pipeline": {"enabled_steps": ["local_import", "send"]}, "services": {"send": send}}
    return write_config(tree | {"retry": {"max_attempts": 1}}), source


def job_run(jobs_dir: Path) -> dict[str, Any]:
    """The job's flow run as the server has it, once the job and its run exist."""
    found: list[dict[str, Any]] = []
    wait_until(lambda: jobs_dir.is_dir() and any(jobs_dir.iterdir()), "the job's directory", timeout=60)
    paths = JobPaths(only_job_dir(jobs_dir))
    wait_until(lambda: bool(found.append(newest_run(paths) or {}) or found[-1]), "the job's run", timeout=120)
    return found[-1]


def stopping(jobs_dir: Path) -> None:
    """Wait until the job says it stops its work (the job log's line), the control seen."""
    log = only_job_dir(jobs_dir) / "job.log"
    wait_until(lambda: "stopping the job's work" in log.read_text(), "the job's work stopping", timeout=30)


def test_a_cancel_during_a_send_stops_the_job_with_no_request_after_it(tmp_path, write_config, prefect_api):
    """The finding: after a Cancel the process sent all 400 requests, and the run stayed Cancelling for ever."""
    fake = start_fhir_fake(FhirFakeState(hold_from=5))
    try:
        config, source = send_job(tmp_path, write_config, fake.base_url, 400)
        process = start_cli_process("start", str(config), str(source), "--no-progress")
        run = job_run(tmp_path / "jobs")
        wait_until(lambda: len(fake.state.requests) >= 5, "the send's fifth request, held", timeout=120)

        press(prefect_api["api_url"], run["id"], {"type": "CANCELLING", "name": "Cancelling"})
        stopping(tmp_path / "jobs")
        sent = len(fake.state.requests)
        fake.state.released.set()
        out, err = process.communicate(timeout=60)
    finally:
        fake.stop()

    assert len(fake.state.requests) == sent
    assert process.returncode == EXIT_INTERRUPTED, err
    job = only_job_dir(tmp_path / "jobs")
    said = [line for line in (out + err).splitlines() if f"job {job.name} cancelled" in line]
    assert said == [f"job {job.name} cancelled on the Prefect server; resume with: {CLI} continue {job}"], out + err
    assert server_state(prefect_api["api_url"], run["id"]) == "Cancelled"
    status = run_cli_here("status", str(job)).stdout
    assert "state:     Cancelled" in status
    assert job.name in run_cli_here("prune", "--state", "Cancelled", "--jobs-dir", str(job.parent)).stdout


def pressed_mid_send(
    tmp_path: Path, write_config: Any, prefect_api: dict[str, Any], fake: Any, state: dict[str, Any]
) -> tuple[dict[str, Any], int, str]:
    """A job sending 20 resources started on the home's server, ``state`` pressed at its fifth request (held);
    its run, exit code and output once it ended, no request sent after its work stopped."""
    config, source = send_job(tmp_path, write_config, fake.base_url, 20)
    home = Path(prefect_api["database"]).parent
    process = home_command("start", str(config), str(source), "--no-progress", home=home)
    run = job_run(tmp_path / "jobs")
    wait_until(lambda: len(fake.state.requests) >= 5, "the send's fifth request, held", timeout=120)
    press(prefect_api["api_url"], run["id"], state)
    stopping(tmp_path / "jobs")
    sent = len(fake.state.requests)
    fake.state.released.set()
    code, said = finished(process)
    assert len(fake.state.requests) == sent
    return run, code, said


def test_a_resume_in_the_ui_runs_a_suspended_command_line_job_to_its_end_with_no_command(
    tmp_path, write_config, prefect_api
):
    """The finding: a Resume sat in Resuming for ever; nothing in the UI said a terminal command was needed."""
    source = tmp_path / "in"
    write_ndjson(source / "data.ndjson", generated(3, "p"))
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    home = Path(prefect_api["database"]).parent
    code, said = finished(home_command("start", str(config), str(source), "--no-progress", home=home))
    assert code == 0 and "awaiting inspection" in said, said
    job = only_job_dir(tmp_path / "jobs")
    run = newest_run(JobPaths(job))
    assert run is not None

    answer = {"run_input": {"confirmed": True, "note": "dates checked"}}
    api(prefect_api["api_url"], "POST", f"/flow_runs/{run['id']}/resume", json=answer)

    wait_until(lambda: server_state(prefect_api["api_url"], run["id"]) == "Completed", "Completed", timeout=60)
    assert released_note(job) == "dates checked"


def test_deleting_a_running_jobs_run_ends_it_at_its_next_batch_in_one_line(tmp_path, write_config, prefect_api):
    """The finding: the process went on to the end, then 76 lines with two tracebacks, exit 1."""
    fake = start_fhir_fake(FhirFakeState(hold_from=5))
    try:
        config, source = send_job(tmp_path, write_config, fake.base_url, 40)
        process = start_cli_process("start", str(config), str(source), "--no-progress")
        run = job_run(tmp_path / "jobs")
        wait_until(lambda: len(fake.state.requests) >= 5, "the send's fifth request, held", timeout=120)

        api(prefect_api["api_url"], "DELETE", f"/flow_runs/{run['id']}")
        fake.state.released.set()
        code, said = finished(process)
    finally:
        fake.stop()

    job = only_job_dir(tmp_path / "jobs")
    assert code == 1 and "Traceback" not in said, said
    assert said.splitlines()[-1] == (
        f"job {job.name} stopped: its flow run was deleted on the Prefect server; the job folder is kept, and "
        f"{CLI} continue {job} makes a new run from it"
    )
    continued = run_cli_here("continue", str(job), "--no-progress")
    assert "its flow run is not on this Prefect server" in continued.stdout


def test_a_suspend_stops_a_job_at_once_and_a_resume_in_the_ui_finishes_it(tmp_path, write_config, prefect_api):
    """The finding: after a Suspend the process kept working and ended "awaiting inspection" (no wait step)."""
    api_url = prefect_api["api_url"]
    fake = start_fhir_fake(FhirFakeState(hold_from=5))
    try:
        until = (datetime.now(UTC) + timedelta(minutes=30)).isoformat()
        details = {"pause_timeout": until, "pause_reschedule": True}
        suspended = {"type": "PAUSED", "name": "Suspended", "state_details": details}
        run, code, said = pressed_mid_send(tmp_path, write_config, prefect_api, fake, suspended)
        assert code == 0
        job = only_job_dir(tmp_path / "jobs")
        (line,) = [line for line in said.splitlines() if line.startswith("Suspended: ")]
        assert line.startswith("Suspended: suspended on the Prefect server until "), said
        assert line.endswith(f"; to go on: Resume in the Prefect UI, or run: {CLI} continue {job}")
        told = api(api_url, "GET", f"/flow_runs/{run['id']}")["state"]
        assert (told["name"], told["message"]) == ("Suspended", line.removeprefix("Suspended: "))

        api(api_url, "POST", f"/flow_runs/{run['id']}/resume", json={})

        wait_until(lambda: server_state(api_url, run["id"]) == "Completed", "Completed", timeout=90, every=0.5)
    finally:
        fake.stop()
    assert {f"{r['resourceType']}/{r['id']}" for r in generated(10, "p")} == set(fake.state.applied)


def test_ctrl_c_on_the_terminal_cancels_the_job_as_a_cancel_does(tmp_path, write_config, prefect_api):
    fake = start_fhir_fake(FhirFakeState(hold_from=5))
    try:
        config, source = send_job(tmp_path, write_config, fake.base_url, 40)
        process = start_cli_process("start", str(config), str(source), "--no-progress")
        run = job_run(tmp_path / "jobs")
        wait_until(lambda: len(fake.state.requests) >= 5, "the send's fifth request, held", timeout=120)

        process.send_signal(signal.SIGINT)
        stopping(tmp_path / "jobs")
        sent = len(fake.state.requests)
        fake.state.released.set()
        code, said = finished(process)
    finally:
        fake.stop()

    job = only_job_dir(tmp_path / "jobs")
    assert code == EXIT_INTERRUPTED and len(fake.state.requests) == sent
    expected = f"job {job.name} interrupted (Ctrl+C or SIGTERM); resume with: {CLI} continue {job}"
    assert [line for line in said.splitlines() if line.startswith(f"job {job.name} ")][-1] == expected, said
    assert server_state(prefect_api["api_url"], run["id"]) == "Cancelled"


def test_a_retry_in_the_ui_runs_a_failed_command_line_job_again_with_no_command(tmp_path, write_config, prefect_api):
    api_url, home = prefect_api["api_url"], Path(prefect_api["database"]).parent
    fake = start_fhir_fake(FhirFakeState(unavailable=1000))
    try:
        config, source = send_job(tmp_path, write_config, fake.base_url, 6)
        code, said = finished(home_command("start", str(config), str(source), "--no-progress", home=home))
        assert code == 1, said
        run = newest_run(JobPaths(only_job_dir(tmp_path / "jobs")))
        assert run is not None
        fake.state.reset()

        press(api_url, run["id"], {"type": "SCHEDULED", "name": "AwaitingRetry"})

        wait_until(lambda: server_state(api_url, run["id"]) == "Completed", "Completed", timeout=90, every=0.5)
    finally:
        fake.stop()
    assert {f"{r['resourceType']}/{r['id']}" for r in generated(3, "p")} == set(fake.state.applied)


def test_a_retry_in_the_ui_right_after_a_cancel_runs_the_job_to_its_end(tmp_path, write_config, prefect_api):
    """The finding: Prefect's events stream replays its last minute to a new subscriber, so the retried run was
    told the Cancel again and ended Cancelled at once."""
    api_url = prefect_api["api_url"]
    fake = start_fhir_fake(FhirFakeState(hold_from=5))
    try:
        cancelling = {"type": "CANCELLING", "name": "Cancelling"}
        run, code, said = pressed_mid_send(tmp_path, write_config, prefect_api, fake, cancelling)
        assert code == EXIT_INTERRUPTED, said

        press(api_url, run["id"], {"type": "SCHEDULED", "name": "AwaitingRetry"})

        wait_until(lambda: server_state(api_url, run["id"]) == "Completed", "Completed", timeout=90, every=0.5)
    finally:
        fake.stop()
    assert {f"{r['resourceType']}/{r['id']}" for r in generated(10, "p")} == set(fake.state.applied)


def test_the_deployment_form_given_a_suspended_jobs_id_finishes_it_in_its_own_run(tmp_path, write_config, prefect_api):
    """The finding: the form finished the job in a second flow run; the first stayed Suspended, Resume live."""
    api_url, home = prefect_api["api_url"], Path(prefect_api["database"]).parent
    source = tmp_path / "in"
    write_ndjson(source / "data.ndjson", generated(3, "p"))
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    code, said = finished(home_command("start", str(config), str(source), "--no-progress", home=home))
    assert code == 0, said
    job = only_job_dir(tmp_path / "jobs")
    run = newest_run(JobPaths(job))
    assert run is not None

    form = {"parameters": {"job_id": job.name, "config_path": str(config), "note": "from the form"}}
    made = api(api_url, "POST", f"/deployments/{run['deployment_id']}/create_flow_run", json=form)

    wait_until(lambda: server_state(api_url, made["id"]) == "Completed", "the form's run ended", timeout=90, every=0.5)
    wait_until(lambda: server_state(api_url, run["id"]) == "Completed", "the job's run ended", timeout=90, every=0.5)
    handed = api(api_url, "GET", f"/flow_runs/{made['id']}")
    assert handed["state"]["message"] == f"job {job.name} goes on in its own flow run {run['id']}"
    assert job.name not in " ".join(handed["tags"])
    assert newest_run(JobPaths(job))["id"] == run["id"]


def test_continue_of_a_killed_job_ends_the_task_runs_its_attempt_left_running(tmp_path, write_config, prefect_api):
    """The finding: a killed attempt's task runs stayed Running for ever, also after the job completed."""
    fake = start_fhir_fake(FhirFakeState(hold_from=3))
    try:
        config, source = send_job(tmp_path, write_config, fake.base_url, 8)
        process = start_cli_process("start", str(config), str(source), "--no-progress")
        run = job_run(tmp_path / "jobs")
        wait_for(lambda: len(fake.state.requests) >= 3 or None, process)
        process.kill()
        process.wait()
        fake.state.reset()
        continued = run_cli_here("continue", str(only_job_dir(tmp_path / "jobs")), "--no-progress")
    finally:
        fake.stop()

    assert continued.returncode == 0, continued.stderr
    body = {"flow_runs": {"id": {"any_": [run["id"]]}}}

    def left_running() -> list[tuple[str, str]]:
        task_runs = api(prefect_api["api_url"], "POST", "/task_runs/filter", json=body)
        return [(t["name"], t["state"]["name"]) for t in task_runs if t["state"]["type"] in ("RUNNING", "PENDING")]

    # The server records task runs' states from their events, a moment after they happen.
    wait_until(lambda: not left_running(), "no task run of the job left Running or Pending", every=0.5)
    task_runs = api(prefect_api["api_url"], "POST", "/task_runs/filter", json=body)
    assert any(t["state"]["name"] == "Crashed" for t in task_runs)


def test_a_cancel_pressed_before_the_runs_watch_is_up_stops_its_work(prefect_api):
    """A Cancel just before the watch's event stream was up was in neither its live events nor (not yet stored)
    their replay: the job's work went on to the step's end (in a CI run an import finished both its files after
    the Cancel)."""
    flow = api(prefect_api["api_url"], "POST", "/flows/", json={"name": "watched"})
    run = api(prefect_api["api_url"], "POST", "/flow_runs/", json={"flow_id": flow["id"]})
    press(prefect_api["api_url"], run["id"], {"type": "RUNNING", "name": "Running"})
    press(prefect_api["api_url"], run["id"], {"type": "CANCELLING", "name": "Cancelling"})

    with stop_watch(UUID(run["id"])) as stop:
        wait_until(lambda: stop.reason is not None, "the job's work stopping", timeout=30)
    assert stop.reason == CANCELLED_ON_SERVER


def pressed_mid_import(
    tmp_path: Path, write_config: Any, prefect_api: dict[str, Any], state: dict[str, Any]
) -> tuple[dict[str, Any], int, str, Path]:
    """A two-file import, both files in work on the step's threads when ``state`` is pressed; its run, exit code,
    output and import folder once it ended."""
    source = source_dir(tmp_path, {"a.ndjson": 300_000, "b.ndjson": 300_000}, pad=400)
    tree = {"pipeline": {"enabled_steps": ["local_import"], "file_batches": {"max_files": 1}}}
    config = write_config(tree | {"compression": {"level": "best"}})
    process = start_cli_process("start", str(config), str(source), "--no-progress")
    run = job_run(tmp_path / "jobs")
    imported = only_job_dir(tmp_path / "jobs") / "import"
    wait_for(lambda: len(list(imported.glob(".*.part"))) == 2 or None, process)

    # held while the button is pressed: the files take a few seconds only
    process.send_signal(signal.SIGSTOP)
    wait_until_stopped(process.pid)
    press(prefect_api["api_url"], run["id"], state)
    process.send_signal(signal.SIGCONT)
    code, said = finished(process)
    return run, code, said, imported


def test_a_cancel_stops_every_file_a_step_works_on_at_once(tmp_path, write_config, prefect_api):
    """The UI's Cancel during a two-file import: the files in work on the step's threads went on to their end, as
    the threads' scope did not hear the run's."""
    cancel = {"type": "CANCELLING", "name": "Cancelling"}
    run, code, said, imported = pressed_mid_import(tmp_path, write_config, prefect_api, cancel)
    assert code == EXIT_INTERRUPTED, said
    assert list(imported.iterdir()) == []  # neither file finished, no temporary file left
    assert server_state(prefect_api["api_url"], run["id"]) == "Cancelled"


def test_a_suspend_stops_every_file_a_step_works_on_at_once_without_a_traceback(tmp_path, write_config, prefect_api):
    """The UI's Suspend during a two-file import: Prefect's ``Pause`` at each file task's end ended the step's
    threads with a traceback each on the terminal, and the step failed with a TypeError on their outcomes."""
    until = (datetime.now(UTC) + timedelta(minutes=30)).isoformat()
    details = {"pause_timeout": until, "pause_reschedule": True}
    suspend = {"type": "PAUSED", "name": "Suspended", "state_details": details}
    run, code, said, imported = pressed_mid_import(tmp_path, write_config, prefect_api, suspend)
    assert code == 0 and "Traceback" not in said and "Exception in thread" not in said, said
    assert "Suspended: suspended on the Prefect server until " in said and list(imported.iterdir()) == []
    assert server_state(prefect_api["api_url"], run["id"]) == "Suspended"
    assert "TypeError" not in (imported.parent / "job.log").read_text()
