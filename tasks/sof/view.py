"""SQL-on-FHIR v2 ViewDefinitions: compiled once, then run resource by resource.

``compile_view`` refuses a bad one (``ViewDefinitionError``); ``CompiledView.rows`` gives tuples in
``columns`` order. How rows are made, and their bounds: docs/development.md, "The SQL-on-FHIR
engine".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property, partial
from itertools import chain, islice
from typing import Any

from tasks.core.json_shapes import as_array, JsonObject
from tasks.core.names import show_text
from tasks.sof.compiled_code import KEPT, PARSED, RowsOf, generated_rows
from tasks.sof.errors import FhirPathError, ViewDefinitionError, ViewEvaluationError
from tasks.sof.fhirpath import Compiled, TypePath, compile_path, plain, single_keys
from tasks.sof.fhirpath_shared import MAX_REPEAT_ELEMENTS, Env
from tasks.sof.struct_rows import BlockCsv, block_csv
from tasks.sof.type_filters import refuse_other_types
from tasks.sof.shapes import Row

COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
ITERATIONS = ("forEach", "forEachOrNull", "repeat")
SELECT_KEYS = {"column", "select", "unionAll", "description", *ITERATIONS}
COLUMN_KEYS = {"name", "path", "collection", "type", "description", "tag", "id", "extension"}
ROW_INDEX = "%rowIndex"
_CONSTANT_REFERENCE = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'")
_BUILTIN_VARIABLES = {"rowIndex", "context", "resource", "rootResource", "ucum", "sct", "loinc"}
MAX_ROWS_PER_RESOURCE = 1_000_000
MAX_SELECT_DEPTH = 64
CACHED_ROWS = 10_000
"""Rows of a resource the generated function gives at most, and the general way keeps as a list."""
Focus = tuple[Any, TypePath]
"""What an expression is evaluated on: the element's JSON data and its FHIR type path."""


@dataclass
class Column:
    name: str
    evaluate: Compiled
    """Its ``path``, compiled (``expression``: as written)"""
    collection: bool
    fhir_type: Any
    """Its ``type`` (None for a collection: a JSON array), for ``tasks.sof.parquet``."""

    def value(self, data: Any, path: TypePath, env: Env) -> Any:
        try:
            found = self.evaluate.collect(data, path, env)[0]
        except FhirPathError as exc:
            raise ViewEvaluationError(f"column {self.name!r}: {exc}") from exc
        if self.collection:
            return [plain(value) for value in found]
        if len(found) > 1:
            raise ViewEvaluationError(
                f"Collection value for column {self.name!r}: path {self.evaluate.expression!r} "
                f"gave {len(found)} values; set collection: true or narrow the path (e.g. with "
                "first())"
            )
        return plain(found[0]) if found else None


