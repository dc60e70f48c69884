"""The Prefect server tells the truth by itself: a job whose process is killed shows Crashed there (within 2 minutes
on a quiet machine), with no dupflow command run in between (Prefect's heartbeats and the automation of
``flows.heartbeats``), and ``continue`` goes on in that same flow run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from flows.heartbeats import AUTOMATION_NAME, ensure_crash_detection
from flows.run import EXIT_OK
from tests.conftest import run_cli, run_cli_here, wait_until
from tests.support.deployments import api
from tests.support.jobs import flow_run_state, job_file, only_job_dir, read_flow_run_state, source_dir
from tests.support.jobs import start_cli_process, wait_for

# The automation fires CRASHED_AFTER_SECONDS (90) after the last heartbeat, and the kill comes right after one: about
# 95 s on a quiet machine (within the 2 minutes asked for). The bound leaves the server's trigger evaluation room on a
# machine loaded four times over (125 s seen there), where a tighter one would fail a test, not the product.
CRASHED_WITHIN_SECONDS = 180
SERVER_POLL_SECONDS = 0.5  # the server is asked this often while it is waited for: not every 0.02 s for 90 s


def heartbeats_of(api_url: str, flow_run_id: str) -> int:
    """The heartbeats of the run the server has recorded."""
    event = {"event": {"name": ["prefect.flow-run.heartbeat"]}, "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}
    return len(api(api_url, "POST", "/events/filter", json={"filter": event})["events"])


def job_run_id(jobs: Path) -> str | None:
    """The flow run of the one job in ``jobs`` once its record names it."""
    records = list(jobs.glob("*/job.json"))
    return (job_file(records[0].parent).get("flow_run_ids") or [None])[-1] if records else None


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_killed_job_shows_crashed_on_the_server_by_itself_and_continue_goes_on_in_its_run(
    tmp_path, write_config, running_pseudonymizer, prefect_api
):
    source = source_dir(tmp_path, {"a.ndjson": 3})
    running_pseudonymizer.state.reset()
    running_pseudonymizer.state.latency_seconds = 600  # the job stays at work in the pseudonymizer until killed
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
            "services": {"pseudonymizer": {"url": running_pseudonymizer.base_url}},
        }
    )
    process = start_cli_process("start", str(config), str(source), "--no-progress")
    jobs = tmp_path / "jobs"
    run_id = wait_for(lambda: job_run_id(jobs), process)
    wait_for(lambda: running_pseudonymizer.state.requests or None, process)
    first_heartbeat = "the run's first heartbeat on the server"
    wait_until(lambda: heartbeats_of(prefect_api["api_url"], run_id) > 0, first_heartbeat, every=SERVER_POLL_SECONDS)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = time.monotonic()
    assert flow_run_state(run_id) == ("RUNNING", "Running")  # nothing of ours told the server

    wait_until(
        lambda: flow_run_state(run_id)[0] == "CRASHED",
        "the server to see the job crashed",
        CRASHED_WITHIN_SECONDS,
        every=SERVER_POLL_SECONDS,
    )
    print(f"Crashed on the server {time.monotonic() - killed:.0f} s after the kill")
    message = read_flow_run_state(run_id).message or ""
    assert "no heartbeat from the job's process" in message and "continue" in message, message
    names = {"automations": {"name": {"any_": [AUTOMATION_NAME]}}}
    automations = api(prefect_api["api_url"], "POST", "/automations/filter", json=names)
    assert len(automations) == 1
    run_made = api(prefect_api["api_url"], "GET", f"/flow_runs/{run_id}")["created"]
    assert automations[0]["created"] < run_made  # made before the run's first heartbeat, which the server must see

    job_dir = only_job_dir(jobs)
    listed = run_cli_here("prune", "--jobs-dir", str(jobs), "--state", "crashed")  # no more "Running on the server"
    assert "would remove 1 job(s)" in listed.stdout and job_dir.name in listed.stdout, listed.stdout + listed.stderr

    running_pseudonymizer.state.latency_seconds = 0
    result = run_cli("continue", str(job_dir), "--no-progress")
    assert result.returncode == EXIT_OK, result.stderr
    record = job_file(job_dir)
    assert record["state"] == "Completed" and record["flow_run_ids"] == [run_id]  # one flow run, start to end
    assert flow_run_state(run_id) == ("COMPLETED", "Completed")


def test_a_server_that_cannot_take_the_crash_automation_is_answered_with_why():
    """The fast tier's API is a closed port: the job would go on, its log saying why a kill may not show Crashed."""
    problem = ensure_crash_detection()
    assert problem is not None and "connect" in problem.lower(), problem
