import contextlib
import contextvars
import functools
import os
import random
import signal
import struct
import sys
import tempfile
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
import zstandard
from loky.process_executor import ShutdownExecutorError

from tasks.streams import processes
from tests.support.processes import worker_pids
from tasks.streams.fanout import Cancelled, cancel_scope, pause, raise_if_cancelled, run_bounded
from tasks.streams.files import start_writeback
from tasks.streams import ndjson_writer
from tasks.streams.ndjson import (
    LineTooLongError,
    NdjsonError,
    ZSTD_MAGIC,
    StreamDecoder,
    iter_chunks,
    is_zstd,
    iter_lines,
    TruncatedLineError,
    UnsafeNameError,
    output_name,
    remove_partial_files,
)
from tasks.streams.ndjson_writer import CHECK_IN_PROCESS_MIN_BYTES, AtomicNdjsonWriter
from tests.support.ndjson import count_resources, iter_resources
from tests.conftest import wait_until

MB = 1024 * 1024
# The writer checks a plain file this large in a worker process after the last write, not in the writing thread.
LARGE = CHECK_IN_PROCESS_MIN_BYTES
NEEDS_WORKERS = pytest.mark.skipif(not processes.processes_allowed(), reason="one core: no worker processes")
WHERE_CHECKED = pytest.mark.parametrize(
    "expected_size",
    [None, pytest.param(LARGE, marks=[pytest.mark.slow, NEEDS_WORKERS])],
    ids=["while-writing", "in-a-worker"],
)


@pytest.fixture
def worker_checks(monkeypatch) -> list[str]:
    """The functions the writer started in worker processes (through ``ProcessCalls``)."""
    calls: list[str] = []

    class Recorded(processes.ProcessCalls):
        def __init__(self, function):
            super().__init__(function)
            self.name = function.__name__

        def start(self, *args):
            calls.append(self.name)
            super().start(*args)

    monkeypatch.setattr(ndjson_writer, "ProcessCalls", Recorded)
    return calls


def checked_in_a_worker(checks: list[str], expected_size: int | None) -> bool:
    return bool(checks) == (expected_size is not None)


def write_zstd(path: Path, data: bytes) -> Path:
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path


def test_zstd_content_is_recognised_by_magic_bytes_whatever_the_name(tmp_path):
    path = write_zstd(tmp_path / "looks-plain.ndjson", b'{"a":1}\n{"b":2}\n')
    assert is_zstd(path)
    assert [line for _, line in iter_lines(path, MB)] == [b'{"a":1}', b'{"b":2}']


def test_lines_spanning_chunks_and_a_missing_final_newline_are_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr("tasks.streams.ndjson.CHUNK_SIZE", 7)
    path = tmp_path / "x.ndjson"
    path.write_bytes(b'{"resourceType":"Patient"}\n\n  \n{"resourceType":"Condition"}')
    assert [(n, r["resourceType"]) for n, r in iter_resources(path, MB)] == [(1, "Patient"), (4, "Condition")]


def test_a_line_over_the_limit_names_file_line_and_key(tmp_path):
    path = tmp_path / "big.ndjson"
    path.write_bytes(b"{}\n" + b"x" * (2 * MB) + b"\n")
    with pytest.raises(LineTooLongError) as error:
        list(iter_lines(path, MB))
    assert "big.ndjson: line 2" in str(error.value)
    assert "pipeline.max_ndjson_line_size_mb" in str(error.value)


def test_damaged_zstd_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.ndjson.zst"
    whole = zstandard.ZstdCompressor().compress(b"".join(b'{"n":%d}\n' % i for i in range(5000)))
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(NdjsonError, match="not readable as zstd"):
        list(iter_lines(path, MB))
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"garbage" * 10)
    with pytest.raises(NdjsonError, match="not readable as zstd"):
        list(iter_lines(path, MB))


def test_writer_counts_resources_and_compresses(tmp_path):
    dest = tmp_path / "out.ndjson.zst"
    with AtomicNdjsonWriter(dest, "fastest", MB) as writer:
        writer.write(b'{"resourceType":"A"}\n{"resourceType"')
        writer.write(b':"B"}\n\n')
        writer.write(b'{"resourceType":"C"}\n')
    assert writer.stats.resources == 3 and writer.stats.size == dest.stat().st_size
    assert is_zstd(dest) and count_resources(dest, MB) == 3


