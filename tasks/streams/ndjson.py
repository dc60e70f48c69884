"""The one streaming primitive for NDJSON files, plain or zstd-compressed.

Every step reads and writes data files through this module, so that all of them share the same
rules: zstd is recognised by its magic bytes (not by the file name), a line longer than
``pipeline.max_ndjson_line_size_mb`` is an error naming the file and line, memory stays flat
whatever the file size, and a file is only ever visible under its final name once it is complete
(written to ``.<name>.part`` and renamed).

Content is checked while it streams (a large plain file: by a worker process once written, before its rename):
every non-blank line must be a JSON object with a ``resourceType`` (a binary file or a stray text line never
travels to the next step), and a last line without a newline must be complete (a truncated file is never taken
for a finished one). Blank lines in a row count together against the line limit: more than
``pipeline.max_ndjson_line_size_mb`` of them is an error too (a file of nothing but newlines is no data). The check
validates with simdjson (no Python objects are built) and hands every line simdjson does not prove a resource to
orjson, so it accepts exactly what ``parse_resource`` accepts and reports errors in its words. File names are
checked too, by the one rule for names from data (``tasks.core.names.name_from_data_problem``).

A file can be read a span of lines at a time (``Span``, cut by ``line_spans`` at line starts, numbered as in the
whole file), so that several processes share one large file: a plain file's span is read from its offset, a zstd
file's is decompressed from the start, the bytes before it dropped.

zstd is decompressed in pieces of at most ``ZSTD_OUTPUT_PIECE`` (1 MiB), whatever the compression ratio, so a
decompression bomb (a few hundred KB that unpack to gigabytes of one byte) costs no more memory than a real file:
each decompression call is fed at most ``ZSTD_BLOCKS_PER_PIECE`` zstd blocks (``ZstdBlockCutter``).
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, NamedTuple

import orjson
import simdjson
import zstandard

from tasks.core.errors import StepError
from tasks.core.names import name_from_data_problem, show_name
from tasks.streams.processes import never_cancelled, processes_allowed, run_in_process

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UTF8_BOM = b"\xef\xbb\xbf"
PARSER_KEPT_BYTES = 1 << 20  # a line checker keeps simdjson's buffers for lines up to this size, not larger
CHUNK_SIZE = 1 << 20
ZSTD_BLOCK_MAX = 128 << 10  # the most a zstd block decompresses to (RFC 8878)
ZSTD_BLOCKS_PER_PIECE = 8  # zstd blocks per decompression call: about 70 KB in at FHIR's 15:1
ZSTD_OUTPUT_PIECE = ZSTD_BLOCKS_PER_PIECE * ZSTD_BLOCK_MAX  # the most one decompression call gives, at any ratio
# A plain file of at least this size is checked in a worker process once written, not line by line in the writing
# thread: the check holds the GIL, and there it took half a download's speed. Below it the pool's start costs more.
CHECK_IN_PROCESS_MIN_BYTES = 16 << 20
DATA_SUFFIXES = (".ndjson", ".ndjson.zst")
PART_PREFIX = "."
PART_SUFFIX = ".part"
BLANK_BYTES = b" \t\r\n\x0b\x0c"  # what ``bytes.strip`` removes

# zstd levels matching the spec's speed/ratio table on FHIR NDJSON (measured with
# tests/benchmarks/bench_compression.py on a 2-core machine; figures in the README).
ZSTD_LEVELS: dict[str, int] = {"fastest": 1, "default": 5, "better": 9, "best": 12}

CompressionLevel = Literal["fastest", "default", "better", "best"]


class NdjsonError(StepError):
    """A data file that cannot be read as NDJSON; the message names the file and what to do."""


class TruncatedLineError(NdjsonError):
    """The data end without a newline in the middle of a line: they were cut off (a broken download)."""


class UnsafeNameError(NdjsonError):
    """A file name that cannot be used in a job directory (control characters, too long, ...)."""


class LineTooLongError(NdjsonError):
    def __init__(self, path: Path | str, line_number: int, limit_bytes: int):
        self.path, self.line_number, self.limit_bytes = path, line_number, limit_bytes
        super().__init__(
            f"{path}: line {line_number} is longer than {limit_bytes // (1024 * 1024)} MB; "
            "raise pipeline.max_ndjson_line_size_mb if such large resources are expected"
        )

    def __reduce__(self):  # it travels back from a worker process (check_plain_file)
        return type(self), (self.path, self.line_number, self.limit_bytes)


@dataclass(frozen=True)
class FileStats:
    """What a written data file holds: bytes on disk, resources (non-empty lines, a Bundle counts as one), and of
    those the ``bundles`` (Bundle resources) with the ``bundled`` resources their entries hold."""

    size: int
    resources: int
    bundles: int = 0
    bundled: int = 0


class LineCounts(NamedTuple):
    """A checked stream's counts (a tuple: it travels back from a worker process): ``FileStats`` without the size."""

    resources: int
    bundles: int
    bundled: int