@dataclass
class Select:
    iteration: str | None
    iterate: list[Compiled]
    columns: list[Column]
    selects: list[Select]
    union: list[Select]
    names: list[str]
    null_row: Row
    indexed: bool = True
    planned: dict[TypePath, tuple[str, ...] | None] = field(default_factory=dict)
    """Per focus type, the columns' JSON keys where each is one single-valued member"""
    producers: list[Callable[[Focus, Env], Iterable[Row]]] = field(init=False)
    """What gives each part of the product: each nested select's rows, then unionAll's"""

    def __post_init__(self) -> None:
        self.producers = [s.rows if s.iteration else s._rows_at for s in self.selects]
        self.producers += [self._union] if self.union else []

    def rows(self, focus: Focus, env: Env) -> Iterable[Row]:
        """The select's rows at ``focus``: a list when few and at hand, else an iterator."""
        if self.iteration is None:
            return self._rows_at(focus, env)
        if self.iteration == "repeat":
            return chain.from_iterable(self._each(list(self._repeated(focus, env)), env))
        elements = self.evaluated(self.iterate[0], focus, env)
        if len(elements) == 1:  # the usual case: one element, its rows as they are
            return self._rows_at(elements[0], {**env, "rowIndex": 0} if self.indexed else env)
        if not elements:
            return [self.null_row] if self.iteration == "forEachOrNull" else []
        return _joined(self._each(elements, env))

    def _each(self, elements: list[Focus], env: Env) -> Iterator[Iterable[Row]]:
        """Each element's rows in turn, made when needed (``%rowIndex`` its position)."""
        return (
            self._rows_at(element, {**env, "rowIndex": position} if self.indexed else env)
            for position, element in enumerate(elements)
        )

    def _repeated(self, focus: Focus, env: Env) -> Iterator[Focus]:
        """Depth first, each element the repeat paths give, then its own (no recursion)."""
        pending = [iter(self._children(focus, env))]
        count = 0
        while pending:
            if (item := next(pending[-1], None)) is None:
                pending.pop()
                continue
            count += 1
            if count > MAX_REPEAT_ELEMENTS:
                raise ViewEvaluationError(
                    f"repeat {[e.expression for e in self.iterate]!r} reaches more than "
                    f"{MAX_REPEAT_ELEMENTS:,} elements (paths that lead back to an element, or "
                    "several paths to the same children, repeat without end)"
                )
            yield item
            pending.append(iter(self._children(item, env)))

    def _children(self, focus: Focus, env: Env) -> list[Focus]:
        return [
            child for evaluate in self.iterate for child in self.evaluated(evaluate, focus, env)
        ]

    def evaluated(self, evaluate: Compiled, focus: Focus, env: Env) -> list[Focus]:
        try:
            found, paths = evaluate.collect(*focus, env)
        except FhirPathError as exc:
            raise ViewEvaluationError(f"{self.iteration}: {exc}") from exc
        return (
            list(zip(found, paths, strict=True))
            if isinstance(paths, list)
            else [(value, paths) for value in found]
        )

    def _rows_at(self, focus: Focus, env: Env) -> Iterable[Row]:
        """The product of its columns', selects' and unionAll's rows; a list when small."""
        data, path = focus
        head = self._head(data, path, env)
        if not self.producers:
            return [head]
        parts: list[Part] = []
        for produce in self.producers:
            if type(part := produce(focus, env)) is not list:
                part = _kept(part, partial(produce, focus, env))
            if not part:
                return []
            if parts or type(part) is not list or len(part) != 1:
                parts.append(part)
            else:  # the usual case: a part's one row joined to the head at once
                head += part[0]
        if len(parts) == 1 and type(part) is not _Reproduced:  # at most CACHED_ROWS rows
            return list(map(head.__add__, part))
        return _product(head, parts) if parts else [head]

    def _union(self, focus: Focus, env: Env) -> Iterable[Row]:
        return _joined(branch.rows(focus, env) for branch in self.union)

    def _head(self, data: Any, path: TypePath, env: Env) -> Row:
        """The select's own columns' values at a focus.

        Note: where each is one member key at that focus type (``planned``), the keys are looked
        up at once (values ``plain`` keeps as they are); else column by column."""
        try:
            keys = self.planned[path]
        except KeyError:
            keys = self.planned[path] = single_keys(self.columns, path)
        if keys is not None and type(data) is dict and data.get("resourceType", path) == path:
            row = tuple(map(data.get, keys))
            if KEPT.issuperset(map(type, row)):
                return row
        return tuple([column.value(data, path, env) for column in self.columns])


@dataclass(frozen=True)
class _Reproduced:
    """A part of over ``CACHED_ROWS`` rows: produced again at each pass, never kept."""

    produce: Callable[[], Iterable[Row]]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.produce())


Part = list[Any] | _Reproduced


def _kept(rows: Iterable[Row], produce: Callable[[], Iterable[Row]]) -> Part:
    """A part's ``rows`` (as ``produce`` gives them) to ``CACHED_ROWS``, or reproduced."""
    kept = list(islice(rows, CACHED_ROWS + 1))
    return kept if len(kept) <= CACHED_ROWS else _Reproduced(produce)


