"""A view's CSV made from a whole block of NDJSON lines at once (msgspec, in C).

A block it cannot vouch for line by line goes back to the caller, read line by line with every
verdict made as before. Which views and blocks it takes: docs/development.md, "The SQL-on-FHIR
engine".
"""

from collections.abc import Callable, Iterable
from io import BytesIO, TextIOWrapper
from functools import partial
from operator import attrgetter
from typing import Any, Literal, NamedTuple

import re2

from tasks.sof.fhirpath import single_keys
from tasks.sof.compiled_code import column_plan, generated_rows, member_plan
from tasks.sof.fhirpath import Operation, TypePath
from tasks.sof.output import CsvWriter, array_lines
from tasks.streams.ndjson import line_feeds

CELL_VALUE = str | bool | int | None
BlockCsv = Callable[[bytes], tuple[bytes, int] | None]
PIECE_BYTES = 1 << 16
"""Lines decoded and written as CSV at once: their data is still in the CPU's caches (rows of a
whole 1 MB block written after took the Condition view 1.2x the time); pieces of 16 KB cost 1.1x
in calls, and a block's lists alive together set off the cyclic GC's full passes."""
_OPENS_BLANK = re2.compile(rb"\n[ \t\r\n\x0b\x0c]")
"""A line after the first that is blank or opens with whitespace (read one by one)."""
_TWO_OBJECTS = re2.compile(rb"\}[ \t\r]*\{")
"""One object after another on a line (``decode_lines`` takes both); also a string holding ``}{``,
which only costs the line-by-line read. RE2: each search is a tenth of their alternation's time."""


class _Element(NamedTuple):
    """The keys a view reads from one kind of element, each with its element (or None)."""

    at: TypePath
    keys: "dict[str, _Element | None]"


def block_csv(view: Any, limit: int) -> BlockCsv | None:
    """``csv(block)`` for a view taken (docs/development.md), else None.

    Note: ``csv`` gives the block's CSV lines and its count of lines (for
    ``LineSplitter.take_block``), or None where the block must be read line by line. ``limit``:
    a line's rows at most."""
    root, names = _Element(view.resource, {}), dict[str, str]()
    if view.csv_rows is None or not _reads(view.root, view.resource, root, names):
        return None
    import msgspec  # here: 10 ms that every other command and flattening worker would pay at start

    decode = msgspec.json.Decoder(_root(root, names)).decode_lines
    piece_rows: Callable[[list[Any]], Iterable[Any] | None] | None = None
    if keys := flat_keys(view):  # one row a line: the structs' fields, in C
        piece_rows = partial(map, attrgetter(*(names[key] for key in keys)))
    elif (piece_rows := generated_rows(view.root, view.resource, limit, fields=names)) is None:
        return None
    # where the structs' fields are the columns, their JSON arrays are the lines
    width = len(keys) if keys and list(root.keys) == keys else 0
    astuple, encode = msgspec.structs.astuple, msgspec.json.Encoder().encode_lines

    def csv(block: bytes) -> tuple[bytes, int] | None:
        buffer, lines = BytesIO(), 0
        writer = CsvWriter(text := TextIOWrapper(buffer, "utf-8", newline=""))
        try:  # the decoding first: in a file of several types it stops at another type's first line
            for piece in _pieces(block):  # each piece's CSV made while its data is in the caches
                structs = decode(piece)
                lines += len(structs)
                arrays = encode(map(astuple, structs)) if width else None
                if arrays and (made := array_lines(arrays, len(structs), width)) is not None:
                    writer.write_lines(made)
                    continue
                if (rows := piece_rows(structs)) is None:
                    return None
                writer.writerows(rows)
            # one object a line: none split over lines, no two on one, no blank line
            if lines != line_feeds(block) or block[:1] <= b" ":
                return None
            if _OPENS_BLANK.search(block) or _TWO_OBJECTS.search(block):
                return None
            if not block.isascii():
                block.decode()
        except (ValueError, RecursionError):  # msgspec's and UnicodeDecodeError are ValueErrors
            return None
        text.flush()
        return buffer.getvalue(), lines

    return csv


def _pieces(block: bytes) -> Iterable[memoryview]:
    """The block in pieces of whole lines of about ``PIECE_BYTES`` (views, not copies)."""
    start, whole = 0, memoryview(block)
    while start < len(block):
        end = block.find(b"\n", start + PIECE_BYTES) + 1 or len(block)
        yield whole[start:end]
        start = end