def test_writer_sizes_its_zstd_window_by_the_hint_and_takes_more_data_than_hinted(tmp_path):
    line = b'{"resourceType":"Patient","id":"%d"}\n'
    data = b"".join(line % number for number in range(2000))  # 78 KB
    written = {}
    for hint in (None, 1000):  # a hint far below the data: never a pledge
        dest = tmp_path / f"{hint}.ndjson.zst"
        with AtomicNdjsonWriter(dest, "default", MB, size_hint=hint) as writer:
            writer.write(data)
        assert writer.stats.resources == 2000
        written[hint] = dest.read_bytes()
    assert zstandard.get_frame_parameters(written[None]).window_size == 2 * MB  # the level's own: any size
    assert zstandard.get_frame_parameters(written[1000]).window_size <= 16 * 1024
    assert all(zstandard.ZstdDecompressor().decompressobj().decompress(each) == data for each in written.values())


def test_writer_adds_the_missing_final_newline(tmp_path):
    dest = tmp_path / "out.ndjson"
    with AtomicNdjsonWriter(dest, None, MB) as writer:
        writer.write(b'{"resourceType":"A"}')
    assert dest.read_bytes() == b'{"resourceType":"A"}\n'


def test_a_failed_write_leaves_neither_the_file_nor_its_temporary(tmp_path):
    dest = tmp_path / "out.ndjson"
    with pytest.raises(RuntimeError):
        with AtomicNdjsonWriter(dest, None, MB) as writer:
            writer.write(b'{"resourceType":"A"}\n')
            assert writer.part.exists() and not dest.exists()
            raise RuntimeError("disk gone")
    assert list(tmp_path.iterdir()) == []


def test_a_line_over_the_limit_while_writing_discards_the_output(tmp_path):
    dest = tmp_path / "out.ndjson"
    with pytest.raises(LineTooLongError):
        with AtomicNdjsonWriter(dest, None, 10) as writer:
            writer.write(b"x" * 11)
    assert list(tmp_path.iterdir()) == []


def test_leftover_temporaries_of_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".a.ndjson.part").write_bytes(b"half")
    (tmp_path / "b.ndjson").write_bytes(b"{}\n")
    remove_partial_files(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["b.ndjson"]


@pytest.mark.parametrize(
    ("name", "compress", "expected"),
    [
        ("core.ndjson", True, "core.ndjson.zst"),
        ("core.ndjson.zst", False, "core.ndjson"),
        ("batch", True, "batch.ndjson.zst"),
        ("data.json", False, "data.ndjson"),
    ],
)
def test_output_names_carry_the_ndjson_and_compression_extension(name, compress, expected):
    assert output_name(name, compress) == expected


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"resourceType":"A"}\n\x00\x01\xff binary\n', "line 2 is not valid JSON"),
        (b'{"resourceType":"A"}\nnot json at all\n', "line 2 is not valid JSON"),
        (b'{"resourceType":"A"}\n[1, 2]\n', "line 2 is not a JSON object"),
        (b'{"resourceType":"A"}\n\n{"id":"x"}\n', "line 3 is a JSON object without a resourceType"),
        (b'{"resourceType":""}\n', "line 1 is a JSON object without a resourceType"),
    ],
    ids=["binary", "text", "array", "no-resource-type", "empty-resource-type"],
)
@WHERE_CHECKED
def test_every_line_is_checked_to_be_a_resource(tmp_path, content, fragment, expected_size, worker_checks):
    dest = tmp_path / "out.ndjson"
    with pytest.raises(NdjsonError, match=fragment) as error:
        with AtomicNdjsonWriter(dest, None, MB, source="input/a.ndjson", expected_size=expected_size) as writer:
            for start in range(0, len(content), 5):
                writer.write(content[start : start + 5])
    assert str(error.value).startswith("input/a.ndjson: ")
    assert list(tmp_path.iterdir()) == []
    assert checked_in_a_worker(worker_checks, expected_size)


