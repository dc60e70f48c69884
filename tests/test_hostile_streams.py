"""Hostile streams and files (issue 22): decompression bombs, import folders holding things that are no files, and
downloads broken in the middle of the body.

Memory bounds are measured on a child process started by a small launcher (tests/peak_rss.py: its peak RSS covers
the processes under it too), so that nothing the test process holds counts.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import zstandard

from tasks.clients.errors import ServiceError
from tasks.extractor import download_result_file
from tasks.local_import import LocalImportError, find_ndjson_files, local_import
from tasks.streams.ndjson import CHUNK_SIZE, LineTooLongError, NdjsonError, iter_chunks, iter_lines
from tasks.streams.ndjson_writer import AtomicNdjsonWriter
from tests.support.ndjson import count_resources
from tests.conftest import REPO_ROOT
from tests.fakes._server import LoopbackServer
from tests.fakes.extraction_server import start_extraction_server
from tests.peak_rss import run_measured
from tests.steps import step_input
from tests.support.filesystem import walk_as_nobody

MB = 1024 * 1024
GB = 1024 * MB
BOMB_PEAK_LIMIT_MB = 400  # issue 22: a bomb of any ratio keeps the command's process tree under this
CHILD_DEADLINE = 60  # seconds; a bomb read to its end (1 GiB of lines one by one) takes minutes
RESOURCE_START = b'{"resourceType":"Patient","id":"'


def zstd_bomb(path: Path, prefix: bytes, filler: bytes, size: int) -> Path:
    """``prefix`` then ``size`` bytes of ``filler`` as one zstd frame, written as zstd writes it (ratio ~30000:1)."""
    piece = filler * (16 * MB // len(filler))
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=1).stream_writer(out) as writer:
        writer.write(prefix)
        for _ in range(size // len(piece)):
            writer.write(piece)
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, Path]:
    """1 GiB of newlines and one 1 GiB line, each a few tens of KB compressed."""
    folder = tmp_path_factory.mktemp("bombs")
    return {
        "newlines": zstd_bomb(folder / "newlines.ndjson.zst", b"", b"\n", GB),
        "long-line": zstd_bomb(folder / "long-line.ndjson.zst", RESOURCE_START, b"a", GB),
    }


def peak_rss_mb_of(code: str) -> tuple[float, str]:
    """Run ``code`` in a child Python: its peak RSS (the largest of it and the processes it waited for, see
    tests/peak_rss.py) and its output. A child still running after ``CHILD_DEADLINE`` seconds is killed (the test
    fails)."""
    with tempfile.TemporaryFile() as output:
        child = run_measured(
            [sys.executable, "-c", textwrap.dedent(code)],
            timeout=CHILD_DEADLINE,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        output.seek(0)
        text = output.read().decode()
    assert child.returncode == 0, f"the child failed ({child.returncode}):\n{text}"
    return child.peak_mb, text


# --- item 3: decompression bombs -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["newlines", "long-line"])
def test_a_zstd_bomb_comes_out_in_pieces_of_bounded_size(bombs, kind):
    pieces = iter_chunks(bombs[kind])
    sizes = [len(next(pieces)) for _ in range(64)]
    assert max(sizes) <= CHUNK_SIZE and sum(sizes) >= 32 * MB


@pytest.mark.parametrize(
    "read",
    [
        lambda path: list(iter_lines(path, MB)),
        lambda path: count_resources(path, MB),
    ],
    ids=["iter_lines", "count_resources"],
)
def test_a_file_of_nothing_but_newlines_is_refused_by_every_reader(bombs, read):
    with pytest.raises(NdjsonError, match=r"newlines.ndjson.zst: more than 1 MB of blank lines from line 1 on"):
        read(bombs["newlines"])


def test_blank_lines_between_resources_are_limited_like_a_line_and_counted_the_same(tmp_path):
    content = b'{"resourceType":"A"}\n' + b"\n \r\n" * 1000 + b'{"resourceType":"B"}\n\n'
    path = tmp_path / "a.ndjson"
    path.write_bytes(content)
    assert [number for number, _ in iter_lines(path, 4096)] == [1, 2002]
    assert count_resources(path, 4096) == 2
    with pytest.raises(NdjsonError, match="a.ndjson: more than 0 MB of blank lines from line 2 on"):
        count_resources(path, 3000)
    with pytest.raises(NdjsonError, match="a.ndjson: more than 0 MB of blank lines from line 2 on"):
        list(iter_lines(path, 3000))


def test_a_bomb_of_newlines_written_through_the_writer_is_refused_and_leaves_nothing(bombs, tmp_path):
    with pytest.raises(NdjsonError, match="blank lines from line 1 on"):
        with AtomicNdjsonWriter(tmp_path / "out.ndjson.zst", "fastest", MB, source="bomb") as writer:
            for chunk in iter_chunks(bombs["newlines"]):
                writer.write(chunk)
    assert list(tmp_path.iterdir()) == []


def test_a_line_growing_past_the_limit_in_a_bomb_is_refused(bombs):
    with pytest.raises(LineTooLongError, match="long-line.ndjson.zst: line 1 is longer than 1 MB"):
        count_resources(bombs["long-line"], MB)
    with pytest.raises(LineTooLongError, match="long-line.ndjson.zst: line 1 is longer than 1 MB"):
        list(iter_lines(bombs["long-line"], MB))


IMPORT_BOMB = """
    import tempfile
    from pathlib import Path
    from tasks.local_import import file_identity, import_file
    from tests.steps import step_input

    step = step_input(Path(tempfile.mkdtemp()) / "job", "local_import")
    try:
        import_file(step, {source!r}, "out.ndjson.zst", file_identity(Path({source!r})))
    except Exception as exc:
        print(type(exc).__name__, exc)
    print("left:", sorted(p.name for p in step.output_dir.iterdir()))
