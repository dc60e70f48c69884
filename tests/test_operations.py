"""Issue 20, operations a hospital can trust: an inspection that cannot be skipped by accident, a local Prefect
server that stays on its port, an unreachable API said in one line, and a README whose commands run as typed.

The inspection test runs a deployment from ``deployments/prefect.yaml`` on a process work pool against a real
``prefect server start`` on loopback (the fixtures and helpers of ``tests/test_prefect_native.py``); the server
tests start servers of their own in a PREFECT_HOME of their own, on a free port (never 4200 on a shared machine).
"""

from __future__ import annotations

import json

import pytest

from tests.test_prefect_native import (
    FINAL,
    api,
    deployed,  # noqa: F401  (fixture)
    run_log,
    server,  # noqa: F401  (fixture)
    site,  # noqa: F401  (fixture)
    start_worker,
    stop_worker,
    wait_for_run,
    write_patients,
)

# --- 1. inspection cannot be skipped by accident -----------------------------------------------------------------


@pytest.mark.slow
def test_a_resume_without_confirmation_leaves_the_job_suspended_and_runs_nothing_downstream(
    server,  # noqa: F811
    deployed,  # noqa: F811
    site,  # noqa: F811
    running_pseudonymizer,
    tmp_path_factory,
):
    api_url, env = server
    logs = tmp_path_factory.mktemp("worker-logs")
    worker = start_worker(env, logs / "worker.log")
    try:
        run_id = api(
            api_url,
            "POST",
            f"/deployments/{deployed['on-demand']['id']}/create_flow_run",
            json={"parameters": {"config_path": str(site / "job.yaml"), "job_input": str(site / "data")}},
        )["id"]
        run = wait_for_run(api_url, run_id, lambda run: run["state"]["type"] == "PAUSED", worker, logs)
        assert run["state"]["name"] == "Suspended", run["state"]
        job_id, first_suspend = run["name"], run["state"]["id"]
        job_dir = site / "jobs" / job_id
        write_patients(job_dir / "import_wait" / "corrected.ndjson", ["c1"])
        running_pseudonymizer.state.reset()

        # The UI form submitted with its toggle untouched: the run comes back, and is suspended again.
        api(api_url, "POST", f"/flow_runs/{run_id}/resume", json={"run_input": {"confirmed": False, "note": "oops"}})
        run = wait_for_run(
            api_url,
            run_id,
            lambda run: run["state"]["type"] == "PAUSED" and run["state"]["id"] != first_suspend,
            worker,
            logs,
        )
        assert run["state"]["name"] == "Suspended", (run["state"], run_log(api_url, run_id))
        assert not (job_dir / "pseudonymizer").exists() and running_pseudonymizer.state.requests == []
        assert "resumed without confirmation" in run_log(api_url, run_id)
        inspection = api(api_url, "GET", f"/artifacts/job-{job_id}-inspection/latest")["data"]
        assert "resumed without confirmation" in inspection and str(job_dir / "import_wait") in inspection
        assert json.loads((job_dir / "job.json").read_text())["state"] == "Suspended"
        facts = json.loads((job_dir / "facts.json").read_text())
        assert "inspection_01" not in facts and facts["inspection_01_unconfirmed_resumes"] == 1

        # Confirmed: the job goes on past the gate, reading the corrected file.
        api(api_url, "POST", f"/flow_runs/{run_id}/resume", json={"run_input": {"confirmed": True, "note": "ok"}})
        run = wait_for_run(api_url, run_id, lambda run: run["state"]["type"] in FINAL, worker, logs)
    finally:
        stop_worker(worker)
    assert run["state"]["type"] == "COMPLETED", (run["state"], run_log(api_url, run_id))
    assert [p.name for p in (job_dir / "pseudonymizer").iterdir()] == ["corrected.ndjson.zst"]
    assert json.loads((job_dir / "facts.json").read_text())["inspection_01"] == {"confirmed": True, "note": "ok"}
