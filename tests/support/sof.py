"""The SQL-on-FHIR engine's columns over a few sample resources."""

from __future__ import annotations

from tasks.sof.view import compile_view

PATIENTS = [
    {"resourceType": "Patient", "id": "pt1", "name": [{"given": ["g1", "g2"]}, {"given": ["g3"]}]},
    {"resourceType": "Patient", "id": "pt2", "name": [{"family": "f2"}]},
    {"resourceType": "Patient", "id": "pt3"},
]


def column_values(path: str, resources: list[dict] = PATIENTS) -> list:
    """The one column ``path`` over ``resources`` (all of the first one's type)."""
    kind = resources[0]["resourceType"]
    view = compile_view({"resource": kind, "select": [{"column": [{"name": "v", "path": path}]}]})
    return [row[0] for resource in resources for row in view.rows(resource)]