@WHERE_CHECKED
def test_a_last_line_cut_off_without_a_newline_is_a_truncation(tmp_path, expected_size, worker_checks):
    dest = tmp_path / "out.ndjson"
    with pytest.raises(TruncatedLineError, match="end in the middle of line 2"):
        with AtomicNdjsonWriter(dest, None, MB, expected_size=expected_size) as writer:
            writer.write(b'{"resourceType":"A"}\n{"resou')
    assert list(tmp_path.iterdir()) == []
    assert checked_in_a_worker(worker_checks, expected_size)


@WHERE_CHECKED
def test_a_plain_file_is_counted_and_completed_alike_wherever_it_is_checked(tmp_path, expected_size, worker_checks):
    dest = tmp_path / "out.ndjson"
    with AtomicNdjsonWriter(dest, None, MB, expected_size=expected_size) as writer:
        writer.write(b'{"resourceType":"A"}\n\n{"resourceType":"B"}\n{"resourceType":')
        writer.write(b'"C"}')
    assert writer.stats.resources == 3 and writer.stats.size == dest.stat().st_size
    assert dest.read_bytes().endswith(b'{"resourceType":"C"}\n')
    assert checked_in_a_worker(worker_checks, expected_size)


@pytest.mark.slow
@NEEDS_WORKERS
def test_a_line_over_the_limit_found_in_a_worker_names_file_line_and_key(tmp_path):
    dest = tmp_path / "out.ndjson"
    with pytest.raises(LineTooLongError, match="max_ndjson_line_size_mb") as error:
        with AtomicNdjsonWriter(dest, None, 32, source="input/a.ndjson", expected_size=LARGE) as writer:
            writer.write(b'{"resourceType":"A"}\n' + b"x" * 40)
    assert (error.value.path, error.value.line_number) == ("input/a.ndjson", 2)
    assert list(tmp_path.iterdir()) == []


def test_a_compressed_file_is_always_checked_while_writing(tmp_path):
    with pytest.raises(NdjsonError, match="line 1 is not valid JSON"):
        with AtomicNdjsonWriter(tmp_path / "out.ndjson.zst", "fastest", MB, expected_size=LARGE) as writer:
            writer.write(b"not json\n")
            raise AssertionError("the line is checked as it is written")
    assert not worker_pids()


def test_blank_lines_and_crlf_line_ends_are_accepted(tmp_path):
    dest = tmp_path / "out.ndjson"
    with AtomicNdjsonWriter(dest, None, MB) as writer:
        writer.write(b'\r\n{"resourceType":"A"}\r\n  \n\t\n{"resourceType":"B"}\r\n')
    assert writer.stats.resources == 2


def test_counting_a_file_checks_its_lines_too(tmp_path):
    path = tmp_path / "a.ndjson"
    path.write_bytes(b'{"resourceType":"A"}\n{"oops"\n')
    with pytest.raises(NdjsonError, match="a.ndjson: line 2 is not valid JSON"):
        count_resources(path, MB)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("a\nb.ndjson", "control character"),
        ("a\rb.ndjson", "control character"),
        ("a\x1bb.ndjson", "control character"),
        ("evil\u202egpj.ndjson", "bidirectional"),
        ("x" * 250 + ".ndjson", "too long"),
        ("\u00e9" * 120 + ".ndjson", "too long"),
    ],
    ids=["newline", "carriage-return", "escape", "bidi-override", "long", "long-in-bytes"],
)
def test_unsafe_file_names_are_refused_with_the_name_escaped(name, fragment):
    with pytest.raises(UnsafeNameError, match=fragment) as error:
        output_name(name, compress=True)
    assert "\n" not in str(error.value) and "\r" not in str(error.value) and "\u202e" not in str(error.value)


