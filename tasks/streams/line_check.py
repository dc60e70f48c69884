"""The line check of NDJSON data: every line must be a FHIR resource.

Why: light on imports: the worker processes checking a large file's spans import it and nothing
of the writer's.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import simdjson

from tasks.streams.ndjson import (
    LineSplitter,
    NdjsonError,
    TruncatedLineError,
    bytes_upto,
    iter_chunks,
    parse_resource,
    raw_chunks,
)

UTF8_BOM = b"\xef\xbb\xbf"
# a line checker keeps simdjson's buffers for lines up to this size, not larger
PARSER_KEPT_BYTES = 1 << 20


class LineCounts(NamedTuple):
    """A checked stream's counts: ``FileStats`` without the size.

    Why: a tuple, because it travels back from a worker process.
    """

    resources: int
    bundles: int = 0
    bundled: int = 0


class LineChecker:
    """Count and check the lines of a byte stream fed in any chunks.

    Why: simdjson checks a line without building Python objects (four to eight times orjson's
    speed); what it does not prove a resource goes to ``parse_resource`` (integers beyond 64 bits,
    deep nesting).
    Note: not thread-safe.
    """

    def __init__(self, source: str, max_line_bytes: int):
        self._source, self._lines = source, LineSplitter(source, max_line_bytes)
        self._parser = simdjson.Parser()
        self.resources = self.bundles = self.bundled = 0

    @property
    def lines(self) -> int:
        return self._lines.number

    def feed(self, chunk: bytes) -> None:
        for number, line in self._lines.numbered(chunk):
            self._check_line(number, line)

    def finish(self) -> None:
        """Check a last line without a newline: it must be a complete resource."""
        if not (line := self._lines.finish()):
            return
        try:
            self._check_line(self.lines, line)
        except NdjsonError:
            raise TruncatedLineError(
                f"{self._source}: the data end in the middle of line {self.lines}, without a "
                "newline; they are truncated"
            ) from None

    def _check_line(self, number: int, line: bytes) -> None:
        # parse_resource raises, or a Bundle is counted from its parse
        if not self._is_resource(line):
            resource = parse_resource(self._source, number, line)
            if resource["resourceType"] == "Bundle":
                entry = resource.get("entry")
                self._add_bundle(len(entry) if type(entry) is list else 0)
        # simdjson's buffers grow to twice the largest line: give them back
        if len(line) > PARSER_KEPT_BYTES:
            self._parser = simdjson.Parser()
        self.resources += 1

    def _is_resource(self, line: bytes) -> bool:
        """True if simdjson proves ``line`` a resource; False defers to ``parse_resource``."""
        if line.startswith(UTF8_BOM):  # simdjson skips a byte order mark, orjson refuses it
            return False
        try:
            document = self._parser.parse(line)
        # invalid JSON, too deep, a big integer (UnicodeDecodeError included)
        except (ValueError, RuntimeError):
            return False
        try:
            if type(document) is not simdjson.Object:
                return False
            # orjson keeps the last of duplicate keys, simdjson's lookup finds the first: only a
            # single key is sure.
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

    def _add_bundle(self, entries: int) -> None:
        self.bundles += 1
        self.bundled += entries

    def counts(self) -> LineCounts:
        return LineCounts(self.resources, self.bundles, self.bundled)


def count_contents(path: Path, max_line_bytes: int) -> LineCounts:
    """What a data file holds, each line checked as ``AtomicNdjsonWriter`` checks it."""
    return _checked_counts(iter_chunks(path), str(path), max_line_bytes)


def check_plain_span(
    path: Path, source: str, max_line_bytes: int, start: int, end: int
) -> LineCounts:
    """Check each line ``path`` holds from ``start`` (a line's start) to ``end``.

    Note: errors name ``source`` and count lines from ``start``. Runs in a worker process.
    """
    return _checked_counts(bytes_upto(raw_chunks(path, start), end - start), source, max_line_bytes)


def _checked_counts(chunks: Iterator[bytes], source: str, max_line_bytes: int) -> LineCounts:
    checker = LineChecker(source, max_line_bytes)
    for chunk in chunks:
        checker.feed(chunk)
    checker.finish()
    return checker.counts()
