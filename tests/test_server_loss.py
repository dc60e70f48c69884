"""A job whose Prefect server goes away (kill -9) stops within 30 s in a few lines, recorded Crashed with the
reason, and ``continue`` completes it once the server runs again without redoing finished work: killed during a
download, during flattening and during a send, against a real local Prefect server of its own PREFECT_HOME (the
session's shared server must live on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.prefect_server import ensure_server, read_record, stop_server
from tasks.job.record import COMPLETED, CRASHED, read_record as read_job
from tasks.core.readable import CLI
from tests.conftest import REPO_ROOT, run_cli, seed_prefect_home, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.fhir_server import FhirFakeState, start_fhir_fake
from tests.fakes.flattener import start_flattener
from tests.support.flattening import EXAMPLE, LOOKUP
from tests.support.jobs import only_job_dir
from tests.support.sending import generated, write_ndjson
from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of, wait_until_gone

pytestmark = pytest.mark.slow

NDJSON = b"".join(b'{"resourceType":"Patient","id":"p%d"}\n' % i for i in range(3))
NDJSON_TYPE = {"Content-Type": "application/fhir+ndjson"}
STALL = 120.0  # the file's server answers this late the first time: the job is mid-download when its API goes
STOPPED_WITHIN = 30.0


@pytest.fixture(scope="module")
def own_server(tmp_path_factory, prefect_database):
    """A local Prefect server of a PREFECT_HOME of this module's own (each test kills it and starts it again); its
    home."""
    home = seed_prefect_home(tmp_path_factory.mktemp("prefect-home"), prefect_database)
    with pytest.MonkeyPatch.context() as environment:
        environment.delenv("PREFECT_API_URL", raising=False)
        environment.setenv("PREFECT_HOME", str(home))
        ensure_server(home, startup_timeout=SERVER_TIMEOUT)
        yield home
        stop_server(home)
        kill_servers_of(home)


def start_job(config: Path, *job_input: str, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.run", "start", str(config), *job_input],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def kill_the_server_while(
    job: subprocess.Popen, working: Callable[[], object], home: Path, jobs: Path, stderr: Path
) -> Path:
    """Once the job is ``working``, kill -9 its server: the job stops within 30 s saying so in at most 5 lines, no
    traceback, recorded Crashed with the reason. The server is started again; the job's directory."""
    wait_until(lambda: working() or job.poll() is not None, "the job is at work", timeout=180)
    assert job.poll() is None, stderr.read_text()
    server = read_record(home)
    before = len(stderr.read_text())  # the run's start: the UI's address, Prefect's first lines
    os.killpg(server.pid, signal.SIGKILL)
    killed = time.monotonic()
    job.wait(timeout=120)
    stopped_after = time.monotonic() - killed

    job_dir = only_job_dir(jobs)
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
    ensure_server(home, startup_timeout=SERVER_TIMEOUT)
    return job_dir


def continued(job_dir: Path) -> None:
    resumed = run_cli("continue", job_dir.name, "--jobs-dir", str(job_dir.parent), "--no-progress", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert read_job(job_dir).state == COMPLETED


def imported(job_dir: Path) -> dict[str, int]:
    """The imported files by name, with the time each was written (a step done again writes them anew)."""
    return {path.name: path.stat().st_mtime_ns for path in (job_dir / "import").iterdir()}


def test_killed_during_a_download_it_stops_in_a_few_lines_and_continue_downloads_the_file_once_more(
    tmp_path, write_config, own_server
):
    state = EchoState(replies=[Reply(200, NDJSON_TYPE, NDJSON, delay=STALL), Reply(200, NDJSON_TYPE, NDJSON)])
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}, "compression": {"level": "fastest"}})
    stderr = tmp_path / "stderr.txt"
    with LoopbackServer(EchoHandler, state) as files, stderr.open("w") as terminal:
        job = start_job(config, f"{files.base_url}/Patient.ndjson", stderr=terminal)
        job_dir = kill_the_server_while(job, lambda: state.requests, own_server, tmp_path / "jobs", stderr)
        continued(job_dir)
    assert len(state.requests) == 2


def test_killed_during_flattening_it_stops_in_a_few_lines_and_continue_keeps_the_imported_files(
    tmp_path, write_config, own_server
):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.ndjson").write_bytes((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes())
    flattener = start_flattener()
    flattener.state.drip_header_seconds = STALL  # the first $run never answers
    services = {"local_import": {"dir": tmp_path / "in"}}
    services["flattening"] = {"service_url": flattener.base_url, "lookup_path": LOOKUP}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services})
    stderr = tmp_path / "stderr.txt"
    try:
        with stderr.open("w") as terminal:
            job = start_job(config, str(EXAMPLE / "example-crtdl.json"), stderr=terminal)
            job_dir = kill_the_server_while(job, lambda: flattener.state.runs, own_server, tmp_path / "jobs", stderr)
        before = imported(job_dir)
        flattener.state.reset()
        continued(job_dir)
    finally:
        flattener.stop()
    assert imported(job_dir) == before
    for name in (path.name for path in (EXAMPLE / "expected").iterdir()):
        assert (job_dir / "flattening" / name).read_bytes() == (EXAMPLE / "expected" / name).read_bytes()


def test_killed_during_a_send_it_stops_in_a_few_lines_and_continue_sends_no_batch_twice(
    tmp_path, write_config, own_server
):
    resources = generated(12, "lost")
    write_ndjson(tmp_path / "in" / "core.ndjson", resources)
    fhir = start_fhir_fake(FhirFakeState(hold_from=2))  # the first batch lands, the second waits unanswered
    send = {"send_as": "direct_resource_load", "url": fhir.base_url, "batch_size": 4}
    send["auth"] = {"username": "dupflow", "password": "fhir-password"}
    services = {"local_import": {"dir": tmp_path / "in"}, "send": send}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "send"]}, "services": services})
    stderr = tmp_path / "stderr.txt"
    try:
        with stderr.open("w") as terminal:
            job = start_job(config, stderr=terminal)
            held = lambda: len(fhir.state.requests) >= 2  # noqa: E731
            job_dir = kill_the_server_while(job, held, own_server, tmp_path / "jobs", stderr)
        fhir.state.released.set()
        continued(job_dir)
    finally:
        fhir.state.released.set()
        fhir.stop()
    sent = [f"{r['resourceType']}/{r['id']}" for r in resources]
    assert sorted(fhir.state.applied) == sorted(sent)
    assert set(fhir.state.applied.values()) == {1}, fhir.state.applied  # the first batch was not sent again
