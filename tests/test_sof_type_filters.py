"""Paths that start with a type (``Patient.id``): the resource's own type gives the cells the path
gives without it, every way the engine runs a view, in ``view run`` and the flattening step."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tasks.job.flattening_plan import plan_views
from tasks.sof.compiled_code import generated_rows
from tasks.sof.fhirpath import compile_path
from tasks.sof.fhirpath_interpreter import interpreted
from tasks.sof.lookup import lookup_problems
from tasks.sof.view import CACHED_ROWS, compile_view
from tests.conftest import TESTDATA, run_cli_here
from tests.flattening_runs import flatten_files
from tests.support.sof import WAYS, in_one_way

FLATTENING = TESTDATA / "flattening"
EXAMPLE = FLATTENING / "example"
PATIENTS = [
    {
        "resourceType": "Patient",
        "id": "p1",
        "active": True,
        "gender": "female",
        "birthDate": "1970-01-01",
        "name": [{"family": "F1", "given": ["G1", "G2"]}, {"family": "F2"}],
        "telecom": [{"system": "phone", "value": "123"}],
    },
    {"resourceType": "Patient", "id": "p2", "active": True, "deceasedBoolean": True},
    {"resourceType": "Patient", "id": "p3", "active": False, "name": [{"family": "F3"}]},
]


def columns(*paths: str, **named: str) -> dict[str, Any]:
    """A select of columns ``a``, ``b``, … of ``paths``, then one per ``named`` path."""
    pairs = [*zip("abcdefgh", paths, strict=False), *named.items()]
    return {"column": [{"name": name, "path": path} for name, path in pairs]}


GENERATED_VIEW = {
    "resource": "Patient",
    "select": [
        columns("Patient.id", "Patient.gender"),
        {"forEachOrNull": "Patient.name", **columns(family="family")},
    ],
}
"""Member paths only: the generated function's subset."""
INTERPRETED_VIEW = {
    "resource": "Patient",
    "where": [{"path": "Patient.active = true and Patient.id.exists()"}],
    "select": [
        columns(
            "Patient.getResourceKey()",
            "iif(Patient.deceased.exists(), 'no', 'yes')",
            "Patient.name.given.join(' ')",
        ),
        {
            "column": [
                {
                    "name": "names",
                    "path": "Patient.name.family | Patient.name.given",
                    "collection": True,
                }
            ]
        },
        {
            "unionAll": [
                {"forEach": "Patient.telecom", **columns(contact="value")},
                columns(contact="Patient.birthDate"),
            ]
        },
    ],
}
"""Paths fhirpathpy evaluates, a view ``where``, ``unionAll`` branches at the resource."""


def without_prefix(view: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(view).replace("Patient.", ""))


def rows_of(view: dict[str, Any], way: str, resources: list[dict] = PATIENTS) -> list[tuple]:
    compiled = in_one_way(compile_view(view), way)
    return [row for resource in resources for row in compiled.rows(resource)]


@pytest.mark.parametrize("view", [GENERATED_VIEW, INTERPRETED_VIEW], ids=["members", "fhirpathpy"])
@pytest.mark.parametrize("way", WAYS)
def test_a_path_with_the_resource_type_gives_the_cells_it_gives_without(view, way):
    assert rows_of(view, way) == rows_of(without_prefix(view), way)


@pytest.mark.parametrize("way", WAYS)
def test_the_prefixed_paths_give_their_values_every_way(way):
    assert generated_rows(compile_view(GENERATED_VIEW).root, "Patient", CACHED_ROWS) is not None
    assert rows_of(GENERATED_VIEW, way) == [
        ("p1", "female", "F1"),
        ("p1", "female", "F2"),
        ("p2", None, None),
        ("p3", None, "F3"),
    ]
    names = ["F1", "F2", "G1", "G2"]
    assert rows_of(INTERPRETED_VIEW, way) == [
        ("Patient/p1", "yes", "G1 G2", names, "123"),
        ("Patient/p1", "yes", "G1 G2", names, "1970-01-01"),
        ("Patient/p2", "no", "", [], None),
    ]


