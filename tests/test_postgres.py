"""Prefect's server on PostgreSQL, as hospitals run it: a real PostgreSQL (Debian's packages) behind the local
server dupflow starts (``PREFECT_API_DATABASE_CONNECTION_URL``); a job from the command line, an inspection round
trip of a deployment run on a process work pool, and ``prune``, each seen in PostgreSQL's own tables."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from config.runtime import CLI
from tests.conftest import REPO_ROOT, run_cli, run_cli_here, wait_until
from tests.support.jobs import made_old
from tests.support.deployments import (
    api,
    local_server,
    run_to_the_gate,
    start_worker,
    stop_worker,
    wait_for_run,
    write_patients,
)
from tests.fakes.flattener import start_flattener
from tests.support.flattening import EXAMPLE, LOOKUP
from tests.support.postgres import query

STALL = 120.0  # the flattening service holds the job's first $run this long: the job is at work when the database goes
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The local server of a fresh PREFECT_HOME on PostgreSQL (it migrates the empty database at its start); the
    deployments' fixtures use this one in this module."""
    home = tmp_path_factory.mktemp("prefect-home")
    with local_server(home, PREFECT_API_DATABASE_CONNECTION_URL=postgres_url) as served:
        assert not (home / "prefect.db").exists()  # the server's database is PostgreSQL, not SQLite in the home
        yield served


def flow_runs_in_postgres(postgres_url: str, job_id: str) -> list[str]:
    rows = query(
        postgres_url,
        "select state_type::text from flow_run where $1 = any(select jsonb_array_elements_text(tags))",
        f"job-{job_id}",
    )
    return [state for (state,) in rows]


def test_a_job_runs_and_is_pruned_against_prefect_on_postgresql(tmp_path, write_config, server, postgres_url):
    _, env = server
    write_patients(tmp_path / "data" / "a.ndjson", ["p1", "p2"])
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})

    started = run_cli("start", str(config), str(tmp_path / "data"), "--no-progress", env=env)

    assert started.returncode == 0, started.stderr
    (job_dir,) = (tmp_path / "jobs").iterdir()
    assert flow_runs_in_postgres(postgres_url, job_dir.name) == ["COMPLETED"]
    made_old(job_dir)
    pruned = run_cli_here("prune", "--jobs-dir", str(tmp_path / "jobs"), "--older-than", "30d", "--yes", env=env)
    assert pruned.returncode == 0 and "removed 1 of 1 job(s)" in pruned.stdout, pruned.stdout + pruned.stderr
    assert flow_runs_in_postgres(postgres_url, job_dir.name) == [] and not job_dir.exists()


def test_an_inspection_round_trip_of_a_deployment_run_on_postgresql(server, deployed, site, postgres_url, tmp_path):
    api_url, env = server
    logs = tmp_path / "logs"
    logs.mkdir()
    worker = start_worker(env, logs / "worker.log")
    try:
        run_id, paused = run_to_the_gate(api_url, deployed, site, worker, logs)
        assert paused["state"]["name"] == "Suspended"
        resumed = api(api_url, "POST", f"/flow_runs/{run_id}/resume", json={"run_input": {"confirmed": True}})
        assert resumed["status"] == "ACCEPT", resumed
        done = wait_for_run(api_url, run_id, lambda run: run["state"]["type"] == "COMPLETED", worker, logs)
    finally:
        stop_worker(worker)
    assert done["state"]["type"] == "COMPLETED"
    (state,) = query(postgres_url, "select state_type::text from flow_run where id = $1::uuid", run_id)
    assert state == ("COMPLETED",)


def test_a_job_whose_postgresql_stops_says_so_in_a_few_lines_and_continue_completes_it(
    tmp_path, write_config, server, postgres
):
    """PostgreSQL stopped under a live server: the job gave up after 19 s in 68 lines, a traceback recorded as a
    ConcurrencySlotAcquisitionError. It now stops as for a lost server (the API watch reads the server's /ready):
    a few lines naming the database and the command that resumes it, which completes the job once it is back."""
    _, env = server
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.ndjson").write_bytes((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes())
    flattener = start_flattener(drip_header_seconds=STALL)  # holds the first $run: the job is at work
    services = {"local_import": {"dir": tmp_path / "in"}}
    services["flattening"] = {"service_url": flattener.base_url, "lookup_path": LOOKUP}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services})
    command = [sys.executable, "-m", "flows.run", "start", str(config), str(EXAMPLE / "example-crtdl.json")]
    terminal = tmp_path / "terminal.txt"
    with terminal.open("w") as stderr:
        job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_until(lambda: flattener.state.runs or job.poll() is not None, "the job is at work", timeout=180)
        assert job.poll() is None, terminal.read_text()
        before = len(terminal.read_text())
        postgres.stop()
        try:
            job.wait(timeout=120)
        finally:
            postgres.start()
        said = terminal.read_text()[before:]
        lines = said.strip().splitlines()
        (job_dir,) = (tmp_path / "jobs").iterdir()
        assert job.returncode == 1 and "Traceback" not in said and len(lines) <= 5, said
        lost = f"the Prefect server at {env['PREFECT_API_URL']} lost its database (not available for 10 s)"
        assert lines[-2] == f"job {job_dir.name} stopped: {lost}"
        assert lines[-1] == f"when the server's database runs again, resume with: {CLI} continue {job_dir}"
        flattener.state.reset()
        resumed = run_cli("continue", job_dir.name, "--jobs-dir", str(job_dir.parent), "--no-progress", env=env)
        assert resumed.returncode == 0, resumed.stderr
    finally:
        job.kill()
        flattener.stop()
    for name in (path.name for path in (EXAMPLE / "expected").iterdir()):
        assert (job_dir / "flattening" / name).read_bytes() == (EXAMPLE / "expected" / name).read_bytes()
