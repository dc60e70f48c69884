"""Rows as CSV cells (RFC 4180, LF line ends) and as NDJSON objects.

How each value becomes a cell: spec/protocols.md and docs/development.md, "The SQL-on-FHIR engine".
"""

import csv
import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from itertools import chain, islice
from pathlib import Path
from typing import IO, Any

import orjson
import re2

from tasks.core.exact_json import dumps_exact
from tasks.sof.shapes import Row


_NEEDS_QUOTES = re.compile('[,"\n\r]')
_WRITTEN_AS_CELLS = frozenset({str, type(None), int})
"""Types ``csv`` writes as ``cell`` would (None empty, ints as ``str``): rows of only these need no
conversion. Not ``Decimal``: ``str`` gives it an exponent (``0E-8``), ``cell`` plain notation."""
ROWS_PER_BATCH = 1000
_NULL = re2.compile(rb"null")
"""RE2 finds it in a tenth of ``in``'s time (a row's JSON of the Patient view at 1M patients)."""


class CsvWriter:
    """Rows as RFC 4180 lines: ``csv.writer`` for most; a bare CR's row quoted here."""

    def __init__(self, stream: IO[str]):
        # else excel's: RFC 4180 quoting
        self._stream, self._writer = stream, csv.writer(stream, lineterminator="\n")
        utf8 = str(getattr(stream, "encoding", "")).lower().replace("-", "") == "utf8"
        self._bytes: IO[bytes] | None = getattr(stream, "buffer", None) if utf8 else None
        """The UTF-8 text stream's byte stream: lines made as bytes go there as they are."""

    def writerow(self, cells: list[str]) -> None:
        if "\r" in "".join(cells):
            self._stream.write(",".join(map(_quoted, cells)) + "\n")
        else:
            self._writer.writerow(cells)

    def write_lines(self, text: bytes) -> None:
        """CSV lines made as bytes, each ending with a line feed."""
        if self._bytes is None:
            self._stream.write(text.decode())
        else:
            self._stream.flush()  # what the text layer holds goes first
            self._bytes.write(text)

    def writerows(self, rows: Iterable[Row]) -> int:
        """The rows as CSV lines, ``ROWS_PER_BATCH`` at a time; the number written.

        Note: one resource may give millions. A batch needing no quoting is joined as it is
        (``_string_lines``) or made from its JSON (``json_lines``, with no type test per cell: it
        cost as much as the rest), else written in one call to ``csv`` (as ``cell`` makes its
        cells where they are more than strings, nulls, ints)."""
        written = 0
        pending = iter(rows)
        # the engine's tuples, or (below) their cells as lists of strings
        batch: list[Sequence[Any]]
        while batch := list(islice(pending, ROWS_PER_BATCH)):
            written += len(batch)
            # never b"": each line ends with a line feed
            width = _width(batch)
            if width and (text := _string_lines(batch, width) or json_lines(batch, width)):
                self.write_lines(text)
                continue
            if not _WRITTEN_AS_CELLS.issuperset(map(type, chain.from_iterable(batch))):
                batch = list(map(csv_cells, batch))
            if "\r" in "".join(map(str, chain.from_iterable(batch))):
                for cells in map(csv_cells, batch):
                    self.writerow(cells)
            else:
                self._writer.writerows(batch)
        return written


def _string_lines(batch: list[Any], width: int) -> bytes | None:
    """The batch's CSV lines, its cells joined as they are; None where that is wrong.

    Note: only where all are strings (``CompiledView.csv_rows``) holding no comma, line
    feed, quote, CR or NUL, each row has ``width`` of them and every string is UTF-8."""
    rows = len(batch)
    try:
        text = "\n".join(chain(map(",".join, batch), [""])).encode()  # a line feed after each line
    except (TypeError, UnicodeEncodeError):  # a cell that is no string, or no UTF-8
        return None
    lines = len(text) - len(text.replace(b"\n", b""))  # memchr: 5x a count where line feeds are few
    if lines != rows or text.count(b",") != rows * (width - 1):
        return None
    return None if b'"' in text or b"\r" in text or b"\x00" in text else text


def json_lines(rows: list[Any], width: int) -> bytes | None:
    """The CSV lines of ``rows`` of ``width`` cells, made from their JSON (orjson).

    Note: None where orjson refuses a value, a cell is an object, or ``array_lines`` refuses
    the arrays, one a line."""
    try:
        text = orjson.dumps(rows)  # [[...],[...]]: one call
    except TypeError:  # a Decimal, an int beyond 64 bits, a lone surrogate
        return None
    if b"{" in text:
        return None
    return array_lines(text[1:-1].replace(b"],[", b"]\n[") + b"\n", len(rows), width)


def array_lines(text: bytes, rows: int, width: int) -> bytes | None:
    """The CSV lines of ``text``: ``rows`` arrays of ``width`` scalars, one a line.

    Note: None where a cell needs quoting or is no scalar: a JSON escape (a quote, backslash,
    CR, LF or control character in a string), a comma or bracket but the arrays' own (one pass
    counts them with the backslashes). A ``null`` after a bracket or comma is then a null: an
    empty cell; then brackets and quotes go."""
    if len(text) - len(text.translate(None, b"\\,[]")) != rows * (width + 1):
        return None
    if _NULL.search(text):
        text = text.replace(b",null", b",").replace(b"[null", b"[")
    return text.translate(None, b'[]"')


def _width(batch: list[Any]) -> int:
    """The rows' common length if it is 2 or more, else 0.

    Why: ``csv`` quotes a lone empty cell."""
    widths = set(map(len, batch))
    return widths.pop() if len(widths) == 1 and min(widths) > 1 else 0


def _quoted(cell: str) -> str:
    if _NEEDS_QUOTES.search(cell):
        return '"' + cell.replace('"', '""') + '"'
    return cell


MAX_EXPANDED_DIGITS = 100
"""A decimal with an exponent is written out in digits while its magnitude is within 10 to the
±100."""


def cell(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, Decimal):
        return decimal_text(value)
    if isinstance(value, dict | list):
        return json_bytes(value).decode()
    return str(value)


def decimal_text(value: Decimal) -> str:
    """A decimal's digits without an exponent (``str`` writes 0.0000001 as 1E-7).

    Note: not beyond ``MAX_EXPANDED_DIGITS``: 1e50000000 is no 50 MB cell."""
    text = str(value)
    expands = "E" in text and -MAX_EXPANDED_DIGITS <= value.adjusted() <= MAX_EXPANDED_DIGITS
    return format(value, "f") if expands else text


def csv_cells(row: Iterable[Any]) -> list[str]:
    return [value if type(value) is str else cell(value) for value in row]


def json_bytes(value: Any) -> bytes:
    """Compact JSON; decimals and integers beyond 64 bits keep their digits.

    Note: decimals are written as in a column."""
    return dumps_exact(value, decimal_text)


def csv_data_rows(path: Path, chunk_bytes: int = 1 << 20) -> int:
    """The records after the header of an RFC 4180 file, read in chunks.

    Note: a newline inside quotes is a cell's."""
    records, quoted, last = 0, False, b"\n"
    with path.open("rb") as stream:
        while chunk := stream.read(chunk_bytes):
            for index, piece in enumerate(chunk.split(b'"')):
                if index:  # each quote turns quoting over; a doubled quote twice
                    quoted = not quoted
                if not quoted:
                    records += piece.count(b"\n")
            last = chunk[-1:]
    return max(records + (last != b"\n") - 1, 0)