def _joined(parts: Iterator[Iterable[Row]]) -> Iterable[Row]:
    """The parts' rows in turn: a list while few and at hand, the rest lazily."""
    collected: list[Row] = []
    for rows in parts:
        if type(rows) is not list or len(collected) + len(rows) > CACHED_ROWS:
            return chain(collected, rows, chain.from_iterable(parts))
        collected += rows
    return collected


def _product(head: Row, parts: list[Part]) -> Iterable[Row]:
    """``head`` joined with each combination of the parts' rows; lazy when many."""
    rows = [head]
    for part in parts:
        if isinstance(part, _Reproduced) or len(rows) * len(part) > CACHED_ROWS:
            return _streamed_product(head, parts)
        rows = [row + extra for row in rows for extra in part]
    return rows


def _streamed_product(prefix: Row, parts: list[Part]) -> Iterator[Row]:
    for row in parts[0]:
        if len(parts) > 1:
            yield from _streamed_product(prefix + row, parts[1:])
        else:
            yield prefix + row


@dataclass
class CompiledView:
    resource: str
    columns: list[str]
    root: Select
    where: list[Compiled]
    constants: JsonObject
    name: str
    """How errors name the view: its ``name``, else ``title``, else its resource type."""
    max_rows_per_resource: int

    @cached_property
    def compiled(self) -> RowsOf | None:
        """The generated function; None outside its subset or if it reads ``%rowIndex``.

        Why: built at first use, as most views a job compiles are only checked.
        """
        return None if self.root.indexed else generated_rows(self.root, self.resource, CACHED_ROWS)

    @cached_property
    def parsed_rows(self) -> RowsOf | None:
        """Generated rows of a resource as orjson parses it; None if one reads a decimal."""
        return self._generated()

    @cached_property
    def csv_rows(self) -> RowsOf | None:
        """``parsed_rows`` as CSV cells: all strings, ``CsvWriter`` joins them as they are."""
        return self._generated(cells=True)

    @cached_property
    def block_csv(self) -> BlockCsv | None:
        """A block of lines' CSV (``tasks.sof.struct_rows``), for views it takes."""
        return block_csv(self, min(CACHED_ROWS, self.max_rows_per_resource))

    def _generated(self, cells: bool = False) -> RowsOf | None:
        if self.where or self.root.indexed:
            return None
        return generated_rows(self.root, self.resource, CACHED_ROWS, PARSED, cells)

    def rows(self, resource: JsonObject) -> Iterable[Row]:
        """The resource's rows: none for another type or a ``where`` not true.

        Note: a list or tuple when few, else an iterator; an error names the view and resource."""
        if resource.get("resourceType") != self.resource:
            return ()
        focus = (resource, self.resource)
        env = {**self.constants, "rowIndex": 0}
        try:
            if not self._passes(focus, env):
                return ()
            # the generated function's rows, else the general way's (data not shaped as planned)
            found = None if self.compiled is None else self.compiled(resource)
            rows = self.root.rows(focus, env) if found is None else found
        except ViewEvaluationError as exc:
            raise self._about(resource, exc) from exc
        if isinstance(rows, list | tuple) and len(rows) <= self.max_rows_per_resource:
            return rows
        return self._streamed(resource, rows)

    def _streamed(self, resource: JsonObject, rows: Iterable[Row]) -> Iterator[Row]:
        try:
            for count, row in enumerate(rows, start=1):
                if count > self.max_rows_per_resource:
                    raise ViewEvaluationError(
                        f"more than {self.max_rows_per_resource:,} rows from this one resource "
                        "(the product of its selects): narrow the forEach paths (e.g. with "
                        "where() or first()) or split the view"
                    )
                yield row
        except ViewEvaluationError as exc:
            raise self._about(resource, exc) from exc

    def _about(self, resource: JsonObject, exc: ViewEvaluationError) -> ViewEvaluationError:
        return ViewEvaluationError(
            f"view {self.name!r}, {show_text(resource.get('resourceType'))}/"
            f"{show_text(resource.get('id', '(no id)'))}: {exc}"
        )

    def _passes(self, focus: Focus, env: Env) -> bool:
        for evaluate in self.where:
            try:
                found = [plain(value) for value in evaluate.collect(*focus, env)[0]]
            except FhirPathError as exc:
                raise ViewEvaluationError(f"where {evaluate.expression!r}: {exc}") from exc
            if not found:
                return False
            if len(found) > 1 or not isinstance(found[0], bool):
                raise ViewEvaluationError(
                    f"where {evaluate.expression!r} must give a boolean, got {found!r}"
                )
            if not found[0]:
                return False
        return True


