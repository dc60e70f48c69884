"""Lookup files: the shared ones are valid; every kind of problem is named with its table url and element id;
the shared lookups, CRTDLs and TORCH result build ViewDefinitions that the engine runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tasks.flattening import plan_views
from tasks.sof.view import compile_view
from tasks.sof.crtdl_views import attribute_groups, build_view
from tasks.sof.lookup import LOOKUP_SCHEMA, load_lookup, lookup_problems
from tasks.sof.resources import line_resources
from tests.conftest import TESTDATA

FLATTENING = TESTDATA / "flattening"
LOOKUPS = [FLATTENING / "flatten-lookup.json", FLATTENING / "aether-torch-lookup.json"]
DIAGNOSE = "https://www.medizininformatik-initiative.de/fhir/core/modul-diagnose/StructureDefinition/Diagnose"
PROCEDURE = "https://www.medizininformatik-initiative.de/fhir/core/modul-prozedur/StructureDefinition/Procedure"


def example_lookup() -> list[dict[str, Any]]:
    return json.loads((FLATTENING / "flatten-lookup.json").read_text())


def problems_of(document: Any, tmp_path: Path) -> list[str]:
    path = tmp_path / "lookup.json"
    path.write_text(json.dumps(document))
    return lookup_problems(path)


def table(document: list[dict[str, Any]], url: str) -> dict[str, Any]:
    return next(t for t in document if t["url"] == url)


@pytest.mark.parametrize("path", LOOKUPS, ids=lambda p: p.name)
def test_the_shared_lookups_are_valid(path):
    assert lookup_problems(path) == []


def test_the_schema_says_what_the_shared_schema_says():
    shared = json.loads((FLATTENING / "flatten-lookup.schema.json").read_text())
    samples = [example_lookup(), [{"url": "u", "resourceType": "Patient", "elements": {"x": {}}}], [{"url": ""}], {}]
    samples.append([{"url": "u", "resourceType": "P", "elements": {"x": {"viewDefinition": {"unionAll": []}}}}])
    for sample in samples:
        ours = sorted(e.message for e in Draft202012Validator(LOOKUP_SCHEMA).iter_errors(sample))
        theirs = sorted(e.message for e in Draft202012Validator(shared).iter_errors(sample))
        assert ours == theirs


def test_schema_problems_name_the_table_and_element(tmp_path):
    document = example_lookup()
    table(document, DIAGNOSE)["elements"]["Condition.recordedDate"]["viewDefinition"]["forEach"] = 3

    assert problems_of(document, tmp_path) == [
        f"table {DIAGNOSE} element Condition.recordedDate: 3 is not of type 'string' (at viewDefinition/forEach)"
    ]


def test_a_table_url_listed_twice_is_named(tmp_path):
    document = example_lookup()
    document.append(copy.deepcopy(table(document, PROCEDURE)))

    assert problems_of(document, tmp_path) == [
        f"table {PROCEDURE}: the url is listed more than once (each profile needs one table)"
    ]


def test_unknown_children_two_parents_and_cycles_are_named(tmp_path):
    document = example_lookup()
    diagnose = table(document, DIAGNOSE)["elements"]
    diagnose["Condition.code"]["children"].append("Condition.nothing")
    diagnose["Condition.recordedDate"]["children"] = ["Condition.code.coding:sct"]
    procedure = table(document, PROCEDURE)["elements"]
    procedure["Procedure.code.coding:ops"]["children"] = ["Procedure.code"]

    assert problems_of(document, tmp_path) == [
        f"table {DIAGNOSE} element Condition.code: child Condition.nothing is not an element of this table",
        f"table {DIAGNOSE} element Condition.code.coding:sct: it is a child of both Condition.code and "
        "Condition.recordedDate (an element can have one parent)",
        f"table {PROCEDURE} element Procedure.code: its children lead back to it "
        "(Procedure.code → Procedure.code.coding:ops → Procedure.code)",
    ]


def test_a_snippet_that_is_no_valid_select_is_named(tmp_path):
    document = example_lookup()
    table(document, PROCEDURE)["elements"]["Procedure.status"]["viewDefinition"]["forEachOrNull"] = "status.where("

    [problem] = problems_of(document, tmp_path)
    assert problem.startswith(f"table {PROCEDURE} element Procedure.status: ")
    assert "cannot parse FHIRPath 'status.where('" in problem


def test_a_file_that_is_not_json_or_missing_is_one_problem(tmp_path):
    (tmp_path / "broken.json").write_text("[{")
    assert lookup_problems(tmp_path / "broken.json")[0].startswith(
        f"the lookup file {tmp_path / 'broken.json'} is not valid JSON"
    )
    assert lookup_problems(tmp_path / "missing.json") == [
        f"cannot read the lookup file {tmp_path / 'missing.json'}: No such file or directory"
    ]


# --- ViewDefinitions from the shared CRTDLs ---------------------------------------------------------------------


@pytest.mark.parametrize("lookup", LOOKUPS, ids=lambda p: p.name)
@pytest.mark.parametrize(
    "crtdl",
    sorted((TESTDATA / "crtdl").glob("*.json"))
    + [TESTDATA / "extraction/example-result/example-crtdl-multi-procedure.json"],
    ids=lambda p: p.name,
)
def test_the_shared_crtdls_build_valid_views_that_run(lookup, crtdl):
    tables = load_lookup(lookup)
    document = json.loads(crtdl.read_text())
    if "dataExtraction" not in document:
        with pytest.raises(ValueError, match="no dataExtraction"):
            attribute_groups(document)
        return
    resources = torch_resources()
    for group in attribute_groups(document):
        if group.profile not in tables:
            continue
        view = compile_view(build_view(group, tables[group.profile]).view)
        assert view.columns[0] == "id"
        for resource in resources:
            list(view.rows(resource))


def torch_resources() -> list[dict[str, Any]]:
    path = TESTDATA / "extraction/example-result/b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
    return [r for line in path.read_text().splitlines() for r in line_resources(json.loads(line))]


def test_an_attribute_covered_by_its_selected_ancestor_is_not_repeated():
    views, _ = plan_views(FLATTENING / "example" / "example-crtdl.json", FLATTENING / "flatten-lookup.json")
    diagnosis = compile_view(views[1].view)
    assert diagnosis.columns.count("code_code_sct") == 1


def test_a_child_selected_alone_is_wrapped_in_its_ancestors_iteration(tmp_path):
    crtdl = {
        "dataExtraction": {
            "attributeGroups": [
                {
                    "id": "g",
                    "name": "ICD",
                    "groupReference": DIAGNOSE,
                    "attributes": [{"attributeRef": "Condition.code.coding:icd10-gm"}],
                }
            ]
        }
    }
    tables = load_lookup(FLATTENING / "flatten-lookup.json")
    [group] = attribute_groups(crtdl)

    view = build_view(group, tables[DIAGNOSE]).view

    assert view["select"][1]["forEachOrNull"] == "code"
    assert view["select"][1]["select"][0]["forEachOrNull"].startswith(
        "coding.where(system = 'http://fhir.de/CodeSystem/bfarm/icd-10-gm')"
    )
    assert compile_view(view).columns == ["id", "patient", "code_system_icd10gm", "code_code_icd10gm"]