@pytest.mark.parametrize(
    "path",
    ["Patient.id", "Patient.name.given", "Patient.name.first().family", "Patient.id.exists()"],
)
def test_the_member_walk_and_the_interpreter_agree_on_a_prefixed_path(path):
    for patient in PATIENTS:
        walked = compile_path(path).collect(patient, "Patient", {})[0]
        assert walked == interpreted(path).collect(patient, "Patient", {})[0]
        without = compile_path(path.removeprefix("Patient."))
        assert walked == without.collect(patient, "Patient", {})[0]


@pytest.mark.parametrize("way", WAYS)
def test_a_type_filter_where_the_data_decides_the_type_keeps_resources_of_that_type(way):
    select = {"forEach": "contained", **columns("Observation.id", "Observation.status.exists()")}
    view = {"resource": "Patient", "select": [select]}
    observation = {"resourceType": "Observation", "id": "o1", "status": "final"}
    medication = {"resourceType": "Medication"}
    patient = {"resourceType": "Patient", "contained": [observation, medication]}

    assert rows_of(view, way, [patient]) == [("o1", True), (None, False)]


def write_view(folder: Path, view: dict[str, Any]) -> tuple[str, str]:
    """The view and one Patient ``p1`` written to ``folder``; their paths."""
    (folder / "view.json").write_text(json.dumps(view))
    (folder / "patients.ndjson").write_text('{"resourceType":"Patient","id":"p1"}\n')
    return str(folder / "view.json"), str(folder / "patients.ndjson")


def test_the_reproduction_of_issue_63_gives_the_id_in_both_columns_in_view_run(tmp_path):
    files = write_view(tmp_path, {"resource": "Patient", "select": [columns("Patient.id", "id")]})

    for output, printed in (("ndjson", '{"a":"p1","b":"p1"}\n'), ("csv", "a,b\np1,p1\n")):
        result = run_cli_here("view", "run", "--format", output, *files)
        assert result.returncode == 0, result.stderr
        assert result.stdout == printed


# --- the lookup: config check and the flattening step ---------------------------------------


def shared_lookup() -> list[dict[str, Any]]:
    return json.loads((FLATTENING / "flatten-lookup.json").read_text())


def prefixed(select: dict[str, Any], kind: str) -> dict[str, Any]:
    """``select`` (at the resource) with each path at the resource starting with ``kind``."""
    select = copy.deepcopy(select)
    for iteration in ("forEach", "forEachOrNull"):
        if iteration in select:  # below it the focus is an element
            select[iteration] = f"{kind}.{select[iteration]}"
            return select
    select["column"] = [{**c, "path": f"{kind}.{c['path']}"} for c in select.get("column", [])]
    select["select"] = [prefixed(nested, kind) for nested in select.get("select", [])]
    return select


def prefixed_lookup(path: Path) -> Path:
    """The shared lookup with every element that is no child written with its resource type."""
    tables = shared_lookup()
    for table in tables:
        elements = table["elements"]
        children = {child for element in elements.values() for child in element.get("children", [])}
        for element_id in elements.keys() - children:
            snippet = elements[element_id]["viewDefinition"]
            elements[element_id]["viewDefinition"] = prefixed(snippet, table["resourceType"])
    path.write_text(json.dumps(tables))
    return path


def test_the_example_flattened_through_a_prefixed_lookup_gives_the_expected_csvs(tmp_path):
    lookup = prefixed_lookup(tmp_path / "lookup.json")
    assert '"forEachOrNull": "Condition.code"' in lookup.read_text()
    assert '"path": "Patient.deceased.ofType(boolean)"' in lookup.read_text()
    assert lookup_problems(lookup) == []
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", lookup)
    out = tmp_path / "out"
    data = [EXAMPLE / "input" / "fhir-data.ndjson"]

    flatten_files(data, out, views, skipped, max_line_bytes=1 << 20)

    expected = sorted((EXAMPLE / "expected").iterdir())
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in expected]
    for path in expected:
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