def compile_view(view: Any, max_rows_per_resource: int = MAX_ROWS_PER_RESOURCE) -> CompiledView:
    """The ViewDefinition validated and compiled; else a ``ViewDefinitionError``."""
    if not isinstance(view, dict):
        raise ViewDefinitionError("a ViewDefinition must be a JSON object")
    if not isinstance(resource := view.get("resource"), str) or not resource:
        raise ViewDefinitionError(
            "the ViewDefinition has no resource (the FHIR resource type it reads)"
        )
    if not (selects := as_array(view.get("select"))):
        raise ViewDefinitionError("the ViewDefinition has no select")
    constants = _constants(view)
    known_variables = _BUILTIN_VARIABLES | set(constants)
    root = _compile_select({"select": selects}, "view", known_variables)
    # nested at most MAX_SELECT_DEPTH levels by now
    if ROW_INDEX not in json.dumps(view, default=str):
        for select in all_selects(root):
            select.indexed = False
    if twice := [name for index, name in enumerate(root.names) if name in root.names[:index]]:
        raise ViewDefinitionError(f"column name {twice[0]!r} is used more than once")
    where = []
    for place, clause in _listed(view, "where"):
        if not isinstance(clause, dict) or not isinstance(clause.get("path"), str):
            raise ViewDefinitionError(f"{place} needs a path (a FHIRPath giving a boolean)")
        where.append(_compile(clause["path"], place, known_variables))
    name = str(view.get("name") or view.get("title") or resource)
    made = CompiledView(resource, root.names, root, where, constants, name, max_rows_per_resource)
    refuse_other_types(made)
    return made


def _compile_select(spec: Any, where: str, variables: set[str], depth: int = 0) -> Select:
    if depth > MAX_SELECT_DEPTH and isinstance(spec, dict):
        raise ViewDefinitionError(
            f"selects are nested more than {MAX_SELECT_DEPTH} levels deep ({where[:60]}...)"
        )
    _check_object(spec, SELECT_KEYS, where)
    iteration, paths = _iteration(spec, where)
    iterate = [_compile(path, f"{where}.{iteration}", variables) for path in paths]
    columns = [
        _compile_column(column, place, variables)
        for place, column in _listed(spec, "column", f"{where}.")
    ]

    def nested(key: str) -> list[Select]:  # the selects at ``key``, each one level deeper
        return [
            _compile_select(s, place, variables, depth + 1)
            for place, s in _listed(spec, key, f"{where}.")
        ]

    selects, union = nested("select"), nested("unionAll")
    if "unionAll" in spec:
        _refuse_unlike_branches(union, where)
    # a unionAll's branches have the same names
    names = [c.name for c in columns] + [
        name for select in selects + union[:1] for name in select.names
    ]
    own = tuple(0 if c.evaluate.expression.strip() == ROW_INDEX else None for c in columns)
    null_row = own + (None,) * (len(names) - len(own))
    # Nested selects that give one row at any focus (columns only: no iteration, nothing nested),
    # ahead of any other, joined to the select's own columns: the same rows (names and null row are
    # set by now), fewer products.
    while selects and not (selects[0].iteration or selects[0].selects or selects[0].union):
        columns += selects.pop(0).columns
    return Select(iteration, iterate, columns, selects, union, names, null_row)