def test_a_compressed_file_is_read_in_pieces_of_bounded_size(tmp_path):
    """Decompression is fed small slices, so a well-compressed file never comes out as one piece of many MB
    (1 MiB of FHIR NDJSON at 15:1 used to come out as 16 MB at once, in every process reading it)."""
    rng = random.Random(3)
    lines = [
        b'{"resourceType":"Observation","id":"%032x","valueQuantity":{"value":%d}}' % (rng.getrandbits(128), i)
        for i in range(200_000)
    ]
    plain = b"\n".join(lines) + b"\n"
    path = write_zstd(tmp_path / "a.ndjson.zst", plain)
    assert len(plain) > 4 * path.stat().st_size > 4 * MB  # more than a megabyte compressed, at least 4:1
    pieces = list(iter_chunks(path))
    assert b"".join(pieces) == plain
    assert max(map(len, pieces)) <= 2 * MB


SPANNED_LINES = [
    b'{"resourceType":"Patient","id":"p%03d"}' % n if n % 7 else b'{"resourceType":"Bundle","entry":[{},{}]}'
    for n in range(1, 121)
]


@pytest.mark.slow
@NEEDS_WORKERS
@pytest.mark.parametrize("bad_line", [None, 1, 97, 119])
def test_a_large_plain_file_is_checked_in_spans_as_it_is_written_with_the_whole_files_line_numbers(
    tmp_path, monkeypatch, worker_checks, bad_line
):
    monkeypatch.setattr(ndjson_writer, "SPAN_MIN_BYTES", 512)
    lines = [b"not json" if number == bad_line else line for number, line in enumerate(SPANNED_LINES, start=1)]
    dest = tmp_path / "out.ndjson"
    with contextlib.ExitStack() as stack:
        if bad_line:
            stack.enter_context(pytest.raises(NdjsonError, match=f"^input/a.ndjson: line {bad_line} is not valid JSON"))
        with AtomicNdjsonWriter(dest, None, MB, source="input/a.ndjson", expected_size=LARGE) as writer:
            for number, line in enumerate(lines, start=1):  # no final newline: the writer adds it
                writer.write(line if number == len(lines) else line + b"\n")
    assert len(worker_checks) > processes.pool_size() and set(worker_checks) == {"check_plain_span"}
    if bad_line:
        assert list(tmp_path.iterdir()) == []
        return
    assert dest.read_bytes() == b"\n".join(SPANNED_LINES) + b"\n"
    assert (writer.stats.resources, writer.stats.bundles, writer.stats.bundled) == (120, 17, 34)


@pytest.mark.slow
@NEEDS_WORKERS
def test_the_workers_start_when_a_large_plain_file_begins_not_after_its_last_byte(tmp_path):
    with processes.worker_pool(), AtomicNdjsonWriter(tmp_path / "out.ndjson", None, MB, expected_size=LARGE) as writer:
        writer.write(b'{"resourceType":"A"}\n')
        wait_until(worker_pids, "the workers started", timeout=DEADLINE_SECONDS)
    assert writer.stats.resources == 1


@pytest.mark.parametrize("expected_size", [None, pytest.param(LARGE, marks=[pytest.mark.slow, NEEDS_WORKERS])])
@pytest.mark.parametrize("compressed", [False, True])
def test_copy_appends_a_data_files_content_and_counts_it(tmp_path, expected_size, compressed):
    content = b"\n".join(SPANNED_LINES)
    source = tmp_path / "in.ndjson"
    source.write_bytes(zstandard.ZstdCompressor().compress(content) if compressed else content)
    dest = tmp_path / "out" / "in.ndjson"
    with AtomicNdjsonWriter(dest, None, MB, expected_size=expected_size) as writer:
        copied = sum(writer.copy(source))
    assert copied == len(content) and dest.read_bytes() == content + b"\n"
    assert writer.stats.resources == 120


SHM = Path("/dev/shm")


