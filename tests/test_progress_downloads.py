"""Progress of the download steps (extractor, http_import): log lines naming bytes (and the total when the answer
gives one) without a terminal, and one step-level progress artifact fed by every file, on the suite's Prefect API.

Jobs run in-process (``flows.run.main``) without ``--no-progress``: stderr is captured, so the display is log lines.
``LOG_EVERY_SECONDS`` is set to 0 where a test wants a line for every piece of a small body.
"""

from __future__ import annotations

import io
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.run import EXIT_OK, main
from tasks.clients.bounds import declared_size
from tasks.job.layout import step_artifact_key
from tasks.streams.progress import track
from tasks.core.readable import size_text
from tests.conftest import wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.extraction_server import start_extraction_server
from tests.support.jobs import only_job_dir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

LINE = b'{"resourceType":"Patient","id":"p%04d"}\n'
BODY = b"".join(LINE % i for i in range(200))
PIECE = 100  # bytes per piece the gated server sends
WORKING = re.compile(r"http_import working: 0 / 1 files, [\d.]+ K?B, at ")  # some bytes, not "nothing yet"


@dataclass
class GatedState:
    """What the gated server sends: ``BODY`` in pieces of ``PIECE`` bytes, the last one only once ``release`` is
    set; ``length``: with a Content-Length, else chunked. ``drip``: seconds between pieces (a slow download)."""

    length: bool = True
    drip: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)


class GatedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        state: GatedState = self.server.state
        state.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+ndjson")
        self.send_header(*(("Content-Length", str(len(BODY))) if state.length else ("Transfer-Encoding", "chunked")))
        self.end_headers()
        pieces = [BODY[at : at + PIECE] for at in range(0, len(BODY), PIECE)]
        for piece in pieces[:-1]:
            self._send(piece, chunked=not state.length)
            state.release.wait(state.drip)
        state.release.wait(60)
        self._send(pieces[-1], chunked=not state.length)
        if not state.length:
            self.wfile.write(b"0\r\n\r\n")

    def _send(self, piece: bytes, chunked: bool) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        self.wfile.flush()


@pytest.fixture
def fast_log_lines(monkeypatch):
    monkeypatch.setattr("tasks.streams.progress.LOG_EVERY_SECONDS", 0.0)


def http_import_config(write_config) -> Path:
    return write_config({"pipeline": {"enabled_steps": ["http_import"]}, "compression": {"level": "fastest"}})


def progress_artifacts(job_dir: Path, position: int, step: str) -> list[Any]:
    """Every version of the step's progress artifact, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    key = step_artifact_key(job_dir.name, position, step, "progress")
    with get_client(sync_client=True) as client:  # sorted by the server: unsorted, a page of 200 in no set order
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
        )
    return found[::-1]


def progress_lines(job_dir: Path, label: str) -> list[str]:
    """The job log's progress lines of ``label``, from the label on (Prefect puts the task run's name before)."""
    lines = (job_dir / "job.log").read_text().splitlines()
    return [line[line.index(f"{label}: ") :] for line in lines if "dupflow.progress: " in line and f"{label}: " in line]


def watch_while_gated(tmp_path: Path, state: GatedState) -> tuple[threading.Thread, list[Any]]:
    """A thread that waits (the job runs in the main thread: it sets signal handlers) until the http_import
    step's progress artifact names bytes while the gate holds the file's last piece, keeps that version and
    opens the gate; on a timeout it opens the gate too, keeping nothing."""
    seen: list[Any] = []

    def working() -> bool:
        jobs = tmp_path / "jobs"
        found = (
            progress_artifacts(only_job_dir(jobs), 0, "http_import") if jobs.is_dir() and any(jobs.iterdir()) else []
        )
        if found and WORKING.match(found[-1].description):
            seen.append(found[-1])
        return bool(seen)

    def watch() -> None:
        try:
            wait_until(working, "a progress artifact naming the bytes so far", timeout=90)
        finally:
            state.release.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


# --- log lines ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
def test_http_import_logs_bytes_with_the_total_only_when_the_answer_gives_it(
    tmp_path, write_config, capsys, fast_log_lines, length
):
    state = GatedState(length=length)
    state.release.set()
    with LoopbackServer(GatedHandler, state) as server:
        url = f"{server.base_url}/export/patients?part=secret-4711"
        assert main(["start", str(http_import_config(write_config)), url]) == EXIT_OK

    job_dir = only_job_dir(tmp_path / "jobs")
    lines = progress_lines(job_dir, "download patients.ndjson.zst")
    *working, done = lines
    assert working and re.fullmatch(rf"download patients\.ndjson\.zst: done, {size_text(len(BODY))} in .*/s", done)
    if length:
        assert all(f" of {size_text(len(BODY))} at " in line and " %, ETA " in line for line in working), working
    else:
        assert all(
            re.fullmatch(r"download patients\.ndjson\.zst: [\d.]+ K?B at [\d.]+ [KMG]?B/s", line) for line in working
        ), working
    assert "secret-4711" not in (job_dir / "job.log").read_text() + capsys.readouterr().err


def run_extractor_job(tmp_path: Path, write_config, lines: dict[str, int], **faults: Any) -> Path:
    """An extractor job (in this process, log lines on) of a complete extraction whose files are ``lines`` (name:
    lines of ``LINE``), served by the fake extraction server with ``faults``; its job directory."""
    served = tmp_path / "served"
    served.mkdir()
    for name, count in lines.items():
        (served / f"{name}.ndjson").write_bytes(b"".join(LINE % i for i in range(count)))
    with start_extraction_server(serve_dir=served, **faults) as torch:
        config = write_config(
            {
                "pipeline": {"enabled_steps": ["extractor"]},
                "compression": {"level": "fastest"},
                "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 50},
                "services": {"extractor": {"base_url": torch.base_url}},
            }
        )
        assert main(["start", str(config), torch.served_status_url]) == EXIT_OK
    return only_job_dir(tmp_path / "jobs")


def downloads_artifact(job_dir: Path) -> Any:
    """The extractor's progress artifact of its downloads (the one of its polling has the same key)."""
    (artifact,) = [a for a in progress_artifacts(job_dir, 0, "extractor") if a.description.startswith("extractor")]
    return artifact