def _iteration(spec: JsonObject, where: str) -> tuple[str | None, list[Any]]:
    """The select's iteration (None: none) and its expressions, as written."""
    iterations = [key for key in ITERATIONS if key in spec]
    if len(iterations) > 1:
        raise ViewDefinitionError(f"{where} has more than one of forEach, forEachOrNull and repeat")
    if not iterations:
        return None, []
    iteration, expressions = iterations[0], spec[iterations[0]]
    if iteration != "repeat":
        return iteration, [expressions]
    if not as_array(expressions):
        raise ViewDefinitionError(
            f"{where}.repeat must be a non-empty list of FHIRPath expressions"
        )
    return iteration, expressions


def _refuse_unlike_branches(union: list[Select], where: str) -> None:
    """Refuse a unionAll without branches, or of branches whose columns differ."""
    if not union:
        raise ViewDefinitionError(f"{where}.unionAll is empty")
    for index, branch in enumerate(union[1:], start=1):
        if branch.names != union[0].names:
            raise ViewDefinitionError(
                f"{where}.unionAll[{index}] has columns {branch.names}, but unionAll[0] has "
                f"{union[0].names}: every branch must have the same columns in the same order"
            )


def all_selects(root: Select) -> Iterator[Select]:
    """The select and all nested in it, those of its unionAll too."""
    pending = [root]
    while pending:
        select = pending.pop()
        yield select
        pending += select.selects + select.union


def _compile_column(spec: Any, where: str, variables: set[str]) -> Column:
    _check_object(spec, COLUMN_KEYS, where)
    name, path = spec.get("name"), spec.get("path")
    if not isinstance(name, str) or not COLUMN_NAME.match(name):
        raise ViewDefinitionError(
            f"{where} needs a name of letters, digits and _ starting with a letter, got {name!r}"
        )
    if not isinstance(path, str) or not path.strip():
        raise ViewDefinitionError(f"{where} ({name}) needs a path")
    if not isinstance(collection := spec.get("collection", False), bool):
        raise ViewDefinitionError(f"{where} ({name}): collection must be true or false")
    fhir_type = None if collection else spec.get("type")
    return Column(name, _compile(path, f"{where} ({name})", variables), collection, fhir_type)


def _check_object(spec: Any, keys: set[str], where: str) -> None:
    if not isinstance(spec, dict):
        raise ViewDefinitionError(f"{where} must be an object")
    if unknown := set(spec) - keys:
        raise ViewDefinitionError(f"{where} has unknown elements: {', '.join(sorted(unknown))}")


def _compile(expression: Any, where: str, variables: set[str]) -> Compiled:
    if not isinstance(expression, str):
        raise ViewDefinitionError(
            f"{where} must be a FHIRPath expression (a string), got {expression!r}"
        )
    for name in _CONSTANT_REFERENCE.findall(_STRING_LITERAL.sub("''", expression)):
        if name not in variables:
            raise ViewDefinitionError(f"{where}: %{name} is not a constant of this ViewDefinition")
    try:
        return compile_path(expression)
    except FhirPathError as exc:
        raise ViewDefinitionError(f"{where}: {exc}") from exc


def _constants(view: JsonObject) -> JsonObject:
    constants: JsonObject = {}
    for place, spec in _listed(view, "constant"):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ViewDefinitionError(f"{place} needs a name")
        value_keys = [key for key in spec if key.startswith("value")]
        if len(value_keys) != 1:
            raise ViewDefinitionError(f"constant {spec['name']!r} needs exactly one value[x]")
        value = spec[value_keys[0]]
        constants[spec["name"]] = Decimal(str(value)) if isinstance(value, float) else value
    return constants


def _listed(spec: JsonObject, key: str, where: str = "") -> list[tuple[str, Any]]:
    """The items of the list at ``key`` (none if missing), each after its place.

    Note: the place names the item in errors (``where`` its parent's, then a dot)."""
    if not isinstance(items := spec.get(key, []), list):
        raise ViewDefinitionError(f"{where}{key} must be a list")
    return [(f"{where}{key}[{index}]", item) for index, item in enumerate(items)]
