"""The liveness watch of a running job (flows/api_watch.py) stops the job at once when the server answering at its
API is no longer the one the job started on, and keeps it running while its own server answers, busy or not.

The watch runs in a process of its own (it ends the process), against a fake server on 127.0.0.1 that plays the
job's server (the home's, by its settings and nonce, or one given by PREFECT_API_URL) and then, on its port, another
home's server or another program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from flows.prefect_server import NONCE_LOGGER, STATE_FILE
from tests.fakes._server import LoopbackServer
from tests.support.jobs import REPO_ROOT

pytestmark = pytest.mark.slow
NONCE = "n0nce-of-this-start"
WAIT = 60.0  # for the watch's next probes on a loaded machine (it probes every 2 s)
WATCH = """
import sys, threading
from pathlib import Path
from flows.api_watch import api_watched
from tasks.job.layout import JobPaths
with api_watched(JobPaths(Path(sys.argv[1])), sys.argv[2]):
    print("watching", flush=True)
    threading.Event().wait()
"""


@dataclass
class ServerPlay:
    """What the fake answers: ``settings`` to /admin/settings as (status, body), ``ready`` to /ready. Each settings
    request sets ``asked`` and is counted, so a test waits for the watch's probes rather than for time."""

    settings: tuple[int, bytes]
    ready: tuple[int, bytes] = (200, b'{"message":"OK"}')
    once: list[tuple[int, bytes]] = field(default_factory=list)  # answered to the next settings requests first
    asked: threading.Condition = field(default_factory=threading.Condition)
    settings_requests: int = 0


class PlayedServer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        play: ServerPlay = self.server.state
        if self.path.endswith("/ready"):
            status, body = play.ready
        else:
            status, body = play.once.pop(0) if play.once else play.settings
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.path.endswith("/admin/settings"):
            with play.asked:
                play.settings_requests += 1
                play.asked.notify_all()


def home_settings(home: Path, nonce: str = NONCE) -> tuple[int, bytes]:
    return 200, json.dumps({"home": str(home), "logging": {"extra_loggers": NONCE_LOGGER + nonce}}).encode()


def probes_seen(play: ServerPlay, more: int) -> None:
    """Wait until the watch has asked for the settings ``more`` times more."""
    with play.asked:
        target = play.settings_requests + more
        assert play.asked.wait_for(lambda: play.settings_requests >= target, WAIT), "the watch stopped probing"


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "prefect-home"
    home.mkdir()
    return home


def start_watch(tmp_path: Path, home: Path, api_url: str) -> subprocess.Popen:
    job_dir = tmp_path / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    environment = {**os.environ, "PREFECT_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    watch = subprocess.Popen(
        [sys.executable, "-c", WATCH, str(job_dir), api_url],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watch.stdout is not None and watch.stdout.readline() == "watching\n"
    return watch


def record_home_server(home: Path, url: str) -> None:
    record = {"pid": os.getpid(), "port": 0, "url": url, "log": "", "started_at": "", "nonce": NONCE}
    (home / STATE_FILE).write_text(json.dumps(record))


def stopped(watch: subprocess.Popen) -> str:
    try:
        _, stderr = watch.communicate(timeout=WAIT)
    finally:
        watch.kill()
    assert watch.returncode == 1, stderr
    return stderr


FOREIGN = {
    "another home's server": lambda home: home_settings(home.parent / "another-home", nonce="other"),
    "this home's path, another start's nonce": lambda home: home_settings(home, nonce="forged"),
    "a program that is no Prefect server": lambda home: (404, b"Not Found"),
}


@pytest.mark.parametrize("foreign", FOREIGN)
def test_a_job_on_the_homes_server_stops_when_another_server_answers_on_its_port(foreign, tmp_path, home):
    play = ServerPlay(home_settings(home))
    with LoopbackServer(PlayedServer, play) as server:
        record_home_server(home, server.base_url)
        watch = start_watch(tmp_path, home, server.base_url)
        probes_seen(play, 2)
        assert watch.poll() is None, "the job's own server stopped it"
        play.settings = FOREIGN[foreign](home)
        stderr = stopped(watch)
    lines = stderr.strip().splitlines()
    assert (
        lines[0]
        == f"job job-1 stopped: another server answers at {server.base_url}, not the Prefect server the job ran on"
    )
    assert lines[1].startswith("when the server runs again, resume with: ") and lines[1].endswith(
        f"continue {tmp_path / 'jobs' / 'job-1'}"
    )
    assert len(lines) == 2


def test_the_homes_server_busy_or_started_anew_keeps_the_job_running(tmp_path, home):
    """A 503 or a 401 tells nothing; the home's server started again by another command (a new record, a new nonce)
    is still the job's: its database is the same."""
    play = ServerPlay(home_settings(home))
    with LoopbackServer(PlayedServer, play) as server:
        record_home_server(home, server.base_url)
        watch = start_watch(tmp_path, home, server.base_url)
        for answer in [(503, b"busy"), (401, b"{}")]:
            play.settings = answer
            probes_seen(play, 2)
        record = json.loads((home / STATE_FILE).read_text())
        (home / STATE_FILE).write_text(json.dumps({**record, "nonce": "started-anew"}))
        play.settings = home_settings(home, nonce="started-anew")
        probes_seen(play, 3)
        assert watch.poll() is None, watch.communicate()
        watch.kill()
        watch.wait()


def test_one_odd_answer_of_the_jobs_own_server_does_not_stop_the_job(tmp_path, home):
    """Another server answers every probe, the job's own server may answer one oddly: a job whose server was killed
    -9 once stopped saying another server answered (CI; the odd answer itself was not caught)."""
    play = ServerPlay(home_settings(home))
    with LoopbackServer(PlayedServer, play) as server:
        record_home_server(home, server.base_url)
        watch = start_watch(tmp_path, home, server.base_url)
        play.once = [FOREIGN["a program that is no Prefect server"](home)]
        probes_seen(play, 3)
        assert watch.poll() is None, watch.communicate()
        watch.kill()
        watch.wait()


def test_a_job_on_a_server_given_by_prefect_api_url_stops_when_its_settings_change(tmp_path, home):
    elsewhere = (200, json.dumps({"home": "/srv/prefect", "api": {"url": "https://prefect.example"}}).encode())
    play = ServerPlay(elsewhere)
    with LoopbackServer(PlayedServer, play) as server:
        watch = start_watch(tmp_path, home, server.base_url + "/api")
        probes_seen(play, 2)
        assert watch.poll() is None, "the job's own server stopped it"
        play.settings = home_settings(home.parent / "a-laptop-home")
        assert "another server answers at" in stopped(watch)


def test_a_job_whose_server_lost_its_database_stops_naming_the_database(tmp_path, home):
    """PostgreSQL stopped under a live server: Prefect's client gave the run up after 19 s in 68 lines, recorded as
    a ConcurrencySlotAcquisitionError. The server's /ready says why; the job stops first, in two lines."""
    play = ServerPlay(home_settings(home))
    with LoopbackServer(PlayedServer, play) as server:
        record_home_server(home, server.base_url)
        watch = start_watch(tmp_path, home, server.base_url)
        probes_seen(play, 1)
        play.ready = (503, b'{"message":"Database is not available"}')
        lines = stopped(watch).strip().splitlines()
    assert (
        lines[0]
        == f"job job-1 stopped: the Prefect server at {server.base_url} lost its database (not available for 10 s)"
    )
    assert lines[1].startswith("when the server's database runs again, resume with: ") and len(lines) == 2
