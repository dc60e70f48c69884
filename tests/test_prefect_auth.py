"""A shared Prefect server with access control (``PREFECT_SERVER_API_AUTH_STRING`` on the server,
``PREFECT_API_AUTH_STRING`` on its clients): the command line's jobs, ``status``, ``list`` and ``prune``, and a
worker's deployment runs work against it and never show the credential."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_cli, run_cli_here, seed_prefect_home, wait_until
from tests.support.jobs import made_old
from tests.support.deployments import (
    deploy,
    local_server,
    run_log,
    start_run,
    start_worker,
    stop_worker,
    wait_for_run,
    write_patients,
)

pytestmark = pytest.mark.slow
AUTH_STRING = "dupflow-admin:Auth-Str1ng-4711"
SHOWN = ("Auth-Str1ng-4711", base64.b64encode(AUTH_STRING.encode()).decode())  # the credential, as sent


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, prefect_database: Path) -> Iterator[tuple[str, dict[str, str]]]:
    home = seed_prefect_home(tmp_path_factory.mktemp("prefect-home"), prefect_database)
    credentials = {"PREFECT_SERVER_API_AUTH_STRING": AUTH_STRING, "PREFECT_API_AUTH_STRING": AUTH_STRING}
    with local_server(home, **credentials) as served:
        yield served


def test_jobs_status_list_and_prune_work_against_a_server_with_an_auth_string(tmp_path, write_config, guarded):
    api_url, env = guarded
    assert httpx.post(f"{api_url}/flow_runs/filter", json={}).status_code == 401  # the server is guarded
    write_patients(tmp_path / "data" / "a.ndjson", ["p1", "p2"])
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})

    started = run_cli("start", str(config), str(tmp_path / "data"), "--no-progress", env=env)
    assert started.returncode == 0, started.stderr
    (job_dir,) = (tmp_path / "jobs").iterdir()
    status = run_cli_here("status", str(job_dir), env=env)
    listed = run_cli_here("list", "--jobs-dir", str(tmp_path / "jobs"), env=env)
    made_old(job_dir)
    pruned = run_cli_here("prune", "--jobs-dir", str(tmp_path / "jobs"), "--older-than", "30d", "--yes", env=env)

    assert "state:     Completed" in status.stdout and job_dir.name in listed.stdout, status.stdout + listed.stdout
    assert pruned.returncode == 0 and f"removed {job_dir.name} (1 flow run(s)" in pruned.stdout, pruned.stdout
    assert not job_dir.exists()
    said = "".join(done.stdout + done.stderr for done in (started, status, listed, pruned))
    assert not [shown for shown in SHOWN if shown in said]
    assert not list((tmp_path / "jobs").iterdir())


def test_a_worker_runs_a_deployment_run_to_its_end_against_a_server_with_an_auth_string(
    tmp_path, write_config, guarded
):
    """``prefect deploy``, ``prefect worker start`` with the client's environment, and the run it starts (its
    flow's own calls to the API: job name and tag, job record, logs) all get through, and none shows the
    credential."""
    api_url, env = guarded
    deployed = deploy(api_url, env)
    write_patients(tmp_path / "data" / "a.ndjson", ["p1", "p2"])
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(env, logs / "worker.log")
    try:
        run_id = start_run(api_url, deployed, config, tmp_path / "data", env)
        run = wait_for_run(api_url, run_id, lambda run: False, worker, logs, env)
        # The flow's process writes its console log through the worker, the same records reach the API in batches:
        # its last one (the flow's end) is waited for in both.
        ending = f"Flow run '{run_id}' - Finished in state"
        wait_until(lambda: ending in (logs / "worker.log").read_text(), "the flow's end in the worker log")
        (last,) = [line for line in (logs / "worker.log").read_text().splitlines() if ending in line]
        last = last.split(f"Flow run '{run_id}' - ", 1)[1]
        wait_until(lambda: last in run_log(api_url, run_id, env), "the flow's end in the run's log", every=0.25)
    finally:
        stop_worker(worker)

    log = run_log(api_url, run_id, env)
    assert run["state"]["type"] == "COMPLETED", (run["state"], log)
    assert run["name"] == run_id and f"job-{run_id}" in run["tags"], "the job's name and tag: the flow's own calls"
    job_dir = tmp_path / "jobs" / run_id
    assert (job_dir / "import" / "a.ndjson.zst").is_file()
    said = {"worker log": (logs / "worker.log").read_text(), "run log": log, "run state": json.dumps(run)}
    said |= {str(path): path.read_text(errors="replace") for path in job_dir.rglob("*") if path.is_file()}
    assert not [(where, shown) for where, text in said.items() for shown in SHOWN if shown in text]


def test_the_server_side_login_alone_starts_the_home_server_and_a_wrong_one_never_stops_it(tmp_path):
    """The finding: ``server start`` waited 123 s, then said the server did not come up though it did; a client
    with a wrong login terminated the home's running server, started another and hung."""
    home = tmp_path / "home"
    server_side = {"PREFECT_HOME": str(home), "PREFECT_API_URL": "", "PREFECT_SERVER_API_AUTH_STRING": AUTH_STRING}
    try:
        started = run_cli("server", "start", env=server_side, timeout=180)
        assert started.returncode == 0 and "Prefect UI: " in started.stdout, started.stderr
        pid = json.loads((home / "dupflow-server.json").read_text())["pid"]
        assert run_cli_here("list", "--jobs-dir", str(tmp_path), env=server_side).returncode == 0

        for login in ("dupflow-admin:wrong", ""):
            client = {"PREFECT_HOME": str(home), "PREFECT_API_URL": "", "PREFECT_API_AUTH_STRING": login}
            refused = run_cli("server", "start", env=client, timeout=60)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            (line,) = refused.stderr.strip().splitlines()[-1:]
            assert "refuses this command's login (HTTP 401): set PREFECT_API_AUTH_STRING" in line, refused.stderr
            assert json.loads((home / "dupflow-server.json").read_text())["pid"] == pid
    finally:
        run_cli("server", "stop", env=server_side)