@pytest.mark.slow
@NEEDS_WORKERS
@pytest.mark.skipif(
    not SHM.is_dir() or not os.access(SHM, os.W_OK), reason="needs /dev/shm, a file system of its own, for the source"
)
def test_a_plain_file_from_another_file_system_is_copied_whole(tmp_path):
    """The kernel copies between file systems only up to Linux 5.18 (EXDEV since 5.19): else through this process."""
    content = b"\n".join(SPANNED_LINES)
    with tempfile.TemporaryDirectory(dir=SHM) as shm:
        source = Path(shm, "in.ndjson")
        source.write_bytes(content)
        assert source.stat().st_dev != tmp_path.stat().st_dev, "the source must be on another file system"
        dest = tmp_path / "in.ndjson"
        with AtomicNdjsonWriter(dest, None, MB, expected_size=LARGE) as writer:
            copied = sum(writer.copy(source))
    assert copied == len(content) and dest.read_bytes() == content + b"\n"
    assert writer.stats.resources == 120


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_kernel_takes_the_advice_to_write_a_file_out_early_and_a_pipe_is_no_error(tmp_path):
    with open(tmp_path / "data", "wb") as out:
        out.write(os.urandom(MB))
        out.flush()
        assert start_writeback(out.fileno())
    reading, writing = os.pipe()
    try:
        assert not start_writeback(writing)
    finally:
        os.close(reading)
        os.close(writing)


@pytest.mark.parametrize("level", [None, "fastest"])
@pytest.mark.parametrize("how", ["write", "copy"])
def test_a_file_written_out_as_it_grows_holds_every_byte_once(tmp_path, monkeypatch, level, how):
    """The writer flushes and asks for writeback every ``WRITEBACK_BYTES`` (made small here) in the middle of lines
    and of zstd frames; the file holds the data as written, every resource counted once."""
    monkeypatch.setattr(ndjson_writer, "WRITEBACK_BYTES", 4096)
    rng = random.Random(7)
    content = b"".join(
        b'{"resourceType":"Patient","id":"p%d","note":"%s"}\n' % (n, os.urandom(rng.randrange(10, 900)).hex().encode())
        for n in range(2000)
    )
    source, dest = tmp_path / "in.ndjson", tmp_path / "out" / ("in.ndjson" + (".zst" if level else ""))
    source.write_bytes(content)
    with AtomicNdjsonWriter(dest, level, MB) as writer:
        if how == "copy":
            assert sum(writer.copy(source)) == len(content)
        for start in range(0, len(content) if how == "write" else 0, 3001):
            writer.write(content[start : start + 3001])
    written = dest.read_bytes()
    assert (zstandard.ZstdDecompressor().decompressobj().decompress(written) if level else written) == content
    assert writer.stats.resources == 2000 and writer.stats.size == len(written)


@pytest.mark.slow
@NEEDS_WORKERS
def test_a_worker_dying_under_the_check_leaves_the_check_to_the_writing_thread(tmp_path):
    busy = processes.pool_size()
    with processes.worker_pool() as pool:
        for _ in range(busy):  # every worker busy, so the file's check waits in the pool's queue behind them
            threading.Thread(target=contextvars.copy_context().run, args=(sleep_in_a_worker,), daemon=True).start()
        wait_for_calls_in_the_pool(pool, busy)
        killed: list[int] = []
        killer = threading.Thread(target=kill_a_worker_once_queued, args=(pool, busy + 1, killed), daemon=True)
        killer.start()
        dest = tmp_path / "out.ndjson"
        with AtomicNdjsonWriter(dest, None, MB, expected_size=LARGE) as writer:
            writer.write(b'{"resourceType":"A"}\n{"resourceType":"B"}\n')
        killer.join(DEADLINE_SECONDS)
    assert killed, "the worker was killed while the check waited"
    assert writer.stats.resources == 2 and dest.read_bytes().count(b"\n") == 2


DEADLINE_SECONDS = 60


def sleep_in_a_worker() -> None:
    with contextlib.suppress(BrokenProcessPool, ShutdownExecutorError):
        processes.run_in_process(time.sleep, 600)


def calls_in(pool) -> list:
    """The calls submitted to ``pool`` and not done, but for the one that starts its workers."""
    if pool.executor is None:  # made by the first call
        return []
    items = list(pool.executor._pending_work_items.values())  # noqa: SLF001 - what waits in the pool
    return [item for item in items if item.fn is not processes.never_cancelled and not item.future.done()]


def wait_for_calls_in_the_pool(pool, calls: int) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while len(calls_in(pool)) < calls:
        assert time.monotonic() < deadline, f"{calls} calls never reached the pool"
        time.sleep(0.02)


