"""SQL-on-FHIR v2 ViewDefinitions: validated and compiled once, then run resource by resource.

``compile_view(view)`` checks the ViewDefinition (raising ``ViewDefinitionError`` with the reason) and compiles
every FHIRPath in it once. ``CompiledView.rows(resource)`` yields the resource's rows as tuples in the order of
``CompiledView.columns`` (column names depth first: a select's own columns, then its nested selects', then its
``unionAll``'s); ``row_dicts`` yields them keyed by column name.

Row semantics (the v2 specification): a select's rows are the cartesian product of its columns' row, each nested
select's rows and the concatenated rows of its ``unionAll`` branches, for each element ``forEach`` /
``forEachOrNull`` / ``repeat`` iterates over (``%rowIndex`` is that element's 0-based position, inherited where a
select does not iterate). ``forEachOrNull`` over nothing gives one row of nulls; ``forEach`` over nothing gives no
row. A resource is skipped unless every ``where`` path gives ``true``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tasks.sof.fhirpath import Compiled, FhirPathError, Item, compile_path, values

COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
ITERATIONS = ("forEach", "forEachOrNull", "repeat")
SELECT_KEYS = {"column", "select", "unionAll", "description", *ITERATIONS}
COLUMN_KEYS = {"name", "path", "collection", "type", "description", "tag", "id", "extension"}
ROW_INDEX = "%rowIndex"
_CONSTANT_REFERENCE = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'")
_BUILTIN_VARIABLES = {"rowIndex", "context", "resource", "rootResource", "ucum", "sct", "loinc"}


class ViewError(ValueError):
    """A ViewDefinition that cannot be used or run; the message says why."""


class ViewDefinitionError(ViewError):
    """The ViewDefinition itself is invalid (found before any resource is read)."""


class ViewEvaluationError(ViewError):
    """Running a valid ViewDefinition over a resource failed (e.g. several values for a non-collection column)."""


@dataclass
class Column:
    name: str
    path: str
    evaluate: Compiled
    collection: bool = False

    def value(self, focus: Item, env: dict[str, Any]) -> Any:
        try:
            found = values(self.evaluate(focus, env))
        except FhirPathError as exc:
            raise ViewEvaluationError(f"column {self.name!r}: {exc}") from exc
        if self.collection:
            return found
        if len(found) > 1:
            raise ViewEvaluationError(
                f"Collection value for column {self.name!r}: path {self.path!r} gave {len(found)} values; "
                "set collection: true or narrow the path (e.g. with first())"
            )
        return found[0] if found else None


@dataclass
class Select:
    columns: list[Column] = field(default_factory=list)
    selects: list[Select] = field(default_factory=list)
    union: list[Select] = field(default_factory=list)
    iteration: str | None = None
    iterate: list[Compiled] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    null_row: tuple = ()

    def rows(self, focus: Item, index: int, env: dict[str, Any]) -> list[tuple]:
        if self.iteration is None:
            return self._rows_at(focus, env)
        items = self._elements(focus, env)
        if not items:
            return [self.null_row] if self.iteration == "forEachOrNull" else []
        rows: list[tuple] = []
        for position, item in enumerate(items):
            rows.extend(self._rows_at(item, {**env, "rowIndex": position}))
        return rows

    def _elements(self, focus: Item, env: dict[str, Any]) -> list[Item]:
        try:
            if self.iteration != "repeat":
                return self.iterate[0](focus, env)
            found: list[Item] = []
            self._repeat(focus, env, found)
            return found
        except FhirPathError as exc:
            raise ViewEvaluationError(f"{self.iteration}: {exc}") from exc

    def _repeat(self, focus: Item, env: dict[str, Any], found: list[Item]) -> None:
        for evaluate in self.iterate:
            for item in evaluate(focus, env):
                found.append(item)
                self._repeat(item, env, found)

    def _rows_at(self, focus: Item, env: dict[str, Any]) -> list[tuple]:
        index = env.get("rowIndex", 0)
        rows: list[tuple] = [tuple(column.value(focus, env) for column in self.columns)]
        for select in self.selects:
            rows = _product(rows, select.rows(focus, index, env))
            if not rows:
                return rows
        if self.union:
            branches: list[tuple] = []
            for branch in self.union:
                branches.extend(branch.rows(focus, index, env))
            rows = _product(rows, branches)
        return rows


def _product(left: list[tuple], right: list[tuple]) -> list[tuple]:
    return [a + b for a in left for b in right]


@dataclass
class CompiledView:
    resource: str
    columns: list[str]
    root: Select
    where: list[tuple[str, Compiled]]
    constants: dict[str, Any]
    definition: dict[str, Any]

    def rows(self, resource: dict[str, Any]) -> Iterator[tuple]:
        """The resource's rows (none if it is of another type or a ``where`` path is not true)."""
        if resource.get("resourceType") != self.resource:
            return iter(())
        focus = Item(resource, self.resource)
        env = {**self.constants, "rowIndex": 0}
        if not self._passes(focus, env):
            return iter(())
        return iter(self.root.rows(focus, 0, env))

    def row_dicts(self, resource: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for row in self.rows(resource):
            yield dict(zip(self.columns, row, strict=True))

    def _passes(self, focus: Item, env: dict[str, Any]) -> bool:
        for path, evaluate in self.where:
            try:
                found = values(evaluate(focus, env))
            except FhirPathError as exc:
                raise ViewEvaluationError(f"where {path!r}: {exc}") from exc
            if not found:
                return False
            if len(found) > 1 or not isinstance(found[0], bool):
                raise ViewEvaluationError(f"where {path!r} must give a boolean, got {found!r}")
            if not found[0]:
                return False
        return True


# --- compilation and validation ---------------------------------------------------------------------------------


def compile_view(view: Any) -> CompiledView:
    """The ViewDefinition, validated and compiled; raises ``ViewDefinitionError`` naming what is wrong."""
    if not isinstance(view, dict):
        raise ViewDefinitionError("a ViewDefinition must be a JSON object")
    resource = view.get("resource")
    if not isinstance(resource, str) or not resource:
        raise ViewDefinitionError("the ViewDefinition has no resource (the FHIR resource type it reads)")
    selects = view.get("select")
    if not isinstance(selects, list) or not selects:
        raise ViewDefinitionError("the ViewDefinition has no select")
    constants = _constants(view.get("constant", []))
    known_variables = _BUILTIN_VARIABLES | set(constants)
    root = _compile_select({"select": selects}, "view", known_variables)
    _check_unique(root.names)
    where = []
    for index, clause in enumerate(_list_of(view.get("where", []), "where")):
        if not isinstance(clause, dict) or not isinstance(clause.get("path"), str):
            raise ViewDefinitionError(f"where[{index}] needs a path (a FHIRPath giving a boolean)")
        where.append((clause["path"], _compile(clause["path"], f"where[{index}]", known_variables)))
    return CompiledView(resource, root.names, root, where, constants, view)


def _compile_select(spec: Any, where: str, variables: set[str]) -> Select:
    if not isinstance(spec, dict):
        raise ViewDefinitionError(f"{where} must be an object")
    unknown = set(spec) - SELECT_KEYS
    if unknown:
        raise ViewDefinitionError(f"{where} has unknown elements: {', '.join(sorted(unknown))}")
    select = Select()
    iterations = [key for key in ITERATIONS if key in spec]
    if len(iterations) > 1:
        raise ViewDefinitionError(f"{where} has more than one of forEach, forEachOrNull and repeat")
    if iterations:
        select.iteration = iterations[0]
        expressions = spec[select.iteration]
        if select.iteration == "repeat":
            if not isinstance(expressions, list) or not expressions:
                raise ViewDefinitionError(f"{where}.repeat must be a non-empty list of FHIRPath expressions")
        else:
            expressions = [expressions]
        select.iterate = [_compile(e, f"{where}.{select.iteration}", variables) for e in expressions]
    for index, column in enumerate(_list_of(spec.get("column", []), f"{where}.column")):
        select.columns.append(_compile_column(column, f"{where}.column[{index}]", variables))
    select.selects = [
        _compile_select(s, f"{where}.select[{i}]", variables)
        for i, s in enumerate(_list_of(spec.get("select", []), f"{where}.select"))
    ]
    if "unionAll" in spec:
        branches = _list_of(spec["unionAll"], f"{where}.unionAll")
        if not branches:
            raise ViewDefinitionError(f"{where}.unionAll is empty")
        select.union = [_compile_select(s, f"{where}.unionAll[{i}]", variables) for i, s in enumerate(branches)]
        first = select.union[0].names
        for index, branch in enumerate(select.union[1:], start=1):
            if branch.names != first:
                raise ViewDefinitionError(
                    f"{where}.unionAll[{index}] has columns {branch.names}, but unionAll[0] has {first}: every "
                    "branch must have the same columns in the same order"
                )
    select.names = [c.name for c in select.columns]
    for nested in select.selects:
        select.names += nested.names
    if select.union:
        select.names += select.union[0].names
    row_index = [c.path.strip() == ROW_INDEX for c in select.columns]
    select.null_row = tuple(0 if is_index else None for is_index in row_index)
    select.null_row += (None,) * (len(select.names) - len(row_index))
    return select


def _compile_column(spec: Any, where: str, variables: set[str]) -> Column:
    if not isinstance(spec, dict):
        raise ViewDefinitionError(f"{where} must be an object")
    unknown = set(spec) - COLUMN_KEYS
    if unknown:
        raise ViewDefinitionError(f"{where} has unknown elements: {', '.join(sorted(unknown))}")
    name, path = spec.get("name"), spec.get("path")
    if not isinstance(name, str) or not COLUMN_NAME.match(name):
        raise ViewDefinitionError(f"{where} needs a name of letters, digits and _ starting with a letter, got {name!r}")
    if not isinstance(path, str) or not path.strip():
        raise ViewDefinitionError(f"{where} ({name}) needs a path")
    collection = spec.get("collection", False)
    if not isinstance(collection, bool):
        raise ViewDefinitionError(f"{where} ({name}): collection must be true or false")
    return Column(name, path, _compile(path, f"{where} ({name})", variables), collection)


def _compile(expression: Any, where: str, variables: set[str]) -> Compiled:
    if not isinstance(expression, str):
        raise ViewDefinitionError(f"{where} must be a FHIRPath expression (a string), got {expression!r}")
    for name in _CONSTANT_REFERENCE.findall(_STRING_LITERAL.sub("''", expression)):
        if name not in variables:
            raise ViewDefinitionError(f"{where}: %{name} is not a constant of this ViewDefinition")
    try:
        return compile_path(expression)
    except FhirPathError as exc:
        raise ViewDefinitionError(f"{where}: {exc}") from exc


def _constants(specs: Any) -> dict[str, Any]:
    constants: dict[str, Any] = {}
    for index, spec in enumerate(_list_of(specs, "constant")):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ViewDefinitionError(f"constant[{index}] needs a name")
        value_keys = [key for key in spec if key.startswith("value")]
        if len(value_keys) != 1:
            raise ViewDefinitionError(f"constant {spec['name']!r} needs exactly one value[x]")
        value = spec[value_keys[0]]
        constants[spec["name"]] = Decimal(str(value)) if isinstance(value, float) else value
    return constants


def _check_unique(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ViewDefinitionError(f"column name {name!r} is used more than once")
        seen.add(name)


def _list_of(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ViewDefinitionError(f"{where} must be a list")
    return value
