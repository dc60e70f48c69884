"""The one streaming primitive for NDJSON files, plain or zstd.

See docs/development.md#streams.
"""

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import orjson
import zstandard

from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.core.names import name_from_data_problem, show_name

T = TypeVar("T")

CHUNK_SIZE = 1 << 20
# the largest zstd window a decoder allows by default (ZSTD_WINDOWLOG_LIMIT_DEFAULT)
MAX_WINDOW_BYTES = 1 << 27
# magic, descriptor, window, dictionary id and content size (RFC 8878 3.1.1)
ZSTD_FRAME_HEADER_MAX = 18
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
END_TEXT = b"the end of a zstd stream"
END_FRAME = zstandard.ZstdCompressor(write_checksum=True).compress(END_TEXT)
DATA_SUFFIXES = (".ndjson", ".ndjson.zst")
PART_PREFIX = "."
PART_SUFFIX = ".part"
BLANK_BYTES = b" \t\r\n\x0b\x0c"  # what ``bytes.strip`` removes
# ``bytes.split`` reads every byte (0.4 ns each), one by one a line costs 300 ns: split chunks whose
# first 4 KiB hold lines of 400 bytes or less on average (Patient's 240: in half the time), not over
# one per 16 (a bomb of newlines).
SPLIT_PROBE_BYTES, SPLIT_LINE_BYTES, MIN_LINE_BYTES = 4096, 400, 16

# zstd levels matching the spec's speed/ratio table on FHIR NDJSON (measured with
# tests/benchmarks/bench_compression.py on a 2-core machine; figures in the README).
ZSTD_LEVELS: dict[str, int] = {"fastest": 1, "default": 5, "better": 9, "best": 12}

CompressionLevel = Literal["fastest", "default", "better", "best"]


class NdjsonError(StepError):
    """A data file that cannot be read as NDJSON; the message names file and fix."""


class TruncatedLineError(NdjsonError):
    """The data end without a newline in the middle of a line: they were cut off."""


class UnsafeNameError(NdjsonError):
    """A file name unfit for a job directory (control characters, too long, ...)."""


class LineTooLongError(NdjsonError):
    def __init__(self, path: Path | str, line_number: int, limit_bytes: int):
        self.path, self.line_number = path, line_number
        super().__init__(
            f"{path}: line {line_number} is longer than {limit_bytes // (1024 * 1024)} MB; raise "
            "pipeline.max_ndjson_line_size_mb if such large resources are expected"
        )


@dataclass(frozen=True)
class FileStats:
    """What a written data file holds: bytes, resources (non-empty lines), bundles.

    Note: ``bundles`` counts the Bundles among the resources, ``bundled`` the resources their
    entries hold.
    """

    size: int
    resources: int
    bundles: int = 0
    bundled: int = 0
    modified_ns: int | None = None  # the file's time of change when it was counted


def output_name(name: str, compress: bool) -> str:
    """Name ``a.ndjson.zst`` / ``batch`` / ``a.json`` ``<stem>.ndjson`` (+ ``.zst``).

    Note: a name breaking the rule for names from data (``name_from_data_problem``) is refused.
    """
    stem = name
    for suffix in (".zst", ".ndjson", ".json"):
        if len(stem) > len(suffix):
            stem = stem.removesuffix(suffix)
    output = stem + (".ndjson.zst" if compress else ".ndjson")
    if problem := name_from_data_problem(output):
        raise UnsafeNameError(f"the file name {show_name(output)} {problem}; rename it")
    return output


def starts_zstd(head: bytes) -> bool:
    """Tell whether ``head`` (4 bytes or more) begins a zstd frame or a skippable one.

    Why: ``pzstd`` starts each file with a skippable frame.
    """
    # the rest of a skippable frame's magic first: a match means head[0] is there
    return head[:4] == ZSTD_MAGIC or (head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50)


def line_feeds(data: bytes) -> int:
    """The line feeds in ``data``.

    Why: ``bytes.count`` of one byte walks the data a byte at a time on Python 3.11 (0.36 ms a
    MB); the lengths before and after ``replace`` find them by memchr (0.07 ms a MB).
    """
    return len(data) - len(data.replace(b"\n", b""))


def is_zstd(path: Path) -> bool:
    with open(path, "rb") as f:
        return starts_zstd(f.read(4))


