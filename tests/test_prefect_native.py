"""Issue 12 acceptance: a deployment from ``deployments/prefect.yaml`` on a process work pool, inspected and resumed.

Against a real ``prefect server start`` on loopback, as a user would do it from a clean clone: create the process
pool, ``prefect deploy --all`` from the repository root, start a worker, trigger a ``local_import → wait →
pseudonymizer`` job from the ``on-demand`` deployment. The run suspends at the wait step (its process ends) with the
inspection artifact and log line; the worker is killed and started again; a corrected file goes into the ``_wait``
folder; the run is resumed through the REST API (the call the inspection artifact shows, with the run's id) with
the form's input, and completes reading that folder without suspending again or running the gate's task again. A
new job takes the run's id: it is the run's name from the flow's first log line, and its tag throughout.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.ndjson import iter_resources
from tests.conftest import REPO_ROOT, run_cli, run_cli_here
from tests.support.deployments import (
    FINAL,
    POOL,
    TIMEOUT,
    api,
    run_log,
    run_to_the_gate,
    start_worker,
    stop_worker,
    wait_for_run,
    write_patients,
)

pytestmark = pytest.mark.slow

PARAMETERS = ("job_id", "config_path", "job_input", "overrides")


def test_deployments_from_prefect_yaml_have_a_schedule_and_a_described_parameter_form(deployed):
    nightly = deployed["nightly-sample"]
    (schedule,) = nightly["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *"
    assert schedule["schedule"]["timezone"] == "Europe/Berlin"
    assert nightly["work_pool_name"] == POOL
    assert nightly["description"]
    assert nightly["parameters"]["config_path"] == "config/default.yaml"
    for deployment in deployed.values():
        properties = deployment["parameter_openapi_schema"]["properties"]
        for name in PARAMETERS:
            assert properties[name].get("description"), f"{deployment['name']}: {name} has no description"


def test_the_nightly_deployment_runs_the_sample_job_from_its_parameter_defaults(server, deployed, tmp_path):
    api_url, env = server
    pull = deployed["nightly-sample"]["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]
    assert pull["directory"] == str(REPO_ROOT), "runs start in the directory prefect deploy ran in"
    (tmp_path / "logs").mkdir()
    worker = start_worker(env, tmp_path / "logs" / "worker.log")
    try:
        run_id = api(
            api_url,
            "POST",
            f"/deployments/{deployed['nightly-sample']['id']}/create_flow_run",
            json={"parameters": {"overrides": {"jobs_dir": str(tmp_path / "jobs")}}},
        )["id"]
        run = wait_for_run(api_url, run_id, lambda run: False, worker, tmp_path / "logs")
    finally:
        stop_worker(worker)
    assert run["state"]["type"] == "COMPLETED", (run["state"], run_log(api_url, run_id))
    job_dir = tmp_path / "jobs" / run["name"]
    assert f"job-{run['name']}" in run["tags"]
    assert sorted(p.name for p in (job_dir / "import").iterdir()) == sorted(
        p.name + ".zst" for p in (REPO_ROOT / "config" / "sample-data").glob("*.ndjson")
    )
    assert list((job_dir / "flattening").rglob("*.csv")), "the sample flattens to CSV"


def test_a_suspended_job_survives_a_worker_restart_and_resumes_with_the_form_reading_the_wait_folder(
    server, deployed, site, running_pseudonymizer, tmp_path_factory
):
    api_url, env = server
    logs = tmp_path_factory.mktemp("worker-logs")
    worker = start_worker(env, logs / "first.log")
    try:
        run_id, run = run_to_the_gate(api_url, deployed, site, worker, logs)
        assert run["state"]["name"] == "Suspended", run["state"]
        job_id = run["name"]
        assert job_id == run_id and f"job-{job_id}" in run["tags"], "a new job takes its flow run's id"
        assert f"Beginning flow run '{job_id}'" in run_log(api_url, run_id), "named after the job from its first line"
        job_dir = site / "jobs" / job_id
        wait_dir = job_dir / "import_wait"
        inspection = api(api_url, "GET", f"/artifacts/job-{job_id}-inspection/latest")["data"]
        assert str(job_dir / "import") in inspection and str(wait_dir) in inspection
        assert "Resume in the Prefect UI" in inspection
        assert f"continue {job_id}" in inspection or f"continue {job_dir}" in inspection  # by the worker's jobs dir
        assert str(wait_dir) in run_log(api_url, run_id)
        record = api(api_url, "GET", f"/artifacts/job-{job_id}/latest")["data"]
        assert "awaiting inspection" in record and "failed:" not in record, record  # a suspend is no failure
        expires = datetime.fromisoformat(run["state"]["state_details"]["pause_timeout"])
        assert timedelta(days=6, hours=23) < expires - datetime.now(UTC) <= timedelta(days=7), expires
        assert r"\(pipeline.wait\_timeout\)" in record and f"until {expires:%Y-%m-%d}" in record, record  # Markdown
        assert wait_for_exit_of_flow_processes(worker)
    finally:
        stop_worker(worker)

    write_patients(wait_dir / "corrected.ndjson", ["c1", "c2", "c3"])
    worker = start_worker(env, logs / "second.log")
    try:
        refuse_a_resume_without_confirmation(api_url, run_id, job_dir, running_pseudonymizer)
        note = "checked 2 patients, added 1"
        api(api_url, "POST", f"/flow_runs/{run_id}/resume", json={"run_input": {"confirmed": True, "note": note}})
        run = wait_for_run(api_url, run_id, lambda run: run["state"]["type"] in FINAL, worker, logs)
    finally:
        stop_worker(worker)

    assert run["state"]["type"] == "COMPLETED", (run["state"], run_log(api_url, run_id))
    assert run["name"] == job_id and f"job-{job_id}" in run["tags"]
    log = run_log(api_url, run_id)
    assert log.count("Suspending flow run") == 1, "a resumed run does not suspend again: " + log
    waits = [name for name in task_run_names(api_url, run_id) if name.startswith("wait[")]
    assert len(waits) == 2, "the gate's task runs when it pauses, and once more when it is released"
    assert log.count("is paused for inspection") == 1, "what to inspect is published once: " + log
    outputs = sorted((job_dir / "pseudonymizer").iterdir())
    assert [p.name for p in outputs] == ["corrected.ndjson.zst"]
    assert len(list(iter_resources(outputs[0], 1 << 20))) == 3
    status = run_cli("status", job_id, "--jobs-dir", str(site / "jobs"), env=env).stdout
    assert "2. wait: done, 1 file" in status and f"inspection note: {note}" in status, status
    record = api(api_url, "GET", f"/artifacts/job-{job_id}/latest")["data"]
    assert "pseudonymizer" in record and note in record
    assert [p.name for p in (site / "jobs").iterdir()] == [job_id], "the resumed run must not start a new job"


def refuse_a_resume_without_confirmation(api_url: str, run_id: str, job_dir: Path, pseudonymizer) -> None:
    """The UI form submitted with its toggle untouched, or no form at all, with a worker running (issue 20): refused
    in the answer itself, and the run stays suspended."""
    suspended = api(api_url, "GET", f"/flow_runs/{run_id}")["state"]["id"]
    pseudonymizer.state.reset()
    for body in ({"run_input": {"confirmed": False, "note": "oops"}}, {"run_input": {"note": "oops"}}, {}):
        answer = api(api_url, "POST", f"/flow_runs/{run_id}/resume", json=body)
        assert answer["status"] == "REJECT" and "confirmed" in answer["details"]["reason"], (body, answer)
        run = api(api_url, "GET", f"/flow_runs/{run_id}")
        assert run["state"]["id"] == suspended and run["state"]["name"] == "Suspended", run["state"]
    assert not (job_dir / "pseudonymizer").exists() and pseudonymizer.state.requests == []


def test_a_suspended_run_cancelled_in_the_ui_shows_cancelled_everywhere_and_continue_runs_the_job_here(
    server, deployed, site, tmp_path_factory
):
    api_url, env = server
    logs = tmp_path_factory.mktemp("worker-logs")
    worker = start_worker(env, logs / "worker.log")
    try:
        run_id, run = run_to_the_gate(api_url, deployed, site, worker, logs)
    finally:
        stop_worker(worker)
    job_id, jobs = run["name"], str(site / "jobs")
    assert "state:     Suspended" in run_cli_here("status", job_id, "--jobs-dir", jobs, env=env).stdout

    # Cancelled in the UI: no process of ours is behind a suspended run, so the server's word settles it.
    api(api_url, "POST", f"/flow_runs/{run_id}/set_state", json={"state": {"type": "CANCELLED"}, "force": True})
    assert "state:     Cancelled" in run_cli_here("status", job_id, "--jobs-dir", jobs, env=env).stdout
    assert f"{job_id}  Cancelled" in run_cli_here("list", "--jobs-dir", jobs, env=env).stdout

    continued = run_cli("continue", job_id, "--jobs-dir", jobs, "--no-progress", "--note", "seen", env=env)
    assert continued.returncode == 0, continued.stderr
    status = run_cli("status", job_id, "--jobs-dir", jobs, env=env).stdout
    assert f"state:     Completed (flow run {run_id})" in status and "inspection note: seen" in status, status
    # the job's one run went on here, its history showing the cancel
    assert api(api_url, "GET", f"/flow_runs/{run_id}")["state"]["type"] == "COMPLETED"


# --- helpers ---------------------------------------------------------------------------------------------------


def wait_for_exit_of_flow_processes(worker: subprocess.Popen) -> bool:
    """A suspended run holds no process: the worker's flow-run child ends (bounded wait)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if not children_of(worker.pid):
            return True
        time.sleep(0.2)
    return False


def children_of(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def task_run_names(api_url: str, run_id: str) -> list[str]:
    """The names of the flow run's task runs, every execution of it included (a resumed run starts from the top)."""
    runs = api(api_url, "POST", "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}, "limit": 200})
    return [run["name"] for run in runs]