def test_extractor_downloads_log_each_file_against_its_content_length(tmp_path, write_config, capsys, fast_log_lines):
    lines = {"core": 50, "batch-1": 120, "batch-2": 80}
    job_dir = run_extractor_job(tmp_path, write_config, lines)

    sizes = {name: count * len(LINE % 0) for name, count in lines.items()}
    for name, size in sizes.items():
        *working, done = progress_lines(job_dir, f"download {name}.ndjson.zst")
        assert working and all(f" of {size_text(size)} at " in line for line in working), working
        assert done.startswith(f"download {name}.ndjson.zst: done, {size_text(size)} in ")
    artifact = downloads_artifact(job_dir)
    assert artifact.type == "progress" and float(artifact.data) == 100.0
    assert artifact.description.startswith(f"extractor done: 3 / 3 files, {size_text(sum(sizes.values()))}, at ")


def test_a_file_sent_again_from_its_start_counts_its_bytes_once(tmp_path, write_config, capsys):
    """The connection breaks after 1,000 bytes and the server ignores the Range of the resumption: the whole file
    comes again, and what the first attempt had told is taken back."""
    job_dir = run_extractor_job(
        tmp_path, write_config, {"core": 120}, ignore_ranges=True, reset_downloads=1, reset_after_bytes=1000
    )

    size = 120 * len(LINE % 0)
    (done,) = progress_lines(job_dir, "download core.ndjson.zst")
    assert done.startswith(f"download core.ndjson.zst: done, {size_text(size)} in "), done
    assert downloads_artifact(job_dir).description.startswith(f"extractor done: 1 / 1 files, {size_text(size)}, ")


# --- the step's progress artifact while it works ----------------------------------------------------------------


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
def test_http_import_shows_a_progress_artifact_while_the_file_arrives(tmp_path, write_config, capsys, length):
    """With a Content-Length the percent follows the bytes; without, it counts files done of the one expected (0
    until the end) and the description names the bytes so far."""
    state = GatedState(length=length, drip=0.05)
    with LoopbackServer(GatedHandler, state) as server:
        watcher, seen = watch_while_gated(tmp_path, state)
        url = f"{server.base_url}/data.ndjson"
        assert main(["start", str(http_import_config(write_config)), url]) == EXIT_OK
        watcher.join(timeout=120)

    (working,) = seen
    assert 0 < float(working.data) < 100 if length else float(working.data) == 0, working
    (artifact,) = progress_artifacts(only_job_dir(tmp_path / "jobs"), 0, "http_import")
    assert artifact.id == working.id and float(artifact.data) == 100.0, "one artifact, updated in place"
    assert artifact.description.startswith(f"http_import done: 1 / 1 files, {size_text(len(BODY))}, at ")


# --- pieces ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "size"),
    [
        ({"Content-Length": "1234"}, 1234),
        ({"Content-Length": "-5"}, None),
        ({"Transfer-Encoding": "chunked"}, None),
    ],
)
def test_the_body_size_is_the_declared_content_length(headers, size):
    """Answers come as sent (a compressed one is refused: ``test_bounded_answers``), so it is the body's size."""
    assert declared_size(httpx.Response(200, headers=headers)) == size


@pytest.fixture
def terminal(monkeypatch) -> io.StringIO:
    """Bars on: rich draws into the returned buffer as on a terminal."""
    import rich
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(rich, "_console", Console(file=screen, force_terminal=True, width=150))
    monkeypatch.setattr("tasks.streams.progress._display", "bar")
    return screen


def test_bars_of_downloads_at_once_share_one_display_that_outlives_the_first_to_end(terminal):
    """The first bar ends while the second still runs: the second learns its total and stays drawn to its end."""
    with track("download a.ndjson") as first:
        second_bar = track("download b.ndjson")
        second = second_bar.__enter__()
        first.advance(1024)
    second.set_total(4096)
    second.advance(4096)
    second_bar.__exit__(None, None, None)

    drawn = terminal.getvalue()
    assert "download b.ndjson" in drawn[drawn.rindex("download a.ndjson") :]
    assert "4.1/4.1 kB" in drawn, drawn  # rich's own units: its last frame before the display is wiped


def test_the_log_line_of_a_finished_file_says_done(caplog, monkeypatch):
    monkeypatch.setattr("tasks.streams.progress._display", "log")
    with caplog.at_level("INFO", logger="dupflow.progress"), track("download b.ndjson", unit="B") as progress:
        progress.advance(2048)
    assert [record.getMessage() for record in caplog.records][-1].startswith("download b.ndjson: done, 2.0 KB in ")
