"""A job whose Prefect server goes away (kill -9) stops within 30 s in a few lines, recorded Crashed with the
reason, and ``continue`` completes it once the server runs again; against a real local Prefect server of its own
PREFECT_HOME (the session's shared server must live on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from flows.prefect_server import ensure_server, read_record, stop_server
from tasks.job.record import COMPLETED, CRASHED, read_record as read_job
from tasks.core.readable import CLI
from tests.conftest import REPO_ROOT, run_cli, seed_prefect_home, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.support.jobs import only_job_dir
from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of, wait_until_gone

pytestmark = pytest.mark.slow

NDJSON = b"".join(b'{"resourceType":"Patient","id":"p%d"}\n' % i for i in range(3))
NDJSON_TYPE = {"Content-Type": "application/fhir+ndjson"}
STALL = 120.0  # the file's server answers this late the first time: the job is mid-download when its API goes
STOPPED_WITHIN = 30.0


@pytest.fixture
def own_server(tmp_path, monkeypatch, prefect_database):
    """A local Prefect server of a PREFECT_HOME of this test's own; its home."""
    home = seed_prefect_home(tmp_path / "prefect-home", prefect_database)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    ensure_server(home, startup_timeout=SERVER_TIMEOUT)
    yield home
    stop_server(home)
    kill_servers_of(home)


def test_a_job_whose_server_is_killed_stops_in_a_few_lines_and_continue_completes_it(
    tmp_path, write_config, own_server
):
    state = EchoState(replies=[Reply(200, NDJSON_TYPE, NDJSON, delay=STALL), Reply(200, NDJSON_TYPE, NDJSON)])
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}, "compression": {"level": "fastest"}})
    stderr = tmp_path / "stderr.txt"
    with LoopbackServer(EchoHandler, state) as files, stderr.open("w") as terminal:
        job = subprocess.Popen(
            [sys.executable, "-m", "flows.run", "start", str(config), f"{files.base_url}/Patient.ndjson"],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=terminal,
        )
        wait_until(lambda: state.requests or job.poll() is not None, "the download began", timeout=180)
        assert job.poll() is None, stderr.read_text()

        server = read_record(own_server)
        before = len(stderr.read_text())  # the run's start: the UI's address, Prefect's first lines
        os.killpg(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        job.wait(timeout=120)
        stopped_after = time.monotonic() - killed

        job_dir = only_job_dir(tmp_path / "jobs")
        said = stderr.read_text()[before:]
        assert job.returncode == 1, said
        assert stopped_after <= STOPPED_WITHIN, f"stopped {stopped_after:.0f} s after the kill"
        lines = said.strip().splitlines()
        assert len(lines) <= 5 and "Traceback" not in said, said
        assert f"job {job_dir.name} stopped: the Prefect server at {server.url} went away" in said
        assert lines[-1] == f"when the server runs again, resume with: {CLI} continue {job_dir.name}"
        record = read_job(job_dir)
        assert record.state == CRASHED and "went away" in record.state_message

        wait_until_gone(server.pid)
        ensure_server(own_server, startup_timeout=SERVER_TIMEOUT)
        resumed = run_cli("continue", job_dir.name, "--jobs-dir", str(tmp_path / "jobs"), "--no-progress", timeout=300)

    assert resumed.returncode == 0, resumed.stderr
    assert read_job(job_dir).state == COMPLETED
    assert len(state.requests) == 2
