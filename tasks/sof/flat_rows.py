"""The rows of a flat view made from a whole block of NDJSON lines at once: msgspec decodes, in C, only the fields
the view's columns read, with no split into lines and no dict per resource.

A flat view has generated rows (``CompiledView.csv_rows``) and no ``forEach``, ``forEachOrNull`` or ``unionAll``,
with two columns or more, each one member of the resource (``id``, ``deceased.ofType(boolean)``): one row per
resource, its cells as ``csv_rows`` gives them. A block is taken only where msgspec reads every line as exactly one
object of the view's type whose columns hold a string, boolean, int or null, and the block is UTF-8 (msgspec checks
only the strings it reads). Anything else (a Bundle, a decimal, a blank line, a line opening with whitespace or
holding two values, bytes not JSON) and the caller reads the block line by line, every verdict made as before.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Literal

import re2

from tasks.sof.compiled import single_keys

CELL_VALUE = str | bool | int | None
_OPENS_BLANK = re2.compile(rb"\n[ \t\r\n\x0b\x0c]")
"""A line after the first that is blank or opens with whitespace (``LineSplitter`` reads those one by one)."""
_TWO_OBJECTS = re2.compile(rb"\}[ \t\r]*\{")
"""One object after another on a line (``decode_lines`` takes both); also a string holding ``}{``, which only costs
the line-by-line read. RE2: each of the two searches is a tenth of their alternation's time."""


def flat_block_rows(view: Any) -> Callable[[bytes], list[tuple] | None] | None:
    """For a flat view, ``rows(block)``: a block of whole lines' rows, or None where it must be read line by line;
    None for any other view."""
    keys = flat_keys(view)
    if keys is None:
        return None
    import msgspec  # here: 10 ms that every other command, and every flattening worker, would pay at start

    fields = {key: f"c{index}" for index, key in enumerate(dict.fromkeys(keys))}
    row = msgspec.defstruct(
        "FlatRow",
        [("kind", Literal[view.resource]), *((field, CELL_VALUE, "") for field in fields.values())],
        rename={"kind": "resourceType", **{field: key for key, field in fields.items()}},
        gc=False,
    )
    decode, cells = msgspec.json.Decoder(row).decode_lines, attrgetter(*(fields[key] for key in keys))

    def rows(block: bytes) -> list[tuple] | None:
        try:  # the decoding first: in a file of several types it stops at the first line of another, at once
            found = decode(block)
            if block[:1] <= b" " or _OPENS_BLANK.search(block) or _TWO_OBJECTS.search(block):
                return None
            if not block.isascii():
                block.decode()
        except (ValueError, RecursionError):  # msgspec's errors and UnicodeDecodeError are ValueErrors
            return None
        return list(map(cells, found))

    return rows


def flat_keys(view: Any) -> list[str] | None:
    """The JSON key each column of a flat view reads, in column order; None for any other view."""
    # compile_view joins nested selects of one row each to their parent's columns: a flat view's root has them all
    if view.csv_rows is None or len(view.columns) < 2 or view.root.selects or view.root.union:
        return None
    keys = single_keys(view.root.columns, view.resource)
    if keys is None or "resourceType" in keys:
        return None
    return list(keys)
