"""Paths that start with a type (``Patient.id``): the resource's own type gives the cells the path
gives without it, every way the engine runs a view; a type the focus never has is refused when the
view is compiled, naming the view and the column, by ``view run``, ``config check`` and the
flattening step alike."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from flows.run import EXIT_USAGE, main
from tasks.job.flattening_outcome import FlatteningError
from tasks.job.flattening_plan import plan_views
from tasks.sof.compiled_code import generated_rows
from tasks.sof.errors import ViewDefinitionError
from tasks.sof.fhirpath import compile_path
from tasks.sof.fhirpath_interpreter import interpreted
from tasks.sof.lookup import lookup_problems
from tasks.sof.view import CACHED_ROWS, compile_view
from tests.conftest import TESTDATA, run_cli_here
from tests.flattening_runs import flatten_files
from tests.support.sof import WAYS, in_one_way

FLATTENING = TESTDATA / "flattening"
EXAMPLE = FLATTENING / "example"
MII = "https://www.medizininformatik-initiative.de/fhir/core"
PATIENT_TABLE = f"{MII}/modul-person/StructureDefinition/PatientPseudonymisiert"
PATIENT = "each Patient"
NEVER = "so it would never give a value; start it with a member of"
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


@pytest.mark.parametrize(
    ("view", "named", "evaluated_on"),
    [
        ({"select": [columns("Observation.id")]}, "column 'a'", PATIENT),
        ({"name": "pats", "select": [columns("Observation.id | id")]}, "column 'a'", PATIENT),
        ({"select": [{"select": [columns("id", "Observation.id")]}]}, "column 'b'", PATIENT),
        ({"select": [{"unionAll": [columns("id"), columns("Task.id")]}]}, "column 'a'", PATIENT),
        (
            {"select": [{"forEach": "Observation.code", **columns("text")}]},
            "forEach 'Observation.code'",
            PATIENT,
        ),
        (
            {"where": [{"path": "Observation.status = 'final'"}], "select": [columns("id")]},
            "where[0]",
            PATIENT,
        ),
        (
            {"select": [{"forEach": "name", **columns("Patient.id")}]},
            "column 'a'",
            "each HumanName of forEach 'name'",
        ),
        (
            {"select": [{"forEach": "Patient.contact", "select": [columns("Patient.gender")]}]},
            "column 'a'",
            "each Patient.contact of forEach 'Patient.contact'",
        ),
    ],
)
def test_a_path_starting_with_a_type_its_focus_never_has_is_refused_naming_view_and_column(
    view,
    named,
    evaluated_on,
):
    with pytest.raises(ViewDefinitionError) as refused:
        compile_view({"resource": "Patient", **view})

    message = str(refused.value)
    assert message.startswith(f"view '{view.get('name', 'Patient')}', {named}: the path ")
    assert f"it is evaluated on {evaluated_on}, {NEVER}" in message


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


def test_view_run_refuses_a_path_of_another_type_naming_view_and_column(tmp_path):
    view = {"name": "patients", "resource": "Patient", "select": [columns("Observation.id")]}
    files = write_view(tmp_path, view)

    result = run_cli_here("view", "run", *files)

    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"invalid ViewDefinition {files[0]}: view 'patients', column 'a': the path "
        "'Observation.id' starts with the type Observation, but it is evaluated on each "
        f"Patient, {NEVER} Patient (or with Patient.)\n"
    )


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


def lookup_with(folder: Path, element: str, path: str, parent: str | None = None) -> Path:
    """The shared lookup with ``element`` (one column of ``path``) added to the Patient table, a
    child of ``parent`` (a ``forEach`` of ``name``)."""
    tables = shared_lookup()
    elements = next(t for t in tables if t["url"] == PATIENT_TABLE)["elements"]
    elements[element] = {"viewDefinition": columns(observed=path)}
    if parent is not None:
        elements[parent] = {"viewDefinition": {"forEach": "name"}, "children": [element]}
    written = folder / "lookup.json"
    written.write_text(json.dumps(tables))
    return written


def test_config_check_refuses_a_lookup_path_of_another_type_naming_view_and_column(
    tmp_path,
    write_config,
    capsys,
):
    lookup = lookup_with(tmp_path, "Patient.observed", "Observation.id")
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "flattening"]},
            "services": {"local_import": {"dir": tmp_path}, "flattening": {"lookup_path": lookup}},
        }
    )

    assert main(["config", "check", str(config)]) == EXIT_USAGE
    assert (
        f"services.flattening.lookup_path: table {PATIENT_TABLE} element Patient.observed: view "
        "'Patient', column 'observed': the path 'Observation.id' starts with the type "
        f"Observation, but it is evaluated on each Patient, {NEVER} Patient (or with Patient.); "
        "fix the lookup file"
    ) in capsys.readouterr().err


def test_a_child_snippet_is_checked_at_the_focus_its_parent_gives_it(tmp_path):
    assert lookup_problems(lookup_with(tmp_path, "Patient.name.id", "Patient.id")) == []

    nested = lookup_with(tmp_path, "Patient.name.id", "Patient.id", parent="Patient.name")

    [problem] = lookup_problems(nested)

    element = f"table {PATIENT_TABLE} element Patient.name.id"
    assert problem.startswith(f"{element}: view 'Patient', column 'observed': the path ")
    assert f"evaluated on each HumanName of forEach 'name', {NEVER} HumanName" in problem


def test_the_flattening_step_refuses_a_lookup_path_of_another_type_in_one_line(tmp_path):
    lookup = lookup_with(tmp_path, "Patient.observed", "Observation.id")

    with pytest.raises(FlatteningError) as refused:
        plan_views(EXAMPLE / "example-crtdl.json", lookup)

    message = str(refused.value)
    assert "\n" not in message
    element = f"table {PATIENT_TABLE} element Patient.observed"
    assert f"{element}: view 'Patient', column 'observed': the path 'Observation.id'" in message
