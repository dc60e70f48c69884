"""A large download body is read off the socket itself (``body_pieces``, without h11's copies):
it arrives whole, a break is resumed from the bytes received, a stall is still a stall, and small
bodies keep their connection."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tasks.clients.body_reads import DIRECT_READ_MIN_BYTES
from tasks.clients.downloads import DownloadError, download_ndjson
from tasks.streams.ndjson import iter_chunks
from tests.fakes._server import LoopbackServer
from tests.fakes.extraction_server import start_extraction_server
from tests.support.extraction import FAST_RETRY, SimulatedTime, client_for

LINE = b'{"resourceType":"Observation","id":"o%07d","valueQuantity":{"value":%d}}\n'
LARGE = b"".join(LINE % (n, n) for n in range(DIRECT_READ_MIN_BYTES // len(LINE % (0, 0)) + 1000))
SMALL = b"".join(LINE % (n, n) for n in range(100))
BROKEN_AT = 3_000_001  # past the first piece (what h11 holds), inside a line


def download(client, url: str, dest: Path, **overrides) -> object:
    stall = timedelta(seconds=5)
    options = dict(level=None, max_line_bytes=1 << 20, stall_timeout=stall, retry=FAST_RETRY)
    return download_ndjson(client, url, dest, **(options | overrides))


@pytest.fixture
def served(tmp_path):
    """The fake extraction server serving ``LARGE`` as ``a.ndjson``; yields it and the URL."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "a.ndjson").write_bytes(LARGE)
    with start_extraction_server(serve_dir=folder) as server:
        yield server, f"{server.base_url}/files/{server.served_job_id}/a.ndjson"


def test_a_large_body_arrives_whole_and_its_progress_is_told(tmp_path, served):
    server, url = served
    told, totals = [], []
    with client_for(server.base_url, SimulatedTime()) as client:
        dest = tmp_path / "a.ndjson"
        stats = download(client.http, url, dest, on_bytes=told.append, on_total=totals.append)
    assert dest.read_bytes() == LARGE and stats.resources == LARGE.count(b"\n")
    assert sum(told) == len(LARGE) and totals == [len(LARGE)] and len(told) > 1


def test_a_large_body_written_compressed_reads_back_whole(tmp_path, served):
    server, url = served
    with client_for(server.base_url, SimulatedTime()) as client:
        stats = download(client.http, url, tmp_path / "a.ndjson.zst", level="default")
    assert b"".join(iter_chunks(tmp_path / "a.ndjson.zst")) == LARGE
    assert stats.resources == LARGE.count(b"\n") and stats.size < len(LARGE) // 4


def test_a_reset_in_a_large_body_is_resumed_from_the_bytes_received(tmp_path, served):
    """A reset drops what the client had not read yet: the resume starts where its bytes end."""
    server, url = served
    server.state.reset_downloads, server.state.reset_after_bytes = 1, BROKEN_AT
    with client_for(server.base_url, SimulatedTime()) as client:
        stats = download(client.http, url, tmp_path / "a.ndjson")
    assert (tmp_path / "a.ndjson").read_bytes() == LARGE
    assert stats.resources == LARGE.count(b"\n")
    first, resumed = [r.header("range") for r in server.state.requests_to("/files/")]
    assert first is None and 0 < int(resumed.removeprefix("bytes=").removesuffix("-")) <= BROKEN_AT


def test_a_large_body_stalling_midway_is_a_stall_and_not_retried(tmp_path, served):
    server, url = served
    server.state.stall_downloads, server.state.stall_seconds = 1, 60.0
    server.state.stall_after_bytes = BROKEN_AT
    with (
        client_for(server.base_url, SimulatedTime()) as client,
        pytest.raises(DownloadError, match="no data arrived for 0.3 s"),
    ):
        download(client.http, url, tmp_path / "a.ndjson", stall_timeout=timedelta(seconds=0.3))
    assert len(server.state.requests_to("/files/")) == 1
    assert list(tmp_path.iterdir()) == [tmp_path / "served"]


@dataclass
class BodyState:
    """``/small`` and ``/large`` (``Range: bytes=N-`` answered 206); the first whole ``/large``
    stops after ``end_first_at`` bytes, the server closing the connection. ``requests``: (client
    port, path, Range) each."""

    end_first_at: int | None = None
    requests: list[tuple[int, str, str | None]] = field(default_factory=list)


class BodyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        state: BodyState = self.server.state
        body, ranged = LARGE if self.path == "/large" else SMALL, self.headers.get("Range")
        state.requests.append((self.client_address[1], self.path, ranged))
        start = int(ranged.removeprefix("bytes=").rstrip("-")) if ranged else 0
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Type", "application/fhir+ndjson")
        self.send_header("Content-Length", str(len(body) - start))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if self.path == "/large" and not ranged and state.end_first_at is not None:
            self.wfile.write(body[: state.end_first_at])  # then an orderly close, short of it
            self.close_connection, state.end_first_at = True, None
            return
        self.wfile.write(body[start:])


def test_a_large_body_the_server_ends_early_is_resumed_from_where_it_ended(tmp_path):
    state = BodyState(end_first_at=BROKEN_AT)
    with (
        LoopbackServer(BodyHandler, state) as server,
        client_for(server.base_url, SimulatedTime()) as client,
    ):
        stats = download(client.http, f"{server.base_url}/large", tmp_path / "a.ndjson")
    assert (tmp_path / "a.ndjson").read_bytes() == LARGE
    assert stats.resources == LARGE.count(b"\n")
    requested = [(path, ranged) for _, path, ranged in state.requests]
    assert requested == [("/large", None), ("/large", f"bytes={BROKEN_AT}-")]


def test_small_bodies_share_a_connection_and_a_large_one_leaves_its_own_closed(tmp_path):
    state = BodyState()
    with (
        LoopbackServer(BodyHandler, state) as server,
        client_for(server.base_url, SimulatedTime()) as client,
    ):
        for number, path in enumerate(["/small", "/small", "/large", "/small"]):
            download(client.http, f"{server.base_url}{path}", tmp_path / f"{number}.ndjson")
    ports = [port for port, _, _ in state.requests]
    assert ports[0] == ports[1] == ports[2] != ports[3]
    assert (tmp_path / "2.ndjson").read_bytes() == LARGE
    assert (tmp_path / "3.ndjson").read_bytes() == SMALL
