"""A view's selects compiled to closures that give a resource's rows as one list.

``compile_rows(select)`` gives ``rows(data, path, env)``: ``Select.rows``' rows in its order, or
None beyond ``CACHED_ROWS`` (the caller then takes the general, lazy way). See docs/development.md,
"The SQL-on-FHIR engine"."""

from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from tasks.sof.compiled_code import KEPT, column_plan, generated_rows
from tasks.sof.shapes import Row

Select = Any  # a tasks.sof.view.Select, and below a Column (view imports this module)
Column = Any

Rows = list[Row] | None
RowsAt = Callable[[Any, Any, Any], Rows]
Value = Callable[[Any, Any, Any], Any]
CACHED_ROWS = 10_000
"""Rows of a resource the closures give at most, and the general way keeps as a list."""


def compile_rows(select: Select) -> RowsAt:
    """``select``'s rows at a focus as a list; None for more than ``CACHED_ROWS``."""
    if select.iteration == "repeat":  # the general way's rows: its bound stays there

        def repeated(data: Any, path: Any, env: Any) -> Rows:
            found = list(islice(select.rows((data, path), env), CACHED_ROWS + 1))
            return found if len(found) <= CACHED_ROWS else None

        return repeated
    rows_at = _rows_at(select)
    if select.iteration is None:
        return rows_at
    null_rows = [select.null_row] if select.iteration == "forEachOrNull" else []

    def rows(data: Any, path: Any, env: Any) -> Rows:
        elements = select.evaluated(select.iterate[0], (data, path), env)
        if not elements:
            return list(null_rows)
        if len(elements) == 1:  # the usual case: its rows as they are
            return rows_at(elements[0][0], elements[0][1], env)
        return _joined(rows_at(element, at, env) for element, at in elements)

    return rows


def compile_view_rows(root: Select, resource_type: str) -> RowsAt:
    """The view's rows at a resource: the generated function's, else the closures'."""
    closures = compile_rows(root)
    if (generated := generated_rows(root, resource_type, CACHED_ROWS)) is None:
        return closures

    def rows(data: Any, path: Any, env: Any) -> Rows:
        found = generated(data)
        return closures(data, path, env) if found is None else found

    return rows


def _rows_at(select: Select) -> RowsAt:
    """The product of the select's columns, nested selects' and unionAll's rows."""
    read = _row_reader(select.columns)
    parts = [compile_rows(nested) for nested in select.selects]
    if select.union:  # the branches' rows one after the other
        branches = [compile_rows(branch) for branch in select.union]
        parts.append(
            lambda data, path, env: _joined(branch(data, path, env) for branch in branches)
        )
    if not parts:
        return lambda data, path, env: [read(data, path, env)]

    def rows_at(data: Any, path: Any, env: Any) -> Rows:
        row = read(data, path, env)
        rows = None  # one row (``row``) until a part gives several
        for part in parts:
            if not (extra := part(data, path, env)):  # None (too many) or no rows at all
                return extra
            if rows is None and len(extra) == 1:
                row += extra[0]
                continue
            if rows is None:
                rows = [row]
            if len(rows) * len(extra) > CACHED_ROWS:
                return None
            rows = [left + more for left in rows for more in extra]
        return [row] if rows is None else rows

    return rows_at


def _joined(parts: Iterable[Rows]) -> Rows:
    """The parts' rows in turn, each made when needed; None for more than ``CACHED_ROWS``."""
    found: list[Row] = []
    for more in parts:
        if more is None or len(found) + len(more) > CACHED_ROWS:
            return None
        found += more
    return found


def _row_reader(columns: list[Column]) -> Value:
    """The select's own columns as a tuple at a focus.

    Note: where each is one member key at that focus type, the keys are looked up at once
    (values ``plain`` keeps as they are); else column by column."""
    planned: dict[Any, tuple[str, ...] | None] = {}

    def read(data: Any, path: Any, env: Any) -> Row:
        try:
            keys = planned[path]
        except KeyError:
            keys = planned[path] = single_keys(columns, path)
        if keys is not None and type(data) is dict and data.get("resourceType", path) == path:
            row = tuple(map(data.get, keys))
            if KEPT.issuperset(map(type, row)):
                return row
        return tuple([column.value(data, path, env) for column in columns])

    return read


def single_keys(columns: list[Column], path: Any) -> tuple[str, ...] | None:
    """Each column's JSON key if every column is one single-valued member at ``path``."""
    keys = []
    for column in columns:
        if (plan := column_plan(column, path)) is None or not plan.single:
            return None
        keys.append(plan.key)
    return tuple(keys)