"""


@pytest.mark.slow  # a child process each: its start (imports) takes most of the few seconds
@pytest.mark.parametrize(
    ("kind", "error"),
    [("newlines", "more than 100 MB of blank lines from line 1 on"), ("long-line", "line 1 is longer than 100 MB")],
)
def test_importing_a_zstd_bomb_keeps_memory_flat_and_fails_clearly(bombs, kind, error):
    peak, output = peak_rss_mb_of(IMPORT_BOMB.format(source=str(bombs[kind])))
    assert f"{bombs[kind]}: {error}" in output and "left: []" in output
    assert peak < BOMB_PEAK_LIMIT_MB, output


DOWNLOAD_BOMB = """
    import tempfile
    from pathlib import Path
    from tasks.extractor import download_result_file
    from tests.steps import step_input

    step = step_input(
        Path(tempfile.mkdtemp()) / "job", "extractor", services__extractor__base_url={base!r},
        services__extractor__file_ready_retries="0",
    )
    try:
        download_result_file.fn(step, {url!r}, "out.ndjson.zst")
    except Exception as exc:
        print(type(exc).__name__, exc)
    print("left:", sorted(p.name for p in step.output_dir.iterdir()))
"""


@pytest.mark.slow  # a child process each: its start (imports) takes most of the few seconds
@pytest.mark.parametrize(
    ("kind", "error"),
    [("newlines", "more than 100 MB of blank lines from line 1 on"), ("long-line", "line 1 is longer than 100 MB")],
)
def test_downloading_a_zstd_bomb_keeps_memory_flat_and_fails_clearly(bombs, kind, error):
    with start_extraction_server(serve_dir=bombs[kind].parent) as server:
        url = f"{server.base_url}/files/{server.served_job_id}/{bombs[kind].name}"
        peak, output = peak_rss_mb_of(DOWNLOAD_BOMB.format(base=server.base_url, url=url))
    assert f"{url}: {error}" in output and "left: []" in output
    assert peak < BOMB_PEAK_LIMIT_MB, output


# --- item 9: things in the import folder that look like data but are no readable file --------------------------


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "gone.ndjson")


def make_link_loop(path: Path) -> None:
    path.symlink_to(path.parent / "other")
    (path.parent / "other").symlink_to(path)


@pytest.mark.parametrize(
    ("make", "name", "fragment"),
    [
        (make_fifo, "x.ndjson", "is a named pipe (FIFO), not a file"),
        (make_dangling_link, "x.ndjson", "it is a symbolic link to"),
        (make_link_loop, "x.ndjson.zst", "it is a loop of symbolic links"),
        (Path.mkdir, "x.ndjson", "is a directory, not a file"),
    ],
    ids=["fifo", "dangling-symlink", "symlink-loop", "directory"],
)
@pytest.mark.parametrize("recursive", [False, True], ids=["flat", "recursive"])
def test_anything_named_like_data_that_is_no_readable_file_is_an_error_naming_it(
    tmp_path, make, name, fragment, recursive
):
    (tmp_path / "good.ndjson").write_text('{"resourceType":"Patient"}\n')
    make(tmp_path / name)
    with pytest.raises(LocalImportError, match=re.escape(fragment)) as error:
        find_ndjson_files(tmp_path, recursive=recursive, jobs_dir=tmp_path / "jobs")
    assert str(tmp_path / name) in str(error.value)


def test_a_fifo_in_the_import_folder_fails_the_step_without_opening_it(tmp_path):
    """A named pipe blocks whoever opens it until a writer comes: the step must fail, not hang."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "good.ndjson").write_text('{"resourceType":"Patient"}\n')
    os.mkfifo(source / "pipe.ndjson")
    step = step_input(tmp_path / "job", "local_import", job_input=str(source))
    with pytest.raises(LocalImportError, match="pipe.ndjson is a named pipe"):
        local_import.fn(step)
    assert not step.output_dir.exists() or list(step.output_dir.iterdir()) == []


