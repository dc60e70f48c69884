"""A real Prefect server with this repository's deployments on a process work pool, as a user sets it up; its REST
API, workers and runs: for the tests of deployments and of operations against them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from config.runtime import prefect_api_headers
from flows.prefect_server import ensure_server, stop_server
from tests.conftest import REPO_ROOT, seed_prefect_home
from tests.support.prefect_servers import kill_servers_of

POOL = "dupflow"  # the work pool deployments/prefect.yaml names
SERVER_TIMEOUT = 240.0
TIMEOUT = 180.0


@contextmanager
def local_server(home: Path, **settings: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The local server of ``home`` (with these Prefect ``settings`` in its environment), stopped at the end; its API
    URL and the environment for its clients."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        monkeypatch.setenv("PREFECT_HOME", str(home))
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
        api_url = ensure_server(home, startup_timeout=SERVER_TIMEOUT)
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    env |= {
        **settings,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PYTHONPATH": str(REPO_ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
    }
    try:
        yield api_url, env
    finally:
        stop_server(home)
        kill_servers_of(home)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, prefect_database: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real Prefect server in a PREFECT_HOME of its own; its API URL and the environment for its clients."""
    with local_server(seed_prefect_home(tmp_path_factory.mktemp("prefect-home"), prefect_database)) as served:
        yield served


@pytest.fixture(scope="module")
def deployed(server) -> dict[str, dict[str, Any]]:
    """This repository's deployments on the module's server (``deploy``)."""
    return deploy(*server)


def deploy(api_url: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``prefect work-pool create`` and ``prefect deploy --all`` from the repository root, as the client ``env``;
    the deployments by name."""
    prefect("work-pool", "create", POOL, "--type", "process", env=env)
    prefect("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml", env=env)
    names = ("nightly-sample", "on-demand")
    deployments = {name: api(api_url, "GET", f"/deployments/name/dupflow/{name}", env=env) for name in names}
    # The nightly schedule must not fire a sample job into the repository while the tests run.
    api(api_url, "PATCH", f"/deployments/{deployments['nightly-sample']['id']}", env=env, json={"paused": True})
    return deployments


@pytest.fixture
def site(tmp_path: Path, running_pseudonymizer, write_config) -> Path:
    """A configuration for ``local_import → wait → pseudonymizer`` (paths relative to it) and data to import."""
    (tmp_path / "data").mkdir()
    write_patients(tmp_path / "data" / "a.ndjson", ["p1", "p2"])
    write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "wait", "pseudonymizer"]},
            "jobs_dir": "./jobs",
            "services": {"pseudonymizer": {"url": running_pseudonymizer.base_url}},
        },
        tmp_path / "job.yaml",
    )
    return tmp_path


FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def write_patients(path: Path, ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"resourceType": "Patient", "id": i}) + "\n" for i in ids))


def prefect(*args: str, env: dict[str, str]) -> None:
    """A ``prefect`` command run from the repository root, as the README tells a user to."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def api(api_url: str, method: str, path: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
    """One REST call with the credentials Prefect's client sends from the client environment ``env`` (none without
    it); a 503 (the SQLite database busy on a loaded machine) is retried, as Prefect's client does."""
    headers = prefect_api_headers(env or {})
    for attempt in range(5):
        response = httpx.request(method, f"{api_url}{path}", headers=headers, timeout=30, **kwargs)
        if response.status_code != 503:
            break
        time.sleep(0.5 * 2**attempt)
    assert response.is_success, f"{method} {path}: {response.status_code} {response.text}"
    return response.json() if response.content else None


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    """``prefect worker start --pool dupflow`` from the repository root, in a process group of its own."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_worker(worker: subprocess.Popen) -> None:
    """kill -9 of the worker and everything it started: nothing may depend on it ending cleanly."""
    with suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(30)


def run_to_the_gate(
    api_url: str, deployed: dict, site: Path, worker: subprocess.Popen, logs: Path
) -> tuple[str, dict[str, Any]]:
    """A run of the on-demand deployment on the site's data, once it is paused at its wait step: its id and run."""
    run_id = start_run(api_url, deployed, site / "job.yaml", site / "data")
    return run_id, wait_for_run(api_url, run_id, lambda run: run["state"]["type"] == "PAUSED", worker, logs)


def start_run(api_url: str, deployed: dict, config: Path, job_input: Path, env: Mapping[str, str] | None = None) -> str:
    """A run of the on-demand deployment, created as the UI's Run dialog does: its id."""
    parameters = {"config_path": str(config), "job_input": str(job_input)}
    path = f"/deployments/{deployed['on-demand']['id']}/create_flow_run"
    return api(api_url, "POST", path, env=env, json={"parameters": parameters})["id"]


def wait_for_run(
    api_url: str,
    run_id: str,
    done: Callable[[dict], bool],
    worker: subprocess.Popen,
    logs: Path,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        assert worker.poll() is None, "the worker ended:\n" + "\n".join(p.read_text() for p in logs.iterdir())
        run = api(api_url, "GET", f"/flow_runs/{run_id}", env=env)
        if done(run) or run["state"]["type"] in FINAL:
            return run
        time.sleep(0.5)
    raise AssertionError(f"flow run {run_id} stayed {run['state']}:\n{run_log(api_url, run_id, env)}")


def run_log(api_url: str, run_id: str, env: Mapping[str, str] | None = None) -> str:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    logs = api(api_url, "POST", "/logs/filter", env=env, json=body)
    return "\n".join(f"{entry['level']} {entry['message']}" for entry in logs)
