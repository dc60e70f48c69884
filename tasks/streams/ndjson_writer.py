"""Write data files, each line checked as the bytes stream.

Why: a binary file, a stray text line or a truncated file never travels to the next step as finished
NDJSON. See docs/development.md#streams.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import BinaryIO

import zstandard

from tasks.streams.fanout import raise_if_cancelled, unless_cancelled
from tasks.streams.files import close_synced, start_writeback
from tasks.streams.line_check import LineChecker, LineCounts, check_plain_span
from tasks.streams.ndjson import (
    PART_PREFIX,
    PART_SUFFIX,
    ZSTD_LEVELS,
    CompressionLevel,
    FileStats,
    NdjsonError,
    is_zstd,
    iter_chunks,
)
from tasks.streams.processes import (
    ProcessCalls,
    pool_size,
    processes_allowed,
    run_in_process,
    start_workers,
)

# A plain file of at least this size whose writer is told its size (local_import's) is checked in
# worker processes beside the copy; below, the pool's start costs more. Downloads check as lines
# arrive (read back: a third more CPU).
CHECK_IN_PROCESS_MIN_BYTES = 16 << 20
# a large plain file is checked in spans of about this size as it is written
SPAN_MIN_BYTES = 8 << 20
CUT_READ_BYTES = 64 << 10
COPY_PIECE_BYTES = 64 << 20
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
# the disk is asked to write the file out (``start_writeback``) every this many bytes
WRITEBACK_BYTES = 8 << 20
ZSTD_THREAD = {"threads": 1, "job_size": 2 << 20, "overlap_log": 1}  # 9.4 MB a context, not 5.5


class AtomicNdjsonWriter:
    """Write ``dest`` through a hidden temporary file, synced and renamed on success.

    Note: deleted on any exception; ``stats`` is set after a successful close; ``source`` names the
    data in errors; the writeback starts every ``WRITEBACK_BYTES``.
    Note: ``expected_size`` lets a large plain file be checked in worker processes, in spans as it
    is written, so the writing thread only moves bytes (a bad line is reported once the whole file
    is written); a cancel of the fan-out stops that check.
    Why: ``size_hint`` (never a pledge) sizes the zstd context: 0.27 MB for a 12.7 KB file instead
    of 5.5 MB at the default level, held by every file written at once.
    Why: ``zstd_thread`` compresses in a zstd thread of the writer's own, as ``zstd -T1`` does, for
    a writer fed from a thread that shares the GIL with others (a download's): on a busy machine the
    downloading threads got half the CPU time zstd alone did to compress.
    """

    def __init__(
        self,
        dest: Path,
        level: CompressionLevel | None,
        max_line_bytes: int,
        source: str | None = None,
        expected_size: int | None = None,
        size_hint: int | None = None,
        zstd_thread: bool = False,
    ):
        self.dest, self._max_line_bytes = dest, max_line_bytes
        threads = ZSTD_THREAD if zstd_thread else {}  # zstd's default: no thread of its own
        self._zstd_params = (  # None: a plain file
            None
            if level is None
            else zstandard.ZstdCompressionParameters.from_level(
                ZSTD_LEVELS[level], source_size=size_hint or 0, **threads
            )
        )
        # absolute: a worker checking it keeps the directory it started in
        self.part = dest.absolute().with_name(f"{PART_PREFIX}{dest.name}{PART_SUFFIX}")
        self._source = source or str(dest)
        check_later = (
            level is None
            and (expected_size or 0) >= CHECK_IN_PROCESS_MIN_BYTES
            and processes_allowed()
        )
        # None: in a worker
        self._checker = None if check_later else LineChecker(self._source, max_line_bytes)
        # of the spans written so far (``_check_span``)
        self._checks = ProcessCalls(check_plain_span)
        self._checked_to = self._written = self._since_writeback = 0
        if check_later:
            start_workers(check_plain_span.__module__)  # ready for the first span
        self._ends_with_newline = True
        self.stats: FileStats | None = None

    def __enter__(self) -> AtomicNdjsonWriter:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        # the step removes temporary files after a cancelled fan-out: none may come later
        with unless_cancelled():
            self._raw = open(self.part, "wb")
        if self._zstd_params is None:
            self._out: BinaryIO = self._raw
        else:
            compressor = zstandard.ZstdCompressor(compression_params=self._zstd_params)
            self._out = compressor.stream_writer(self._raw, closefd=False)
        return self

    def write(self, chunk: bytes) -> None:
        """Append raw NDJSON bytes (any chunking; lines may span calls)."""
        if not chunk:
            return
        if self._checker is not None:
            self._checker.feed(chunk)
        self._out.write(chunk)
        self._ends_with_newline = chunk.endswith(b"\n")
        if self._checker is None:
            self._written += len(chunk)
            if (
                self._written - self._checked_to >= SPAN_MIN_BYTES
                and (newline := chunk.rfind(b"\n")) >= 0
            ):
                self._check_span(self._written - len(chunk) + newline + 1)
        self._since_writeback += len(chunk)
        if self._since_writeback >= WRITEBACK_BYTES:
            self._raw.flush()  # what the compressor gave so far; its frame goes on unchanged
            start_writeback(self._raw.fileno())
            self._since_writeback = 0

    def copy(self, source: Path) -> Iterator[int]:
        """Append data file ``source``'s content (decompressed); yield the sizes written.

        Note: a plain file is copied in the kernel (``os.copy_file_range``) when workers check this
        writer's output.
        """
        if self._checker is None and not is_zstd(source):
            self._raw.flush()
            with open(source, "rb", buffering=0) as data:
                copy_piece = functools.partial(
                    os.copy_file_range, data.fileno(), self._raw.fileno(), COPY_PIECE_BYTES
                )
                try:
                    copied = copy_piece()
                # not between these files (another file system since Linux 5.19), or no such call
                except OSError as exc:
                    if exc.errno not in NO_KERNEL_COPY:
                        raise
                else:
                    while copied:
                        self._written += copied
                        yield copied
                        copied = copy_piece()
                    if (size := data.seek(0, os.SEEK_END)) > 0:
                        self._ends_with_newline = os.pread(data.fileno(), 1, size - 1) == b"\n"
                    return
        for chunk in iter_chunks(source, shown=self._source):
            self.write(chunk)
            yield len(chunk)

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None:
            self.discard()
            return
        try:
            # the checker's last line, or the workers' last spans, cut for every worker now (a line
            # broken at the end is the last span's; the final newline comes after it): checked
            # while the file goes to the disk
            if self._checker is not None:
                self._checker.finish()
            else:
                self._raw.flush()
                for end in span_ends(self.part, self._checked_to, self._written):
                    self._check_span(end)
            if not self._ends_with_newline:
                self._out.write(b"\n")
            if self._out is not self._raw:
                self._out.close()
            close_synced(self._raw)
            checked = self._summed() if self._checker is None else self._checker.counts()
            os.replace(self.part, self.dest)
        except BaseException:
            self.discard()
            raise
        found = self.dest.stat()
        self.stats = FileStats(found.st_size, *checked, modified_ns=found.st_mtime_ns)

    def _check_span(self, end: int) -> None:
        """Start the check of the bytes from the last span's end to ``end`` in a worker."""
        self._raw.flush()
        self._checks.start(self.part, self._source, self._max_line_bytes, self._checked_to, end)
        self._checked_to = end

    def _summed(self) -> LineCounts:
        """Add up the spans' counts; a bad line is judged in the whole data."""
        whole = (self.part, self._source, self._max_line_bytes, 0, self._written)
        try:
            return LineCounts(
                *map(sum, zip(*self._checks.results(raise_if_cancelled), strict=True))
            )
        except NdjsonError:
            run_in_process(check_plain_span, *whole, stop_if_cancelled=raise_if_cancelled)
            raise
        # a worker died under the check (the OOM killer, a kill): check it here
        except BrokenProcessPool:
            return check_plain_span(*whole)

    def discard(self) -> None:
        """Close and delete the temporary file (as an exception leaving the ``with`` does)."""
        self._checks.cancel()
        try:
            self._raw.close()
        finally:
            self.part.unlink(missing_ok=True)


def span_ends(path: Path, start: int, end: int) -> list[int]:
    """Cut bytes ``start``-``end`` after newlines, a span a worker at most; the ends.

    Note: each at least ``SPAN_MIN_BYTES``, cut at the first newline from an equal share on.
    """
    count = max(1, min(pool_size(), (end - start) // SPAN_MIN_BYTES))
    cuts = [start]
    with open(path, "rb") as data:
        for share in range(1, count):
            data.seek(max(cuts[-1], start + (end - start) * share // count))
            while (piece := data.readline(CUT_READ_BYTES)) and not piece.endswith(b"\n"):
                pass
            if not piece:
                break
            cuts.append(data.tell())
    return [last for first, last in itertools.pairwise([*cuts, end]) if last > first] or [end]
