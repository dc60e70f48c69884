"""Reading resources for the engine: NDJSON lines, Bundles opened into entries.

Note: decimals are kept as written; lines of types no view reads are passed over unparsed.
"""

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import re2

from tasks.core.json_shapes import as_array, JsonObject
from tasks.core.exact_json import EXACT_DECODER
from tasks.sof.errors import ResourceLineError
from tasks.streams.ndjson import LineSplitter, iter_chunks
from tasks.sof.shapes import Row

# A number with a fraction or exponent, or an integer beyond 64 bits; RE2: 2.5x Python's re here.
_DECIMAL_NUMBER = re2.compile(rb"[:\[,][ \t\n\r\f\v]*(?:-?\d+(?:\.\d|[eE])|-?\d{20}|-\d{19})")
_SURROGATE_ESCAPE = re2.compile(rb"\\u[dD][89a-fA-F]")
_RESOURCE_TYPE_KEY = b'"resourceType"'
_RESOURCE_TYPE = re.compile(rb'"resourceType"\s*:\s*"([^"\\]*)"')
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7][0-9A-Fa-f]")


def parse_line(source: Path | str, number: int, line: bytes) -> JsonObject:
    """One NDJSON line; decimals as ``Decimal`` (the fast parser when there are none).

    Why: decimals reach the CSV as written.
    Note: a line "has decimals" when a number with a fraction or exponent, or an integer of
    20 digits or more (19 when negative: orjson would make a float of one beyond 64 bits),
    follows ``:``, ``[`` or ``,``; a string that looks like that only costs the slower parser,
    never a wrong value.
    """
    try:
        if _DECIMAL_NUMBER.search(line):
            if b"\\u" in line and _SURROGATE_ESCAPE.search(line):
                # refuses a lone surrogate, as without decimals
                orjson.loads(line.removeprefix(b"\xef\xbb\xbf"))
            resource = EXACT_DECODER.decode(line.decode("utf-8-sig"))
        else:
            resource = orjson.loads(line)
    except ValueError as exc:
        raise ResourceLineError(f"{source}: line {number} is not valid JSON ({exc})") from exc
    # the decimal-keeping parser recurses per level; orjson stops at 1024 levels itself
    except RecursionError:
        raise ResourceLineError(
            f"{source}: line {number} is nested too deeply to be a FHIR resource"
        ) from None
    if not isinstance(resource, dict):
        raise ResourceLineError(f"{source}: line {number} is not a JSON object")
    return resource


def line_resources(resource: JsonObject) -> list[JsonObject]:
    if resource.get("resourceType") != "Bundle":
        return [resource]
    return [
        e["resource"]
        for e in as_array(resource.get("entry"))
        if isinstance(e, dict) and isinstance(e.get("resource"), dict)
    ]


def may_hold(line: bytes, types: frozenset[bytes]) -> bool:
    """Whether the line can hold a resource of one of ``types`` (a Bundle: of any).

    Note: false only when every ``"resourceType"`` in it names another type, so such a line
    need not be parsed at all."""
    first = line.find(_RESOURCE_TYPE_KEY)
    if first < 0:
        return True
    # the usual case: one, found by bytes
    if line.find(_RESOURCE_TYPE_KEY, first + len(_RESOURCE_TYPE_KEY)) < 0:
        named = _RESOURCE_TYPE.match(line, first)
        return (
            named is None or named[1] in types or named[1] == b"Bundle" or _may_escape_a_key(line)
        )
    kinds = _RESOURCE_TYPE.findall(line)
    if len(kinds) < line.count(_RESOURCE_TYPE_KEY):  # one not a plain key and value: parse and see
        return True
    return any(kind in types or kind == b"Bundle" for kind in kinds) or _may_escape_a_key(line)


def _may_escape_a_key(line: bytes) -> bool:
    """Whether a key may be written with an escaped letter (``"resourc\\u0065Type"``).

    Why: the byte search does not see it: the line's own type may be another than found."""
    return b"\\u00" in line and _ESCAPED_LETTER.search(line) is not None


def read_rows(
    view: Any, source: Path | str, lines: Iterable[tuple[int, bytes]], csv: bool = False
) -> Iterator[Row]:
    """``view.rows`` over numbered ``lines``; those with none of its type unparsed.

    Note: a line opening as a resource of the view's type, as compact JSON writers write it,
    is parsed by orjson alone and given to ``view.parsed_rows`` (``csv``: ``view.csv_rows``);
    a line it does not take (a decimal a column reads, another shape, too many rows, not
    JSON) is read again the general way."""
    opening = b'{"resourceType":' + orjson.dumps(view.resource)
    fast = view.csv_rows if csv else view.parsed_rows
    most, wanted = view.max_rows_per_resource, frozenset([view.resource.encode()])
    for number, line in lines:
        if fast is not None and line.startswith(opening):
            try:
                resource = orjson.loads(line)
            except ValueError:
                resource = None
            if type(resource) is dict and resource["resourceType"] == view.resource:
                rows = fast(resource)
                if rows is not None and len(rows) <= most:
                    yield from rows
                    continue
        if may_hold(line, wanted):
            for resource in line_resources(parse_line(source, number, line)):
                yield from view.rows(resource)


def csv_parts(view: Any, source: Path, max_line_bytes: int) -> Iterator[bytes | Iterable[Row]]:
    """The file's CSV in parts: blocks' CSV lines, or ``read_rows``' rows line by line.

    Note: a view ``CompiledView.block_csv`` does not take is read line by line throughout (as
    ``iter_lines`` reads a file)."""
    lines = LineSplitter(source, max_line_bytes)
    for chunk in iter_chunks(source):
        if view.block_csv is None or (taken := lines.take_block(chunk, view.block_csv)) is None:
            yield read_rows(view, source, lines.numbered(chunk), csv=True)
        else:
            yield taken[0]
    if last := lines.finish():
        yield read_rows(view, source, [(lines.number, last)], csv=True)
