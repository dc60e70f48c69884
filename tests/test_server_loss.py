"""A job whose Prefect server goes away (kill -9) stops within 30 s in a few lines, recorded Crashed with the
reason, and ``continue`` completes it once the server runs again without redoing finished work: three jobs, one
during a download, one during flattening and one during a send, lose one real local Prefect server of their own
PREFECT_HOME (the session's shared server must live on) at the same moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from flows.prefect_server import ensure_server, read_record, stop_server
from config.runtime import CLI
from tests.conftest import REPO_ROOT, plain, run_cli, seed_prefect_home, wait_until
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
TERMINAL_LINE = 250  # the longest line: Prefect's event client once printed a whole event (2.9 kB) on one


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


@dataclass
class LostJob:
    """A job started in ``folder`` and stopped by the loss of its server; ``job_dir`` once it has stopped."""

    folder: Path
    process: subprocess.Popen
    working: Callable[[], object]
    job_dir: Path | None = None

    @property
    def stderr(self) -> Path:
        return self.folder / "stderr.txt"


def launch(stack: ExitStack, folder: Path, tree: dict, working: Callable[[], object], *job_input: str) -> LostJob:
    """Start the job of configuration ``tree`` (its jobs in ``folder/jobs``); ``working`` tells it is at work."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(plain({"jobs_dir": folder / "jobs", **tree})), encoding="utf-8")
    terminal = stack.enter_context((folder / "stderr.txt").open("w"))
    job = LostJob(folder, start_job(config, *job_input, stderr=terminal), working)
    stack.callback(job.process.kill)  # a job a failed check left running (a stopped one: nothing to do)
    return job


def kill_the_server_under(jobs: list[LostJob], home: Path) -> None:
    """Once every job is at work, kill -9 their server: each stops within 30 s saying so in at most 5 lines, none
    longer than a wide terminal's, no traceback, recorded Crashed with the reason. The server is started again."""
    for job in jobs:
        wait_until(lambda job=job: job.working() or job.process.poll() is not None, "the job is at work", timeout=180)
        assert job.process.poll() is None, job.stderr.read_text()
    server = read_record(home)
    before = [len(job.stderr.read_text()) for job in jobs]  # each run's start: the UI's address, Prefect's lines
    os.kill(server.pid, signal.SIGKILL)  # its main process alone (it has no other): no one tells the clients
    killed = time.monotonic()
    for job, start in zip(jobs, before, strict=True):
        job.process.wait(timeout=120)
        stopped_after = time.monotonic() - killed
        job.job_dir = job_dir = only_job_dir(job.folder / "jobs")
        said = job.stderr.read_text()[start:]
        assert job.process.returncode == 1, said
        assert stopped_after <= STOPPED_WITHIN, f"stopped {stopped_after:.0f} s after the kill"
        lines = said.strip().splitlines()
        assert len(lines) <= 5 and "Traceback" not in said, said
        assert max(map(len, lines)) <= TERMINAL_LINE and "prefect.events" not in said, said  # noise: job.log
        assert f"job {job_dir.name} stopped: the Prefect server at {server.url} went away" in said
        assert lines[-1] == f"when the server runs again, resume with: {CLI} continue {job_dir}"
    wait_until_gone(server.pid)
    ensure_server(home, startup_timeout=SERVER_TIMEOUT)


@dataclass
class Lost:
    """The three jobs, stopped, and the services they were using (still running)."""

    download: LostJob
    files: EchoState
    flattening: LostJob
    flattener: LoopbackServer
    imported: dict[str, int]
    send: LostJob
    fhir: LoopbackServer
    resources: list[dict]


