"""The flattening lookup file: profile URL → element ids → ViewDefinition snippets.

Read by ``read_json_file``: at most ``MAX_LOOKUP_BYTES`` (/dev/zero is refused) and
``MAX_JSON_DEPTH`` levels. Its form and checks: spec/protocols.md and docs/development.md, "The
SQL-on-FHIR engine"."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from tasks.core.json_shapes import as_object, JsonObject
from tasks.core.jsonfile import JsonFileError, read_json_file
from tasks.sof.errors import SofError, ViewDefinitionError
from tasks.sof.view import compile_view


MAX_LOOKUP_BYTES = 16 * 1024 * 1024  # aether's lookup for every MII profile is under 1 MB
# FHIR elements nest a dozen levels; a deeper children chain is a broken file
MAX_ELEMENT_DEPTH = 64

LOOKUP_SCHEMA: JsonObject = orjson.loads(
    Path(__file__).with_name("lookup.schema.json").read_bytes()
)
"""The rules of aether's flatten-lookup.schema.json (shared/testdata/flattening), descriptions
left out."""


@dataclass(frozen=True)
class LookupTable:
    resource_type: str
    elements: dict[str, JsonObject]
    parents: dict[str, str]

    def ancestors(self, element_id: str) -> list[str]:
        """The element's ancestors, its parent first; none if they cycle or nest too deep.

        Note: ``lookup_problems`` reports those."""
        chain: list[str] = []
        while (parent := self.parents.get(element_id)) is not None:
            if parent in chain or len(chain) >= MAX_ELEMENT_DEPTH:
                return []
            chain.append(parent)
            element_id = parent
        return chain

    def in_iterations(self, element_id: str, select: JsonObject) -> JsonObject:
        """``select`` in each ``forEach`` / ``forEachOrNull`` of the element's ancestors."""
        for ancestor in self.ancestors(element_id):  # the innermost wraps it first
            snippet = self.elements[ancestor]["viewDefinition"]  # an object: LOOKUP_SCHEMA
            if iteration := {k: v for k, v in snippet.items() if k in ("forEach", "forEachOrNull")}:
                select = {**iteration, "select": [select]}
        return select


def lookup_problems(path: Path) -> list[str]:
    """Every problem of the lookup file, each naming table url and element id."""
    return _checked(path)[1]


def load_lookup(path: Path) -> dict[str, LookupTable]:
    """The lookup file's tables by profile url; a ``SofError`` lists every problem."""
    tables, problems = _checked(path)
    if problems:
        raise SofError(f"lookup file {path}: {'; '.join(problems)}")
    return tables


def _checked(path: Path) -> tuple[dict[str, LookupTable], list[str]]:
    """The file's tables by profile url, and every problem (then, the tables unused)."""
    try:
        document: Any = read_json_file(path, MAX_LOOKUP_BYTES, f"the lookup file {path}")
    except JsonFileError as exc:
        return {}, [str(exc)]
    errors = sorted(
        Draft202012Validator(LOOKUP_SCHEMA).iter_errors(document),
        key=lambda e: [str(p) for p in e.absolute_path],
    )
    if problems := [_schema_problem(document, error) for error in errors]:
        return {}, problems
    tables: dict[str, LookupTable] = {}
    for table in document:
        url = table["url"]
        if url in tables:
            problems.append(
                f"table {url}: the url is listed more than once (each profile needs one table)"
            )
        tables[url] = _table(table, problems)
    return tables, problems


def _schema_problem(document: Any, error: Any) -> str:
    """A schema error as text naming the table url and element id it is in."""
    where = list(error.absolute_path)
    label = "lookup file"
    if where:  # in the array: the schema makes its root one, and what is not fails at the root
        url = as_object(document[where[0]]).get("url")
        label = f"table {url}" if isinstance(url, str) else f"table #{where[0] + 1}"
        if len(where) >= 3 and where[1] == "elements":
            label += f" element {where[2]}"
            where = where[3:]
        else:
            where = where[1:]
    location = f" (at {'/'.join(str(p) for p in where)})" if where else ""
    return f"{label}: {error.message}{location}"


def _table(table: JsonObject, problems: list[str]) -> LookupTable:
    """The table, its problems added to ``problems``."""
    url, elements = table["url"], table["elements"]
    parent_of: dict[str, str] = {}
    for element_id, element in elements.items():
        for child in element.get("children", []):
            if child not in elements:
                problems.append(
                    f"table {url} element {element_id}: child {child} is not an element of this "
                    "table"
                )
            elif child in parent_of and parent_of[child] != element_id:
                problems.append(
                    f"table {url} element {child}: it is a child of both {parent_of[child]} and "
                    f"{element_id} (an element can have one parent)"
                )
            else:
                parent_of[child] = element_id
    in_table = LookupTable(table["resourceType"], elements, parent_of)
    for element_id, element in elements.items():
        select = in_table.in_iterations(element_id, element["viewDefinition"])
        try:  # the snippet as a select on its own (FHIRPath that parses, columns)
            compile_view({"resource": table["resourceType"], "select": [select]})
        except ViewDefinitionError as exc:
            problems.append(f"table {url} element {element_id}: {exc}")
    problems += _cycle_problems(url, elements)
    return in_table


def _cycle_problems(url: str, elements: dict[str, JsonObject]) -> list[str]:
    """Cycles in the children links, and chains deeper than ``MAX_ELEMENT_DEPTH``.

    Note: each cycle once, at the element it returns to, in any listing order; a depth-first
    walk with its own stack, so a chain of any length costs no recursion."""
    problems: list[str] = []
    # of each finished element: the longest chain of children below it, itself included
    height: dict[str, int] = {}
    for root in elements:
        if root in height:
            continue
        path, pending = [root], [iter(elements[root].get("children", []))]
        while pending:
            if (child := next(pending[-1], None)) is None:
                done = path.pop()
                pending.pop()
                height[done] = 1 + max(
                    (height.get(c, 0) for c in elements[done].get("children", [])), default=0
                )
                # a chain whose lower part was walked first, from its leaf
                if height[done] > MAX_ELEMENT_DEPTH:
                    problems.append(
                        f"table {url} element {done}: its children nest more than "
                        f"{MAX_ELEMENT_DEPTH} levels deep, far deeper than any FHIR element"
                    )
                    return problems
            elif child in path:
                cycle = " → ".join(path[path.index(child) :] + [child])
                problems.append(
                    f"table {url} element {child}: its children lead back to it ({cycle})"
                )
            elif child in elements and child not in height:
                if len(path) >= MAX_ELEMENT_DEPTH:
                    problems.append(
                        f"table {url} element {root}: its children nest more than "
                        f"{MAX_ELEMENT_DEPTH} levels deep (through {child}), far deeper than any "
                        "FHIR element"
                    )
                    # one such problem per table: the rest of the chain says the same
                    return problems
                path.append(child)
                pending.append(iter(elements[child].get("children", [])))
    return problems