def is_data_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(DATA_SUFFIXES) and not is_partial(path)


def is_partial(path: Path) -> bool:
    return path.name.startswith(PART_PREFIX) and path.name.endswith(PART_SUFFIX)


def output_name(name: str, compress: bool) -> str:
    """``core.ndjson.zst`` / ``batch`` / ``a.json`` → ``<stem>.ndjson`` (+ ``.zst`` when compressing).

    Raises ``UnsafeNameError`` for a name that ``check_file_name`` refuses.
    """
    stem = name
    for suffix in (".zst", ".ndjson", ".json"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
    output = stem + (".ndjson.zst" if compress else ".ndjson")
    check_file_name(output)
    return output


def check_file_name(name: str) -> None:
    """Refuse a name that breaks ``tasks.core.names.name_from_data_problem``, the one rule for names from data
    (control and bidi characters would split a ``status`` line or make a name display as another)."""
    if problem := name_from_data_problem(name):
        raise UnsafeNameError(f"the file name {show_name(name)} {problem}; rename it")


def content_bytes(path: Path, enough: int) -> int:
    """The size of the file's content as read (decompressed), counted up to ``enough``: a plain file's size, or a zstd
    file decompressed only that far (deciding how to split work needs no more, and a whole pass would cost as much
    as reading the file)."""
    if not is_zstd(path):
        return path.stat().st_size
    counted = 0
    with closing(iter_chunks(path)) as chunks:
        for chunk in chunks:
            counted += len(chunk)
            if counted >= enough:
                break
    return counted


def is_zstd(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == ZSTD_MAGIC


@dataclass(frozen=True)
class Span:
    """A run of whole lines of a data file: from offset ``start`` (the first byte of a line) to ``end`` (just after a
    newline; None: the end of the file), offsets into its decompressed content. ``lines_before`` (the newlines before
    ``start``) numbers its lines as in the whole file; ``lines`` counts its newlines (0: not counted)."""

    start: int = 0
    end: int | None = None
    lines_before: int = 0
    lines: int = 0

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None


WHOLE_FILE = Span()


def iter_chunks(path: Path, span: Span = WHOLE_FILE) -> Iterator[bytes]:
    """The decompressed content of a data file (or of a span of it), in chunks; zstd is detected by its magic bytes.
    A plain file's span is read from its start; a zstd file's is decompressed from the file's start, the bytes
    before the span dropped (a zstd stream cannot be entered in the middle)."""
    if span.whole:
        yield from decompress_if_zstd(raw_chunks(path), str(path))
        return
    if is_zstd(path):
        chunks = bytes_after(decompress_if_zstd(raw_chunks(path), str(path)), span.start)
    else:
        chunks = raw_chunks(path, span.start)
    yield from chunks if span.end is None else bytes_upto(chunks, span.end - span.start)


def raw_chunks(path: Path | str, offset: int = 0) -> Iterator[bytes]:
    """The bytes of a file as they are on disk from ``offset``, in chunks. One ``read`` call each (unbuffered): a
    buffered read of a pipe loops in C until the chunk is full, and a Ctrl+C that came between two of its reads was
    lost until the writer sent more."""
    with open(path, "rb", buffering=0) as raw:
        if offset:
            raw.seek(offset)
        yield from iter(lambda: raw.read(CHUNK_SIZE), b"")


def bytes_after(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    """``chunks`` without their first ``count`` bytes."""
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:] if count else chunk
        count = 0


def bytes_upto(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    """The first ``count`` bytes of ``chunks`` (the rest is not read)."""
    for chunk in chunks:
        if count <= 0:
            return
        yield chunk[:count] if len(chunk) > count else chunk
        count -= len(chunk)


def line_spans(path: Path, count: int, mark_bytes: int) -> list[Span]:
    """``path`` cut at line starts into at most ``count`` spans of about equal bytes (of its decompressed content),
    in one pass that also counts each span's lines; reading the spans one after the other gives the file's lines.
    The pass notes the first line start after every ``mark_bytes`` (the places it may cut at), so memory stays
    flat."""
    marks = [(0, 0)]  # (offset of a line's start, newlines before it)
    offset = lines = 0
    for chunk in iter_chunks(path):
        position = marks[-1][0] + mark_bytes - offset
        while position < len(chunk) and (newline := chunk.find(b"\n", max(position, 0))) != -1:
            marks.append((offset + newline + 1, lines + chunk.count(b"\n", 0, newline + 1)))
            position = newline + 1 + mark_bytes
        lines += chunk.count(b"\n")
        offset += len(chunk)
    starts = [start for start, _ in marks]
    cuts = sorted({bisect.bisect_left(starts, offset * i // count) for i in range(1, count)})
    bounds = [marks[0], *(marks[i] for i in cuts if i < len(marks) and 0 < marks[i][0] < offset), (offset, lines)]
    return [
        Span(start, None if end == offset else end, before, after - before)
        for (start, before), (end, after) in itertools.pairwise(bounds)
    ]


def decompress_if_zstd(chunks: Iterable[bytes], source: str) -> Iterator[bytes]:
    """Pass plain bytes through; decompress a zstd stream (by its magic bytes): ``StreamDecoder`` over ``chunks``."""
    decoder = StreamDecoder(source)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.finish()


class StreamDecoder:
    """Bytes fed in as they come (``feed``, then ``finish``): plain bytes pass through, a zstd stream (by its magic
    bytes) comes out decompressed, frame after frame, in pieces of at most ``ZSTD_OUTPUT_PIECE`` bytes whatever the
    compression ratio (``ZstdBlockCutter``). Fed rather than iterated, so that a download can go on feeding it from
    a second connection after the first broke.

    A stream that ends in the middle of a frame is an error: zstd stream readers end silently there,
    which would make a truncated file look complete. ``source`` names the data in errors.
    """

    def __init__(self, source: str):
        self._source = source
        self._head = b""  # the first bytes, until there are enough to tell zstd by its magic bytes
        self._is_zstd: bool | None = None
        self._context = zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._frame_has_input = False
        self._cutter = ZstdBlockCutter()

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if self._is_zstd is None:
            self._head += chunk
            if len(self._head) < len(ZSTD_MAGIC):
                return
            chunk, self._head = self._head, b""
            self._is_zstd = chunk.startswith(ZSTD_MAGIC)
        if not self._is_zstd:
            yield chunk
            return
        try:
            for data in self._cutter.pieces(chunk):
                yield from self._decompress(data)
        except zstandard.ZstdError as exc:
            raise NdjsonError(f"{self._source}: not readable as zstd ({exc}); the data are damaged") from exc

    def finish(self) -> Iterator[bytes]:
        if self._head:  # fewer bytes than zstd's magic: plain
            yield self._head
        if self._frame_has_input:
            raise NdjsonError(
                f"{self._source}: not readable as zstd (the data end in the middle of a frame); they are truncated"
            )

    def _decompress(self, data: memoryview | bytes) -> Iterator[bytes]:
        while data:
            self._frame_has_input = True
            if out := self._frame.decompress(data):
                yield out
            if not self._frame.eof:
                return
            data = self._frame.unused_data
            self._frame, self._frame_has_input = self._context.decompressobj(), False


class ZstdBlockCutter:
    """Cuts a zstd stream into pieces that each end at most ``ZSTD_BLOCKS_PER_PIECE`` blocks, so that each
    decompresses to at most ``ZSTD_OUTPUT_PIECE`` bytes.

    zstandard's ``decompressobj().decompress`` has no output limit: a 64 KiB slice of a decompression bomb (runs
    of one byte, 4 bytes per 128 KiB block) came out as 2 GB at once. A zstd block never holds more than
    ``ZSTD_BLOCK_MAX`` bytes (RFC 8878), and the decoder only writes a block once all of it has arrived, so
    counting block ends bounds every call's output whatever the ratio. The cutter reads only the frame and block
    headers (a few per 128 KiB of output); it never decides what the data are: the decoder still checks them and
    reports damage and truncation. Where the headers stop making sense (damaged data, not a zstd frame) it stops
    cutting and leaves the error to the decoder.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._need = 4  # header bytes wanted next, read by ``_on_header``
        self._on_header = self._frame_magic
        self._skip = 0  # bytes to pass before the next header
        self._in_block = False  # the bytes skipped are a block's content
        self._checksum = 0  # bytes of checksum after the frame's last block
        self._last_block = False
        self._block_ends = 0  # in the current piece
        self._lost = False

    def pieces(self, chunk: bytes) -> Iterator[memoryview]:
        """``chunk``, the next bytes of the stream, cut where pieces must end."""
        with memoryview(chunk) as view:
            start = 0
            for end in self._piece_ends(view):
                yield view[start:end]
                start = end
            if start < len(view):
                yield view[start:]

    def _piece_ends(self, view: memoryview) -> Iterator[int]:
        """Offsets in ``view`` after which a piece must end (its last allowed block ended there)."""
        position, size = 0, len(view)
        while position < size and not self._lost:
            if self._skip:
                step = min(self._skip, size - position)
                position += step
                self._skip -= step
            else:
                step = min(self._need - len(self._header), size - position)
                self._header += view[position : position + step]
                position += step
                if len(self._header) < self._need:
                    continue
                header, self._header = bytes(self._header), bytearray()
                self._on_header(header)
            if not self._skip and self._in_block:
                self._in_block = False
                self._end_block()
                self._block_ends += 1
                if self._block_ends == ZSTD_BLOCKS_PER_PIECE:
                    self._block_ends = 0
                    yield position

    def _expect(self, size: int, handler) -> None:
        self._need, self._on_header = size, handler

    def _frame_magic(self, magic: bytes) -> None:
        if magic == ZSTD_MAGIC:
            self._expect(1, self._frame_header_descriptor)
        elif magic[0] & 0xF0 == 0x50 and magic[1:] == b"\x2a\x4d\x18":  # a skippable frame: its size, then data
            self._expect(4, self._skippable_size)
        else:
            self._lost = True

    def _skippable_size(self, size: bytes) -> None:
        self._skip = int.from_bytes(size, "little")
        self._expect(4, self._frame_magic)

    def _frame_header_descriptor(self, descriptor: bytes) -> None:
        flags = descriptor[0]
        single_segment = bool(flags & 0x20)
        content_size_bytes = (1 if single_segment else 0, 2, 4, 8)[flags >> 6]
        self._skip = (0 if single_segment else 1) + (0, 1, 2, 4)[flags & 0x03] + content_size_bytes
        self._checksum = 4 if flags & 0x04 else 0
        self._expect(3, self._block_header)

    def _block_header(self, header: bytes) -> None:
        value = int.from_bytes(header, "little")
        block_type, size = (value >> 1) & 0x03, value >> 3
        if block_type == 3:  # reserved: damaged data
            self._lost = True
            return
        self._last_block = bool(value & 0x01)
        self._skip = 1 if block_type == 1 else size  # an RLE block holds its one byte, repeated ``size`` times
        self._in_block = True

    def _end_block(self) -> None:
        if self._last_block:
            self._skip = self._checksum
            self._expect(4, self._frame_magic)
        else:
            self._expect(3, self._block_header)


def iter_lines(path: Path, max_line_bytes: int, span: Span = WHOLE_FILE) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line)`` for every non-empty line (of ``span``), without its newline. Blank lines in a
    row count against the limit within a span: a run that a cut between spans divides counts as two."""
    pending = bytearray()
    line_number = span.lines_before
    blanks = BlankRun(path, max_line_bytes)
    for chunk in iter_chunks(path, span):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if not pending and (start == end or chunk[start] in BLANK_BYTES):
                run_end, lines = blank_lines_at(chunk, start)
                if lines:
                    blanks.add(line_number + 1, run_end - start)
                    line_number += lines
                    start = run_end
                    continue
            line_number += 1
            if pending:
                pending += chunk[start:end]
                line = bytes(pending)
                pending.clear()
            else:
                line = chunk[start:end]
            if len(line) > max_line_bytes:
                raise LineTooLongError(path, line_number, max_line_bytes)
            if line.strip():
                blanks.end()
                yield line_number, line
            else:
                blanks.add(line_number, len(line) + 1)
            start = end + 1
        pending += chunk[start:]
        if len(pending) > max_line_bytes:
            raise LineTooLongError(path, line_number + 1, max_line_bytes)
    if pending.strip():
        yield line_number + 1, bytes(pending)


def blank_lines_at(chunk: bytes, start: int) -> tuple[int, int]:
    """The run of whole blank lines from ``start`` (a line's start) in ``chunk``: (offset after its last newline,
    lines in it), or ``(start, 0)``. Found at C speed: a file of nothing but newlines (as a decompression bomb
    makes) is not read one line at a time."""
    run_end = chunk.rfind(b"\n", start, first_non_blank(chunk, start)) + 1
    if run_end <= start:
        return start, 0
    return run_end, chunk.count(b"\n", start, run_end)


def first_non_blank(chunk: bytes, start: int) -> int:
    """The offset of the first byte from ``start`` that is not whitespace (``len(chunk)`` if none). Looks through
    windows growing fourfold, so that the work follows the blank run, not what comes after it (``re`` is ten times
    slower at this)."""
    window = 256
    while start < len(chunk):
        end = min(start + window, len(chunk))
        rest = len(chunk[start:end].lstrip())
        if rest:
            return end - rest
        start, window = end, window * 4
    return len(chunk)


class BlankRun:
    """Counts blank lines in a row; more than ``limit`` bytes of them is an error. Blank lines between resources are
    allowed, but gigabytes of them are no NDJSON: a decompression bomb of newlines, read to its end."""

    def __init__(self, source: Path | str, limit: int):
        self._source, self._limit = source, limit
        self._first_line = 0
        self._size = 0

    def add(self, first_line: int, size: int) -> None:
        if not self._size:
            self._first_line = first_line
        self._size += size
        if self._size > self._limit:
            raise NdjsonError(
                f"{self._source}: more than {self._limit // (1024 * 1024)} MB of blank lines from line "
                f"{self._first_line} on (the limit is pipeline.max_ndjson_line_size_mb); this is not NDJSON data: "
                "check how the file was made"
            )

    def end(self) -> None:
        self._size = 0


def iter_resources(path: Path, max_line_bytes: int) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, parsed resource)``; a line that is not a FHIR resource is an error."""
    for line_number, line in iter_lines(path, max_line_bytes):
        yield line_number, parse_resource(path, line_number, line)


def parse_resource(source: Path | str, line_number: int, line: bytes | bytearray | memoryview) -> dict:
    """One NDJSON line as a JSON object with a ``resourceType``; anything else is an error naming the file
    and line (never quoting the line, which may hold patient data)."""
    try:
        resource = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NdjsonError(f"{source}: line {line_number} is not valid JSON ({exc}); the file is not NDJSON") from None
    if not isinstance(resource, dict):
        raise NdjsonError(f"{source}: line {line_number} is not a JSON object; NDJSON holds one resource per line")
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not resource_type:
        raise NdjsonError(f"{source}: line {line_number} is a JSON object without a resourceType, not a FHIR resource")
    return resource


def _is_blank(line: bytes | bytearray | memoryview) -> bool:
    return not bytes(line).strip()


class LineChecker:
    """Counts and checks the lines of a byte stream fed in arbitrary chunks: every non-blank line must be a
    FHIR resource (``parse_resource``'s rules) of at most ``max_line_bytes``. Only a line that spans chunks is
    buffered (bounded by the line limit), so memory stays flat.

    A line is validated by simdjson, which checks all of it (structure, numbers, UTF-8, escapes) without building
    Python objects: four to eight times orjson's speed on FHIR lines. Whatever simdjson does not prove a resource
    goes to ``parse_resource``, which raises orjson's error or accepts what simdjson cannot represent (integers
    beyond 64 bits, nesting at orjson's depth limit). The checker is not thread-safe (one simdjson parser each)."""

    def __init__(self, source: str, max_line_bytes: int):
        self._source = source
        self._max = max_line_bytes
        self._pending = bytearray()
        self._parser = simdjson.Parser()
        self._blanks = BlankRun(source, max_line_bytes)
        self.lines = 0
        self.resources = 0
        self.bundles = 0
        self.bundled = 0

    def feed(self, chunk: bytes) -> None:
        # The parts of a line that spans chunks are appended through a view, without a slice copy.
        with memoryview(chunk) as view:
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if self._pending:
                    self._pending += view[start:end]
                    self._check_line(bytes(self._pending))
                    self._pending = bytearray()
                elif (start == end or chunk[start] in BLANK_BYTES) and (after := self._skip_blank_lines(chunk, start)):
                    start = after
                    continue
                else:
                    self._check_line(chunk[start:end])  # a bytes copy: simdjson parses bytes faster than a view
                start = end + 1
            if len(self._pending) + len(chunk) - start > self._max:
                raise LineTooLongError(self._source, self.lines + 1, self._max)
            self._pending += view[start:]

    def _skip_blank_lines(self, chunk: bytes, start: int) -> int:
        """Count the blank lines from ``start`` at once (``blank_lines_at``): the offset after them, 0 if none."""
        after, lines = blank_lines_at(chunk, start)
        if not lines:
            return 0
        self._blanks.add(self.lines + 1, after - start)
        self.lines += lines
        return after

    def finish(self) -> None:
        """Check the last line when the data do not end with a newline: it must be a complete resource."""
        if not self._pending or _is_blank(self._pending):
            return
        try:
            self._check_line(bytes(self._pending))
        except LineTooLongError:
            raise
        except NdjsonError:
            raise TruncatedLineError(
                f"{self._source}: the data end in the middle of line {self.lines}, without a newline; "
                "they are truncated"
            ) from None
        finally:
            self._pending = bytearray()

    def _check_line(self, line: bytes) -> None:
        self.lines += 1
        if len(line) > self._max:
            raise LineTooLongError(self._source, self.lines, self._max)
        if not line or (line[0] in b" \t\r" and _is_blank(line)):
            self._blanks.add(self.lines, len(line) + 1)
            return
        self._blanks.end()
        if not self._is_resource(line):
            self._count_bundle(parse_resource(self._source, self.lines, line))
        if len(line) > PARSER_KEPT_BYTES:  # simdjson's buffers grow to twice the largest line: give them back
            self._parser = simdjson.Parser()
        self.resources += 1

    def _is_resource(self, line: bytes) -> bool:
        """True when simdjson proves ``line`` a resource; False leaves the verdict to ``parse_resource``."""
        if line.startswith(UTF8_BOM):  # simdjson skips a byte order mark, orjson refuses it
            return False
        try:
            document = self._parser.parse(line)
        except (ValueError, RuntimeError):  # invalid JSON, too deep, a big integer (UnicodeDecodeError included)
            return False
        try:
            if type(document) is not simdjson.Object:
                return False
            # orjson keeps the last of duplicate keys, simdjson's lookup finds the first: only a single key is sure.
            keys = 0
            for key in document:
                if key == "resourceType":
                    keys += 1
            resource_type = document.get("resourceType") if keys == 1 else None
            if type(resource_type) is not str or resource_type == "":
                return False
            if resource_type == "Bundle":  # counted from the parsed document: never a second parse
                entry = document.get("entry")
                self._add_bundle(len(entry) if type(entry) is simdjson.Array else 0)
            return True
        finally:
            del document  # the parser cannot parse again while a proxy into its document is alive

    def _count_bundle(self, resource: dict) -> None:
        if resource["resourceType"] == "Bundle":
            entry = resource.get("entry")
            self._add_bundle(len(entry) if type(entry) is list else 0)

    def _add_bundle(self, entries: int) -> None:
        self.bundles += 1
        self.bundled += entries

    def counts(self) -> LineCounts:
        return LineCounts(self.resources, self.bundles, self.bundled)


class AtomicNdjsonWriter:
    """Writes ``dest`` through a hidden temporary file, compressing with zstd when asked.

    Use as a context manager: on success the temporary file is synced and renamed to ``dest``; on
    any exception (including KeyboardInterrupt) it is deleted, so a half-written file is never
    taken for a finished one. ``stats`` is set after a successful close. ``source`` names the data's
    origin (input file, URL) in errors about its lines; it defaults to ``dest``.

    ``expected_size`` (the source's size or Content-Length, when known; for a compressed source its compressed
    size) lets a large plain file be checked in a worker process after the last write, before the rename
    (``check_plain_file``), so that the writing thread only moves bytes. The verdict and messages are the same;
    a bad line is reported once the whole file is written (a download broken after it: as the broken download).
    ``stop_if_cancelled`` is called while that check runs and raises to stop it (a cancelled fan-out's check).
    """

    def __init__(
        self,
        dest: Path,
        level: CompressionLevel | None,
        max_line_bytes: int,
        source: str | None = None,
        expected_size: int | None = None,
        stop_if_cancelled: Callable[[], None] = never_cancelled,
    ):
        self.dest = dest
        self.part = dest.with_name(f"{PART_PREFIX}{dest.name}{PART_SUFFIX}")
        self._level = level
        self._source = source or str(dest)
        self._max_line_bytes = max_line_bytes
        self._stop_if_cancelled = stop_if_cancelled
        check_later = level is None and (expected_size or 0) >= CHECK_IN_PROCESS_MIN_BYTES and processes_allowed()
        self._checker = None if check_later else LineChecker(self._source, max_line_bytes)  # None: in a worker
        self._ends_with_newline = True
        self.stats: FileStats | None = None

    def __enter__(self) -> AtomicNdjsonWriter:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self._raw = open(self.part, "wb")
        if self._level is None:
            self._out: BinaryIO = self._raw
        else:
            compressor = zstandard.ZstdCompressor(level=ZSTD_LEVELS[self._level], threads=0)
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

    def write_line(self, line: bytes) -> None:
        self.write(line + b"\n")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()
            return
        try:
            counts = self._checked_counts()
            if not self._ends_with_newline:
                self._out.write(b"\n")
            if self._out is not self._raw:
                self._out.close()
            self._raw.flush()
            os.fsync(self._raw.fileno())
            self._raw.close()
            os.replace(self.part, self.dest)
        except BaseException:
            self.discard()
            raise
        self.stats = FileStats(self.dest.stat().st_size, *counts)

    def _checked_counts(self) -> LineCounts:
        if self._checker is not None:
            self._checker.finish()
            return self._checker.counts()
        self._raw.flush()
        part = os.fspath(self.part.absolute())  # a worker keeps the directory it started in
        try:
            return run_in_process(
                check_plain_file, part, self._source, self._max_line_bytes, stop_if_cancelled=self._stop_if_cancelled
            )
        except BrokenProcessPool:  # a worker died under the check (the OOM killer, a kill): check it here
            return check_plain_file(part, self._source, self._max_line_bytes)

    def discard(self) -> None:
        """Close and delete the temporary file (what leaving the ``with`` block by an exception does)."""
        try:
            self._raw.close()
        finally:
            self.part.unlink(missing_ok=True)


def remove_partial_files(folder: Path) -> None:
    """Delete temporary files a killed process left behind (they are never resumed from)."""
    if folder.is_dir():
        for path in folder.iterdir():
            if is_partial(path):
                path.unlink(missing_ok=True)


def count_resources(path: Path, max_line_bytes: int) -> int:
    """The resources (lines) of a data file, each line checked like ``AtomicNdjsonWriter`` checks it."""
    return count_contents(path, max_line_bytes).resources


def count_contents(path: Path, max_line_bytes: int) -> LineCounts:
    """What a data file holds (resources, Bundles and their entries), each line checked like
    ``AtomicNdjsonWriter`` checks it."""
    return _checked_counts(iter_chunks(path), str(path), max_line_bytes)


def check_plain_file(path: str, source: str, max_line_bytes: int) -> LineCounts:
    """What ``path`` holds read as it is (never decompressed: the writer wrote these very bytes), each line
    checked as ``AtomicNdjsonWriter`` checks it; errors name ``source``. Runs in a worker process."""
    return _checked_counts(raw_chunks(path), source, max_line_bytes)


def _checked_counts(chunks: Iterator[bytes], source: str, max_line_bytes: int) -> LineCounts:
    checker = LineChecker(source, max_line_bytes)
    for chunk in chunks:
        checker.feed(chunk)
    checker.finish()
    return checker.counts()