def kill_a_worker_once_queued(pool, calls: int, killed: list[int]) -> None:
    wait_for_calls_in_the_pool(pool, calls)
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not (pids := worker_pids()):
        assert time.monotonic() < deadline, "no worker started"
        time.sleep(0.02)
    os.kill(pids[0], signal.SIGKILL)
    killed.append(pids[0])


@pytest.mark.slow
@NEEDS_WORKERS
def test_an_interrupted_fan_out_stops_the_check_of_a_plain_file_in_a_worker(tmp_path):
    assert threading.current_thread() is threading.main_thread(), "a signal reaches the main thread only"
    busy = processes.pool_size()
    dest = tmp_path / "out.ndjson"
    outcome: list[BaseException] = []

    def write_the_file() -> None:
        try:
            with AtomicNdjsonWriter(dest, None, MB, expected_size=LARGE) as out:
                out.write(b'{"resourceType":"A"}\n')
        except BaseException as exc:
            outcome.append(exc)
            raise

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with processes.worker_pool() as pool:
            for _ in range(busy):  # every worker busy: the file's check waits in the pool's queue until it is stopped
                threading.Thread(target=contextvars.copy_context().run, args=(sleep_in_a_worker,), daemon=True).start()
            wait_for_calls_in_the_pool(pool, busy)
            threading.Thread(target=interrupt_once_queued, args=(pool, busy + 1), daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                run_bounded([write_the_file], workers=1)
            wait_until(lambda: outcome, "the interrupted check stopped", timeout=DEADLINE_SECONDS)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(outcome[0], Cancelled)
    assert list(tmp_path.iterdir()) == []
    wait_until(lambda: not worker_pids(), "the pool's workers terminated", timeout=DEADLINE_SECONDS)


def interrupt_once_queued(pool, calls: int) -> None:
    """Ctrl+C, as soon as ``calls`` calls wait in the pool."""
    wait_for_calls_in_the_pool(pool, calls)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_work_in_a_cancel_scope_stops_at_its_next_check_once_another_thread_cancels_it(tmp_path):
    """How a file task on a Dask worker stops once its flow run is over (``tasks.job.flow_run_watch``): its file is
    not finished, and no new one is begun."""
    with cancel_scope() as cancel:
        with pytest.raises(Cancelled), AtomicNdjsonWriter(tmp_path / "a.ndjson", None, MB) as out:
            out.write(b'{"resourceType":"A"}\n')
            raise_if_cancelled()  # not cancelled yet: goes on
            (canceller := threading.Thread(target=cancel)).start()
            canceller.join()
            raise_if_cancelled()
        with pytest.raises(Cancelled), AtomicNdjsonWriter(tmp_path / "b.ndjson", None, MB):
            pass
    raise_if_cancelled()  # outside the scope: nothing to stop
    assert list(tmp_path.iterdir()) == []


def test_a_call_that_gets_to_make_its_file_after_its_fan_out_was_cancelled_makes_none(tmp_path):
    """A download whose answer's head arrives after Ctrl+C, past the fan-out's grace and after the step removed its
    temporary files: it makes no file then (the process is about to end and would leave a ``.part`` behind)."""
    assert threading.current_thread() is threading.main_thread(), "a signal reaches the main thread only"
    started, answered, outcome = threading.Event(), threading.Event(), []

    def late_answer() -> None:
        started.set()
        answered.wait(DEADLINE_SECONDS)  # stalled past the grace; the caller does not wait for it
        try:
            with AtomicNdjsonWriter(tmp_path / "late.ndjson", None, MB) as out:
                out.write(b'{"resourceType":"A"}\n')
        except BaseException as exc:
            outcome.append(exc)
            raise
        outcome.append("written")

    def interrupt() -> None:
        started.wait(DEADLINE_SECONDS)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_bounded([late_answer], workers=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    remove_partial_files(tmp_path)  # what every step does after its fan-out
    answered.set()
    wait_until(lambda: outcome, "the late call ended", timeout=DEADLINE_SECONDS)
    assert isinstance(outcome[0], Cancelled)
    assert list(tmp_path.iterdir()) == []


def test_a_zstd_file_that_opens_with_a_skippable_frame_is_read_as_zstd(tmp_path):
    """pzstd, zstd's own parallel tool, starts every file with a skippable frame (RFC 8878 3.1.2)."""
    content = b"\n".join(SPANNED_LINES) + b"\n"
    frame = zstandard.ZstdCompressor().compress(content)
    path = tmp_path / "pzstd.ndjson.zst"
    path.write_bytes(struct.pack("<III", 0x184D2A50, 4, len(frame)) + frame)

    assert is_zstd(path)
    assert b"".join(iter_chunks(path)) == content
    assert count_resources(path, MB) == 120


def test_a_zstd_stream_cut_anywhere_but_between_frames_is_refused_as_truncated():
    """A skippable frame, a frame of a compressed, an RLE and a raw block with a checksum, and a frame of one block
    without: fed in pieces of 1, 5 or all its bytes, each cut between frames reads back the frames before it, each
    cut elsewhere is an error (zstandard's reader itself ends such a stream as if complete)."""
    lines = b"".join(b'{"resourceType":"Patient","id":"%d"}\n' % number for number in range(40))
    writer = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()
    contents = [lines, b"x" * (128 << 10), random.Random(1).randbytes(300) + b"\n"]
    first = b"".join(writer.compress(part) + writer.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) for part in contents)
    first += writer.flush()
    second = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(lines)
    skippable = struct.pack("<III", 0x184D2A50, 4, len(first))
    stream = skippable + first + second
    first_content = b"".join(contents)
    whole_at = {len(skippable): b"", len(stream) - len(second): first_content, len(stream): first_content + lines}

    for cut in range(len(ZSTD_MAGIC), len(stream) + 1):
        decoder, step = StreamDecoder("cut.ndjson.zst"), (1, 5, cut)[cut % 3]
        try:
            read = [piece for at in range(0, cut, step) for piece in decoder.feed(stream[at : min(at + step, cut)])]
            read += decoder.finish()
        except NdjsonError as error:
            assert cut not in whole_at and "cut.ndjson.zst: not readable as zstd" in str(error)
            assert "they are truncated" in str(error)
        else:
            assert cut in whole_at and b"".join(read) == whole_at[cut]


def test_a_signal_a_call_raises_on_a_fan_outs_thread_is_raised_to_the_caller_once_the_calls_ended():
    """Prefect raises its ``Pause`` (a ``BaseException``) at a task's end once the run is suspended: on the fan-out's
    threads it once ended each thread with a traceback on the terminal, left the call's outcome None and the step
    failed on it with a TypeError."""

    class Signal(BaseException):
        pass

    started, ran, hooked = threading.Barrier(2), [], []

    def signalled(together: bool) -> None:
        if together:
            started.wait(timeout=30)
        raise Signal

    def other(together: bool) -> None:
        if together:
            started.wait(timeout=30)
        ran.append(together)

    previous, threading.excepthook = threading.excepthook, hooked.append
    try:
        for together in (True, False):  # beside another call, then before one on the same thread
            calls = [functools.partial(signalled, together), functools.partial(other, together)]
            with pytest.raises(Signal):
                run_bounded(calls, workers=2 if together else 1)
    finally:
        threading.excepthook = previous
    assert hooked == [] and ran == [True]  # the call beside it ended first; none started after it


def test_a_cancel_of_an_outer_scope_stops_the_threads_of_a_fan_out_inside_it_and_its_waits():
    """A job's run holds one scope a Cancel on the server ends (``flows.job_stop``): a step's fan-out opened inside
    it (its own scope, in copies of the context) and a poll's wait (``pause``) must end with it. The fan-out's
    scope was once let go of by the outer one as soon as it was opened, and a Cancel reached no import thread."""
    started, stopped = threading.Barrier(3), []

    def work() -> None:
        started.wait(timeout=30)
        try:
            while True:
                pause(0.05)
        except Cancelled:
            stopped.append(threading.current_thread().name)

    with cancel_scope() as cancel:
        threading.Timer(0, lambda: (started.wait(timeout=30), cancel())).start()
        outcomes = run_bounded([work, work], workers=2)

    assert len(stopped) == 2 and outcomes == [None, None]
    with cancel_scope() as cancel:
        cancel()
        with pytest.raises(Cancelled):
            pause(3600)
