"""The SQL-on-FHIR engine's columns over a few sample resources, and a view run one of its three ways."""

from __future__ import annotations

from dataclasses import replace

from tasks.sof.compiled import compile_rows
from tasks.sof.compiled_code import generated_rows
from tasks.sof.view import CACHED_ROWS, CompiledView, compile_view

PATIENTS = [
    {"resourceType": "Patient", "id": "pt1", "name": [{"given": ["g1", "g2"]}, {"given": ["g3"]}]},
    {"resourceType": "Patient", "id": "pt2", "name": [{"family": "f2"}]},
    {"resourceType": "Patient", "id": "pt3"},
]
WAYS = ("generated", "closures", "general")
"""How ``compile_view`` runs a view (docs/development.md, the engine section)."""


def column_values(path: str, resources: list[dict] = PATIENTS) -> list:
    """The one column ``path`` over ``resources`` (all of the first one's type)."""
    kind = resources[0]["resourceType"]
    view = compile_view({"resource": kind, "select": [{"column": [{"name": "v", "path": path}]}]})
    return [row[0] for resource in resources for row in view.rows(resource)]


def in_one_way(view: CompiledView, way: str) -> CompiledView:
    """``view`` run only by its generated function, only by its closures, or only the general way. The general way
    stays where the other two give no rows: a view outside the generator's subset or reading ``%rowIndex``, data not
    shaped as planned, more than ``CACHED_ROWS`` rows."""
    if way == "general" or view.root.indexed:
        return replace(view, compiled=None)
    if way == "closures":
        return replace(view, compiled=compile_rows(view.root, CACHED_ROWS))
    generated = generated_rows(view.root, view.resource, CACHED_ROWS)
    return replace(view, compiled=None if generated is None else lambda data, path, env: generated(data))