def test_a_symlink_to_a_data_file_is_imported_and_other_names_are_still_ignored(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.ndjson").write_text('{"resourceType":"Patient"}\n')
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "linked.ndjson").symlink_to(tmp_path / "real" / "a.ndjson")
    os.mkfifo(tmp_path / "in" / "notes.fifo")
    (tmp_path / "in" / ".hidden.ndjson").symlink_to(tmp_path / "gone")
    assert find_ndjson_files(tmp_path / "in", recursive=False, jobs_dir=tmp_path / "jobs") == [
        str(tmp_path / "in" / "linked.ndjson")
    ]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the scan drops to nobody in a child, which only root can")
def test_a_data_file_without_read_permission_is_an_error_naming_it():
    # Tests run as root, who reads everything: the scan runs in a child that has dropped to nobody.
    top = Path(tempfile.mkdtemp(prefix="dupflow-unreadable-file-"))
    try:
        top.chmod(0o755)
        (top / "a.ndjson").write_text('{"resourceType":"Patient"}\n')
        (top / "b.ndjson").write_text('{"resourceType":"Patient"}\n')
        (top / "b.ndjson").chmod(0o000)
        queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(target=walk_as_nobody, args=(str(top), queue))
        child.start()
        message = queue.get(timeout=60)
        child.join(timeout=60)
    finally:
        shutil.rmtree(top)
    assert message == f"cannot read file {top / 'b.ndjson'}: permission denied; fix its permissions"


# --- item 15: a download broken in the middle of the body ------------------------------------------------------

SERVED = b"".join(
    b'{"resourceType":"Observation","id":"o%05d","valueQuantity":{"value":%d}}\n' % (number, number)
    for number in range(3000)
)  # about 200 KB, several socket reads: a reset after the first 64 KiB leaves most of the file to resume