@dataclass(frozen=True)
class Span:
    """A run of whole lines of a data file, as offsets into its decompressed content.

    Note: ``start`` is the first byte of a line; ``end`` is just after a newline (None: the end of
    the file). ``lines_before`` (the newlines before ``start``) numbers its lines as in the whole
    file; ``lines`` counts its newlines (0: not counted).
    """

    start: int = 0
    end: int | None = None
    lines_before: int = 0
    lines: int = 0


WHOLE_FILE = Span()


def iter_chunks(
    path: Path, span: Span = WHOLE_FILE, shown: str | None = None
) -> Generator[bytes, None, None]:
    """Yield the decompressed content of a data file (or a span of it) in chunks.

    Note: a zstd file's span is decompressed from the file's start (a zstd stream cannot be entered
    in the middle). ``shown`` names the file in errors.
    """
    if span.start and not is_zstd(path):
        chunks = raw_chunks(path, span.start)
    else:
        chunks = bytes_after(decompress_if_zstd(raw_chunks(path), shown or str(path)), span.start)
    yield from chunks if span.end is None else bytes_upto(chunks, span.end - span.start)


def raw_chunks(path: Path | str, offset: int = 0) -> Iterator[bytes]:
    """Yield a file's bytes from ``offset``, in chunks of one unbuffered ``read`` each.

    Why: a buffered read of a pipe loops in C until the chunk is full, and a Ctrl+C between two of
    its reads was lost until the writer sent more.
    """
    with open(path, "rb", buffering=0) as raw:
        if offset:
            raw.seek(offset)
        yield from iter(lambda: raw.read(CHUNK_SIZE), b"")


def bytes_after(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:]  # the chunk itself from 0
        count = 0


def bytes_upto(chunks: Iterable[bytes], count: int) -> Iterator[bytes]:
    """The first ``count`` bytes of ``chunks`` (the rest is not read)."""
    for chunk in chunks:
        if count <= 0:
            return
        yield chunk[:count]  # the chunk itself if no longer
        count -= len(chunk)


def decompress_if_zstd(chunks: Iterable[bytes], source: str) -> Iterator[bytes]:
    decoder = StreamDecoder(source)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.finish()


class _InputWanted(Exception):
    """A zstd reader read all that was fed so far."""


class _Fed(list[bytes]):
    """What a ``StreamDecoder`` was fed, for its zstd reader to read, last item first."""

    def read(self, _size: int) -> bytes:
        if not self:
            raise _InputWanted  # raised only before the reader's call gave output: read1 loses none
        return self.pop()


class StreamDecoder:
    """Decode bytes fed in: plain passes through, zstd comes out in bounded pieces.

    Note: zstd comes out in pieces of at most ``CHUNK_SIZE`` bytes whatever the ratio. Fed, not
    iterated, so a download can go on feeding it from a second connection.
    Why: zstandard's reader ends silently in a cut frame, where a truncated file would look
    complete; the end is checked by ``END_FRAME``, which decodes to ``END_TEXT`` only after a whole
    frame.
    """

    def __init__(self, source: str):
        self._source, self._head, self._fed = source, b"", _Fed()
        self._is_zstd: bool | None = None  # told by the first bytes
        # windows of at most MAX_WINDOW_BYTES: memory stays bounded
        decoder = zstandard.ZstdDecompressor()
        self._reader = decoder.stream_reader(
            self._fed,  # type: ignore[arg-type]  # read() is all it calls
            read_across_frames=True,
        )

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if self._is_zstd is None:
            self._head += chunk
            if len(self._head) < len(ZSTD_MAGIC):
                return
            chunk, self._is_zstd = self._head, starts_zstd(self._head)
            # the first frame's header, which says its window
            self._head = self._head[:ZSTD_FRAME_HEADER_MAX]
        if not self._is_zstd:
            yield chunk
            return
        self._fed.append(chunk)
        try:
            while True:
                yield self._reader.read1(CHUNK_SIZE)
        except _InputWanted:
            return
        except zstandard.ZstdError as exc:
            raise self._unreadable(exc) from exc

    def finish(self) -> Iterator[bytes]:
        if self._is_zstd is None and self._head:  # fewer bytes than zstd's magic: plain
            yield self._head
        if not self._is_zstd:
            return
        self._fed[:] = [b"", END_FRAME]  # END_FRAME, then the end
        try:
            ended = self._reader.read(len(END_TEXT) + 1) == END_TEXT
        except zstandard.ZstdError:
            ended = False
        if not ended:
            raise NdjsonError(
                f"{self._source}: not readable as zstd (the data end in the middle of a frame); "
                "they are truncated"
            )

    def _unreadable(self, exc: zstandard.ZstdError) -> NdjsonError:
        """Put the decoder's refusal in words.

        Note: a frame made for a larger window than the decoder allows (``zstd --long=28`` and up,
        which zstd itself decodes only when told so) is no damage.
        """
        try:
            window = zstandard.get_frame_parameters(self._head).window_size
        except zstandard.ZstdError:
            window = 0
        if window > MAX_WINDOW_BYTES:
            return NdjsonError(
                f"{self._source}: compressed with a {window >> 20} MB window (zstd "
                f"--long={window.bit_length() - 1}), more than the {MAX_WINDOW_BYTES >> 20} MB a "
                "zstd file may ask for here (memory stays bounded); compress it again without "
                "--long or with --long=27 or less (zstd -d --long=31 -c FILE | zstd -c > "
                "NEW.ndjson.zst)"
            )
        return NdjsonError(f"{self._source}: not readable as zstd ({exc}); the data are damaged")


