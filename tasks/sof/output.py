"""Rows as CSV cells and as NDJSON objects.

CSV cells (spec/protocols.md): null → empty, strings verbatim (no formula escaping), numbers as written in the input
(the engine reads decimals as ``Decimal``, which keeps their digits), booleans ``true``/``false``, objects and
arrays as compact JSON. The CSV dialect is RFC 4180 with LF line ends.
"""

from __future__ import annotations

import csv
from decimal import Decimal
from typing import IO, Any

import orjson


class CsvDialect(csv.Dialect):
    delimiter = ","
    quotechar = '"'
    doublequote = True
    skipinitialspace = False
    lineterminator = "\n"
    quoting = csv.QUOTE_MINIMAL


def csv_writer(stream: IO[str]) -> Any:
    return csv.writer(stream, dialect=CsvDialect)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, dict | list):
        return json_bytes(value).decode()
    return str(value)


def csv_cells(row: tuple) -> list[str]:
    return [cell(value) for value in row]


def json_bytes(value: Any) -> bytes:
    """Compact JSON; decimals keep their digits."""
    return orjson.dumps(value, default=_decimal_fragment)


def _decimal_fragment(value: Any) -> Any:
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
