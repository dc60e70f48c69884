"""A shared Prefect server with access control (``PREFECT_SERVER_API_AUTH_STRING`` on the server,
``PREFECT_API_AUTH_STRING`` on its clients): the command line's jobs, ``status``, ``list`` and ``prune`` work
against it and never show the credential."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import run_cli, seed_prefect_home
from tests.support.deployments import local_server, write_patients

pytestmark = pytest.mark.slow
AUTH_STRING = "dupflow-admin:Auth-Str1ng-4711"


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
    status = run_cli("status", str(job_dir), env=env)
    listed = run_cli("list", "--jobs-dir", str(tmp_path / "jobs"), env=env)
    record = json.loads((job_dir / "job.json").read_text())
    (job_dir / "job.json").write_text(json.dumps({**record, "updated_at": "2026-01-01T00:00:00+00:00"}))
    pruned = run_cli("prune", "--jobs-dir", str(tmp_path / "jobs"), "--older-than", "30d", "--yes", env=env)

    assert "state:     Completed" in status.stdout and job_dir.name in listed.stdout, status.stdout + listed.stdout
    assert pruned.returncode == 0 and f"removed {job_dir.name} (1 flow run(s)" in pruned.stdout, pruned.stdout
    assert not job_dir.exists()
    said = "".join(done.stdout + done.stderr for done in (started, status, listed, pruned))
    assert "Auth-Str1ng-4711" not in said and base64.b64encode(AUTH_STRING.encode()).decode() not in said
    assert not list((tmp_path / "jobs").iterdir())