def iter_lines(
    path: Path, max_line_bytes: int, span: Span = WHOLE_FILE
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line)`` for every non-empty line (of ``span``).

    Note: blank lines in a row count against the limit within a span: a run that a cut between spans
    divides counts as two.
    """
    lines = LineSplitter(path, max_line_bytes, span.lines_before)
    for chunk in iter_chunks(path, span):
        yield from lines.numbered(chunk)
    if last := lines.finish():
        yield lines.number, last


class LineSplitter:
    """Split a byte stream fed in any chunks into its non-blank lines.

    Note: ``number`` is the last line's. A line over ``max_line_bytes`` is an error, and so are more
    bytes than that of blank lines in a row. Only a line spanning chunks is buffered.
    """

    def __init__(self, source: Path | str, max_line_bytes: int, lines_before: int = 0):
        self._source, self._max, self._pending, self.number = (
            source,
            max_line_bytes,
            bytearray(),
            lines_before,
        )
        # the blank lines ending at ``number``: first line, bytes
        self._blank_run_from = self._blank_run_bytes = 0

    def numbered(self, chunk: bytes) -> Iterable[tuple[int, bytes]]:
        """Yield the non-blank lines ending in ``chunk``, with their numbers.

        Why: short lines are cut by ``bytes.split`` and numbered in C where none may be blank
        (empty, opening with whitespace) or too long; else one by one, so errors come in order.
        """
        most, probe = len(chunk) // MIN_LINE_BYTES + 2, min(len(chunk), SPLIT_PROBE_BYTES)
        lines = (
            chunk.split(b"\n", most)
            if chunk.count(b"\n", 0, probe) * SPLIT_LINE_BYTES >= probe
            else [b""]
        )
        tail = lines.pop()
        if self._pending and lines:
            lines[0] = bytes(self._pending + lines[0])
        if (
            not lines
            or len(lines) >= most
            or min(lines)[:1] <= b" "
            or max(len(tail), *map(len, lines)) > self._max
        ):
            return self._one_by_one(chunk)
        first, self.number = self.number + 1, self.number + len(lines)
        self._pending, self._blank_run_bytes = bytearray(tail), 0
        return zip(range(first, self.number + 1), lines, strict=True)

    def take_block(
        self, chunk: bytes, take: Callable[[bytes], tuple[T, int] | None]
    ) -> tuple[T, int] | None:
        """Apply ``take`` to the lines ending in ``chunk`` as one block.

        Note: the block includes the line begun before ``chunk``. Where ``take`` gives what it made
        and the count of the block's lines, those lines are read. None, and nothing read, where
        ``take`` gives None (it must where a line is blank), no line ends in the chunk, or the block
        or the rest could hold a line over the limit.
        """
        end = chunk.rfind(b"\n") + 1
        if not end or len(self._pending) + end > self._max or len(chunk) - end > self._max:
            return None
        # one copy
        if (taken := take(b"".join((self._pending, memoryview(chunk)[:end])))) is not None:
            self.number, self._pending, self._blank_run_bytes = (
                self.number + taken[1],
                bytearray(chunk[end:]),
                0,
            )
        return taken

    def _one_by_one(self, chunk: bytes) -> Iterator[tuple[int, bytes]]:
        # The parts of a line that spans chunks are appended through a view, without a slice copy.
        with memoryview(chunk) as view:
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if self._pending:
                    self._pending += view[start:end]
                    line, self._pending = bytes(self._pending), bytearray()
                elif (start == end or chunk[start] in BLANK_BYTES) and (
                    after := self._skip_blank_lines(chunk, start)
                ):
                    start = after
                    continue
                else:
                    # a bytes copy: simdjson parses bytes faster than a view
                    line = chunk[start:end]
                start = end + 1
                self.number += 1
                if len(line) > self._max:
                    raise LineTooLongError(self._source, self.number, self._max)
                if line.strip():
                    self._blank_run_bytes = 0
                    yield self.number, line
                else:
                    self._add_blank_lines(self.number, len(line) + 1)
            if len(self._pending) + len(chunk) - start > self._max:
                raise LineTooLongError(self._source, self.number + 1, self._max)
            self._pending += view[start:]

    def finish(self) -> bytes:
        """Return the last line when the stream does not end with a newline.

        Note: empty when it does, or when the rest is blank.
        """
        line, self._pending = bytes(self._pending), bytearray()
        if not line.strip():
            return b""
        self.number += 1
        return line

    def _skip_blank_lines(self, chunk: bytes, start: int) -> int:
        """The offset after the blank lines from ``start``, counted at once; 0 if none.

        Why: found at C speed, so a file of nothing but newlines (as a decompression bomb makes)
        is not read one line at a time.
        """
        after = chunk.rfind(b"\n", start, first_non_blank(chunk, start)) + 1
        if after <= start:
            return 0
        self._add_blank_lines(self.number + 1, after - start)
        self.number += chunk.count(b"\n", start, after)
        return after

    def _add_blank_lines(self, first_line: int, size: int) -> None:
        """Count blank lines; more than the line limit of them in a row is no NDJSON.

        Why: a bomb of newlines is read to its end.
        """
        if not self._blank_run_bytes:
            self._blank_run_from = first_line
        self._blank_run_bytes += size
        if self._blank_run_bytes > self._max:
            raise NdjsonError(
                f"{self._source}: more than {self._max // (1024 * 1024)} MB of blank lines from "
                f"line {self._blank_run_from} on (the limit is pipeline.max_ndjson_line_size_mb); "
                "this is not NDJSON data: check how the file was made"
            )


def first_non_blank(chunk: bytes | bytearray, start: int) -> int:
    """Return the offset of the first non-whitespace byte from ``start``, else the end.

    Why: looked for in windows growing fourfold, so the work follows the blank run, not what comes
    after it (``re`` is ten times slower).
    """
    window = 256
    while start < len(chunk):
        end = min(start + window, len(chunk))
        if rest := len(chunk[start:end].lstrip()):
            return end - rest
        start, window = end, window * 4
    return len(chunk)


def parse_resource(
    source: Path | str, line_number: int, line: bytes | bytearray | memoryview
) -> JsonObject:
    """Parse one NDJSON line as a JSON object with a ``resourceType``.

    Note: an error never quotes the line (patient data).
    """
    try:
        resource = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NdjsonError(
            f"{source}: line {line_number} is not valid JSON ({exc}); the file is not NDJSON"
        ) from None
    if not isinstance(resource, dict):
        raise NdjsonError(
            f"{source}: line {line_number} is not a JSON object; NDJSON holds one resource per line"
        )
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not resource_type:
        raise NdjsonError(
            f"{source}: line {line_number} is a JSON object without a resourceType, not a FHIR "
            "resource"
        )
    return resource


def remove_partial_files(folder: Path) -> None:
    """Delete temporary files a killed process left behind (never resumed from)."""
    for path in folder.glob(f"{PART_PREFIX}*{PART_SUFFIX}"):  # none where no folder
        path.unlink(missing_ok=True)
