"""The SQL-on-FHIR engine's columns and FHIRPaths over a few sample resources, a view run one of its two ways, and
the resources of NDJSON lines as the engine reads them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from copy import copy
from pathlib import Path
from typing import Any

from tasks.sof.compiled_code import generated_rows
from tasks.sof.fhirpath import Compiled, plain
from tasks.sof.resources import line_resources, may_hold, parse_line
from tasks.sof.view import CACHED_ROWS, CompiledView, compile_view

PATIENTS = [
    {"resourceType": "Patient", "id": "pt1", "name": [{"given": ["g1", "g2"]}, {"given": ["g3"]}]},
    {"resourceType": "Patient", "id": "pt2", "name": [{"family": "f2"}]},
    {"resourceType": "Patient", "id": "pt3"},
]
WAYS = ("generated", "general")
"""How ``compile_view`` runs a view (docs/development.md, the engine section)."""

IRREGULAR_CONDITIONS = [
    {
        "resourceType": "Condition",
        "id": "c0",
        "subject": {"reference": "Patient/p0"},
        "recordedDate": "2024-01-02",
        "code": {"coding": [{"system": "s", "code": "a"}, {"system": "t", "code": "b"}, {"system": "s", "code": "c"}]},
        "extension": [{"url": "u", "valueDateTime": "2024"}],
    },
    {
        "resourceType": "Condition",
        "id": "c1",
        "subject": {"reference": "Patient/p1"},
        "code": {"coding": [{"system": "s", "code": "a"}, None, {"system": "t", "code": "b"}, {"system": "s"}]},
        "extension": [{"url": "u", "valueDateTime": "2024"}, {"url": "v", "valueString": "x"}],
        "note": [{"text": "one"}],
    },
    {
        "resourceType": "Condition",
        "id": "c2",
        "subject": [{"reference": "Patient/p2"}],
        "code": {"coding": [{"resourceType": "Observation", "system": "s", "code": "contained"}]},
        "note": [{"text": "one"}, {"text": "two"}],
    },
    {"resourceType": "Condition", "id": "c3", "code": [{"coding": [{"system": ["s"], "code": "listed"}]}]},
    {"resourceType": "Condition", "id": "c4", "code": {"coding": ["text", {"code": "k"}]}, "subject": "text"},
    {"resourceType": "Condition", "id": "c5", "code": "text", "recordedDate": 1.5},
    {"resourceType": "Observation", "id": "o1"},
]
IRREGULAR_VIEW = {
    "resource": "Condition",
    "select": [
        {"column": [{"name": "id", "path": "id"}, {"name": "patient", "path": "subject.reference"}]},
        {"column": [{"name": "recorded", "path": "recordedDate"}]},
        {
            "forEachOrNull": "code",
            "select": [
                {"forEachOrNull": "coding.where(system = 's')", "column": [{"name": "s", "path": "code"}]},
                {"forEach": "coding", "column": [{"name": "any", "path": "code"}, {"name": "sys", "path": "system"}]},
            ],
        },
        {"forEachOrNull": "extension", "column": [{"name": "value", "path": "value.ofType(dateTime)"}]},
        {"unionAll": [{"column": [{"name": "u", "path": "id"}]}, {"column": [{"name": "u", "path": "'lit'"}]}]},
    ],
}
GENERATED_VIEW = {"resource": "Condition", "select": IRREGULAR_VIEW["select"][:-1]}  # no unionAll
SIBLING_WHERES_VIEW = {
    "resource": "Condition",
    "select": [
        {"column": [{"name": "id", "path": "id"}]},
        {"forEachOrNull": "code.coding.where(system = 's')", "column": [{"name": "s", "path": "code"}]},
        {"forEachOrNull": "code.coding.where(system = 't')", "column": [{"name": "t", "path": "code"}]},
        {"forEach": "code.coding", "column": [{"name": "any", "path": "code"}]},
        {"select": [{"forEachOrNull": "note", "column": [{"name": "note", "path": "text"}]}]},
    ],
}
PAIRED_CONDITIONS = [
    {"resourceType": "Condition", "id": "p0", "code": {"coding": [{"system": "t", "code": "1"}, {"system": "s"}]}},
    {"resourceType": "Condition", "id": "p1", "code": {"coding": {"system": "s", "code": "one object"}}},
    {"resourceType": "Condition", "id": "p2", "code": [{"coding": [{"system": "s", "code": "a"}]}, {"coding": []}]},
    {"resourceType": "Condition", "id": "p3", "code": {"resourceType": "Condition", "coding": []}},
    {"resourceType": "Condition", "id": "p4", "code": None, "note": [{"text": "n"}]},
    {"resourceType": "Condition", "id": "p5", "code": 3},
]


def column_values(path: str, resources: list[dict] = PATIENTS) -> list:
    """The one column ``path`` over ``resources`` (all of the first one's type)."""
    kind = resources[0]["resourceType"]
    view = compile_view({"resource": kind, "select": [{"column": [{"name": "v", "path": path}]}]})
    return [row[0] for resource in resources for row in view.rows(resource)]


def path_values(compiled: Compiled, resource: dict) -> list:
    """The plain values (FHIRPath system types as their text) a compiled FHIRPath gives on ``resource``."""
    return [plain(value) for value in compiled.collect(resource, resource["resourceType"], {})[0]]


def in_one_way(view: CompiledView, way: str) -> CompiledView:
    """``view`` run only by its generated function, or only the general way. The general way stays where the generated
    function gives no rows: a view outside the generator's subset or reading ``%rowIndex``, data not shaped as planned,
    more than ``CACHED_ROWS`` rows."""
    if way == "general" or view.root.indexed:
        return with_compiled(view, None)
    return with_compiled(view, generated_rows(view.root, view.resource, CACHED_ROWS))


def with_compiled(view: CompiledView, compiled: Any) -> CompiledView:
    """A copy of ``view`` whose compiled selects are ``compiled`` (None: the general way) instead of its own."""
    other = copy(view)
    other.compiled = compiled
    return other


def read_resources(
    source: Path | str, lines: Iterable[tuple[int, bytes]], types: Iterable[str]
) -> Iterator[dict[str, Any]]:
    """The resources of ``lines`` (numbered, as ``tasks.streams.ndjson.iter_lines`` gives them), except those of lines
    that hold no resource of ``types`` (see ``may_hold``): such lines are passed over unparsed and unchecked."""
    wanted = frozenset(kind.encode() for kind in types)
    for number, line in lines:
        if may_hold(line, wanted):
            yield from line_resources(parse_line(source, number, line))