def _reads(select: Any, path: TypePath, element: _Element, names: dict[str, str]) -> bool:
    """Record the keys the select reads at its focus (type ``path``) and below.

    Note: in ``element``, each key's attribute in ``names``; False where the view is not
    taken."""
    if select.iteration is not None:
        plan = member_plan(select.iterate[0], path)
        if plan is None or (found := _walked(element, plan.operations, plan.path, names)) is None:
            return False
        element, path = found, plan.path
    for column in select.columns:
        plan = column_plan(column, path)
        if plan is None or (at := _walked(element, plan.operations[:-1], None, names)) is None:
            return False
        if not _read(at, plan.operations[-1][1], None, names):
            return False
    return all(_reads(nested, path, element, names) for nested in select.selects)


def _walked(
    element: _Element,
    operations: tuple[Operation, ...],
    path: TypePath,
    names: dict[str, str],
) -> _Element | None:
    """The element the member steps of ``operations`` reach (type ``path`` after them).

    Note: the keys their ``where`` steps compare are recorded as values; None where the view
    is not taken."""
    for index, (kind, key, literal, _) in enumerate(operations):
        if kind == "where":
            if literal == "" or not _read(element, key, None, names):
                return None
            continue
        at = operations[index + 1][3] if index + 1 < len(operations) else path
        if not _read(element, key, _Element(at, {}), names):
            return None
        element = element.keys[key]  # type: ignore[assignment]  # _read: an element
    return element


def _read(element: _Element, key: str, child: _Element | None, names: dict[str, str]) -> bool:
    """Record ``key`` of ``element`` as ``child`` (None: a value), named in ``names``.

    Note: False where it was read the other way, or is ``resourceType``."""
    names.setdefault(key, f"f{len(names)}")
    found = element.keys.setdefault(key, child)
    return key != "resourceType" and (found is None) == (child is None)


def _root(element: _Element, names: dict[str, str]) -> Any:
    """The msgspec type of a line: a struct of ``element``, ``resourceType`` its tag.

    Why: a field no more, its rows' JSON holds only the columns.
    Note: a lone tagged struct takes an object without the tag: in a union msgspec requires it,
    here with a struct of the empty type, which takes no object (no resource has that type)."""
    import msgspec  # as in block_csv, which has imported it by now

    def refuse(_: object) -> None:
        raise ValueError("a resource of the empty type")

    tagged: dict[str, Any] = {"tag_field": "resourceType", "tag": element.at}
    empty = msgspec.defstruct(
        "Empty", [], namespace={"__post_init__": refuse}, **tagged | {"tag": ""}
    )
    return _struct(element, names, None, **tagged) | empty


def _struct(
    element: _Element, names: dict[str, str], kind: tuple[Any, ...] | None, **tagged: Any
) -> type:
    """The msgspec struct of ``element``: ``kind`` (``resourceType``) if given, keys.

    Note: values default to ``''``; no ``resourceType`` and one of the planned type pass, as
    in ``compiled_code``."""
    import msgspec  # as in block_csv, which has imported it by now

    fields = [] if kind is None else [kind]
    for key, child in element.keys.items():
        if child is None:
            fields.append((names[key], CELL_VALUE, ""))
        else:
            # Literal[None] is None to msgspec: no resourceType, or null
            planned: Any = Literal[child.at] | msgspec.UnsetType
            struct: Any = _struct(child, names, ("kind", planned, msgspec.UNSET))
            fields.append((names[key], struct | list[struct] | None, None))
    rename = {"kind": "resourceType", **{names[key]: key for key in element.keys}}
    return msgspec.defstruct("Element", fields, rename=rename, gc=False, **tagged)


def flat_keys(view: Any) -> list[str] | None:
    """The JSON key each column of a flat view reads, in order; None for other views."""
    # compile_view joins nested selects of one row each to their parent's columns: a flat view's
    # root has them all; of one column attrgetter gives no tuple. The root, compiled from
    # {"select": ...}, has no unionAll.
    if len(view.columns) < 2 or view.root.selects:
        return None
    keys = single_keys(view.root.columns, view.resource)
    return None if keys is None else list(keys)