@pytest.fixture(scope="module")
def lost(own_server, tmp_path_factory) -> Iterator[Lost]:
    with ExitStack() as stack:
        state = EchoState(replies=[Reply(200, NDJSON_TYPE, NDJSON, delay=STALL), Reply(200, NDJSON_TYPE, NDJSON)])
        files = stack.enter_context(LoopbackServer(EchoHandler, state))
        tree = {"pipeline": {"enabled_steps": ["http_import"]}, "compression": {"level": "fastest"}}
        download = launch(
            stack, tmp_path_factory.mktemp("download"), tree, lambda: state.requests, f"{files.base_url}/Patient.ndjson"
        )
        flattener, flattening = flattening_job(stack, tmp_path_factory.mktemp("flattening"))
        fhir, send, resources = send_job(stack, tmp_path_factory.mktemp("send"))
        kill_the_server_under([download, flattening, send], own_server)
        yield Lost(download, state, flattening, flattener, imported(flattening.job_dir), send, fhir, resources)


def flattening_job(stack: ExitStack, folder: Path) -> tuple[LoopbackServer, LostJob]:
    """A job whose flattening service never answers its first ``$run``."""
    (folder / "in").mkdir()
    (folder / "in" / "data.ndjson").write_bytes((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes())
    flattener = start_flattener()
    stack.callback(flattener.stop)
    flattener.state.drip_header_seconds = STALL
    services = {"local_import": {"dir": folder / "in"}}
    services["flattening"] = {"service_url": flattener.base_url, "lookup_path": LOOKUP}
    tree = {"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services}
    return flattener, launch(stack, folder, tree, lambda: flattener.state.runs, str(EXAMPLE / "example-crtdl.json"))


def send_job(stack: ExitStack, folder: Path) -> tuple[LoopbackServer, LostJob, list[dict]]:
    """A job whose FHIR server takes the first batch and holds the second unanswered."""
    resources = generated(12, "lost")
    write_ndjson(folder / "in" / "core.ndjson", resources)
    fhir = start_fhir_fake(FhirFakeState(hold_from=2))
    stack.callback(fhir.stop)
    stack.callback(fhir.state.released.set)
    send = {"send_as": "direct_resource_load", "url": fhir.base_url, "batch_size": 4}
    send["auth"] = {"username": "dupflow", "password": "fhir-password"}
    tree = {
        "pipeline": {"enabled_steps": ["local_import", "send"]},
        "services": {"local_import": {"dir": folder / "in"}, "send": send},
    }
    return fhir, launch(stack, folder, tree, lambda: len(fhir.state.requests) >= 2), resources


def continued(job_dir: Path) -> None:
    resumed = run_cli("continue", job_dir.name, "--jobs-dir", str(job_dir.parent), "--no-progress", timeout=300)
    assert resumed.returncode == 0 and "Completed: " in resumed.stdout, resumed.stdout + resumed.stderr


def imported(job_dir: Path) -> dict[str, int]:
    """The imported files by name, with the time each was written (a step done again writes them anew)."""
    return {path.name: path.stat().st_mtime_ns for path in (job_dir / "import").iterdir()}


def test_killed_during_a_download_it_stops_in_a_few_lines_and_continue_downloads_the_file_once_more(lost):
    continued(lost.download.job_dir)
    assert len(lost.files.requests) == 2


def test_killed_during_flattening_it_stops_in_a_few_lines_and_continue_keeps_the_imported_files(lost):
    job_dir = lost.flattening.job_dir
    lost.flattener.state.reset()
    continued(job_dir)
    assert imported(job_dir) == lost.imported
    for name in (path.name for path in (EXAMPLE / "expected").iterdir()):
        assert (job_dir / "flattening" / name).read_bytes() == (EXAMPLE / "expected" / name).read_bytes()


def test_killed_during_a_send_it_stops_in_a_few_lines_and_continue_sends_no_batch_twice(lost):
    lost.fhir.state.released.set()
    continued(lost.send.job_dir)
    sent = [f"{r['resourceType']}/{r['id']}" for r in lost.resources]
    assert sorted(lost.fhir.state.applied) == sorted(sent)
    assert set(lost.fhir.state.applied.values()) == {1}, lost.fhir.state.applied  # the first batch was not sent again