@pytest.fixture
def served(tmp_path):
    """A result folder holding ``a.ndjson`` (plain) and ``b.ndjson.zst`` (the same data, zstd), and a fake extraction
    server serving it; yields (server, folder)."""
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "a.ndjson").write_bytes(SERVED)
    (folder / "b.ndjson.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(SERVED * 20))
    with start_extraction_server(serve_dir=folder) as server:
        yield server, folder


def download_served(tmp_path: Path, server, name: str, *, compress: bool, attempts: int = 3) -> tuple[Path, object]:
    """The extractor's download of one served file, as a job runs it (retry backoff shortened)."""
    step = step_input(
        tmp_path / "job",
        "extractor",
        services__extractor__base_url=server.base_url,
        services__extractor__file_ready_retries="0",
        compression__enabled=str(compress).lower(),
        retry__max_attempts=str(attempts),
        retry__initial_backoff_ms="1",
        retry__max_backoff_ms="5",
    )
    target = "out.ndjson.zst" if compress else "out.ndjson"
    record = download_result_file.fn(step, f"{server.base_url}/files/{server.served_job_id}/{name}", target)
    return step.output_dir / target, record


def file_key(server, name: str) -> str:
    return f"{server.served_job_id}/{name}"


@pytest.mark.parametrize("compress", [False, True], ids=["written-plain", "written-compressed"])
def test_a_reset_in_the_middle_of_the_body_is_resumed_with_a_range_request(tmp_path, served, compress):
    server, folder = served
    server.state.reset_downloads, server.state.reset_after_bytes = 1, 70_001  # inside a line
    path, record = download_served(tmp_path, server, "a.ndjson", compress=compress)
    assert b"".join(iter_chunks(path)) == SERVED
    assert record.resources == SERVED.count(b"\n") and record.size == path.stat().st_size
    assert server.state.file_gets[file_key(server, "a.ndjson")] == 2
    assert server.state.range_probes[file_key(server, "a.ndjson")] == 1
    (resumed,) = [r for r in server.state.requests_to("/files/") if r.header("range")]
    assert resumed.header("range") == "bytes=70001-"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_zstd_body_is_resumed_from_the_bytes_received_not_from_the_size_written(tmp_path, served):
    server, folder = served
    served_size = (folder / "b.ndjson.zst").stat().st_size
    server.state.reset_downloads, server.state.reset_after_bytes = 1, served_size // 2
    path, record = download_served(tmp_path, server, "b.ndjson.zst", compress=True)
    assert b"".join(iter_chunks(path)) == SERVED * 20 and record.resources == 20 * SERVED.count(b"\n")
    (resumed,) = [r for r in server.state.requests_to("/files/") if r.header("range")]
    assert resumed.header("range") == f"bytes={served_size // 2}-"


def test_a_server_that_answers_the_range_request_with_the_whole_file_starts_it_over(tmp_path, served):
    server, _ = served
    server.state.reset_downloads, server.state.reset_after_bytes = 1, 70_001
    server.state.ignore_ranges = True
    path, record = download_served(tmp_path, server, "a.ndjson", compress=False)
    assert path.read_bytes() == SERVED and record.resources == SERVED.count(b"\n")
    assert server.state.range_probes[file_key(server, "a.ndjson")] == 1  # asked, answered 200


def test_resets_on_every_attempt_end_in_a_clear_error_after_max_attempts(tmp_path, served):
    server, _ = served
    server.state.reset_downloads, server.state.reset_after_bytes = 10, 30_000
    server.state.faults_on_ranges = True
    with pytest.raises(ServiceError, match=r"the connection broke after 90,000 bytes of the file") as error:
        download_served(tmp_path, server, "a.ndjson", compress=True, attempts=3)
    assert "a.ndjson" in str(error.value)
    assert server.state.file_gets[file_key(server, "a.ndjson")] == 3
    assert [r.header("range") for r in server.state.requests_to("/files/")] == [None, "bytes=30000-", "bytes=60000-"]
    assert list((tmp_path / "job").glob("**/*.ndjson*")) == []


class LastChunkLostHandler(BaseHTTPRequestHandler):
    """Sends ``SERVED`` as one chunk and hangs up before the chunked body's end; a Range request past the end gets
    416 with the file's size, as a server answers it."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.state.append(self.headers.get("Range"))
        self.close_connection = True
        if self.headers.get("Range"):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(SERVED)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%b\r\n" % (len(SERVED), SERVED))  # no 0-chunk: the body's end is lost
        self.wfile.flush()


def test_a_body_whose_end_was_lost_after_its_last_byte_is_finished_when_the_server_says_416(tmp_path):
    """Asked for the rest from the size received, the server says there is none (416, bytes */size): every byte
    had come, so the file is complete; it failed as "expected HTTP 200 with the file"."""
    with LoopbackServer(LastChunkLostHandler, []) as server:
        step = step_input(
            tmp_path / "job",
            "extractor",
            services__extractor__base_url=server.base_url,
            services__extractor__file_ready_retries="0",
            compression__enabled="false",
            retry__initial_backoff_ms="1",
            retry__max_backoff_ms="5",
        )
        record = download_result_file.fn(step, f"{server.base_url}/files/a.ndjson", "a.ndjson")
        assert server.state == [None, f"bytes={len(SERVED)}-"]
    assert (step.output_dir / "a.ndjson").read_bytes() == SERVED and record.resources == SERVED.count(b"\n")
