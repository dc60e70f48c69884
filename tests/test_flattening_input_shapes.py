"""CRTDLs and data of shapes a careful reader finds: each is refused at job start naming the fix, or flattened as its
plain form would be; never a bare Python error, never a resource dropped without a count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.settings import RetrySettings, TlsSettings
from flows.job_crtdl import refuse_unusable_group_names
from flows.jobs import JobError
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.flattening import flatten_with_service, plan_views
from tasks.job.flattening_outcome import FlatteningError
from tasks.sof.crtdl_views import AttributeGroup, build_view
from tasks.sof.lookup import LookupTable
from tasks.sof.resources import may_hold, read_rows
from tasks.sof.view import compile_view
from tests.flattening_runs import flatten_files
from tests.support.flattening import EXAMPLE, GROUP_SYSTEM, LOOKUP, group_ids

MB = 1 << 20


def example_crtdl(tmp_path: Path, change) -> Path:
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    change(crtdl["dataExtraction"]["attributeGroups"])
    path = tmp_path / "crtdl.json"
    path.write_text(json.dumps(crtdl))
    return path


def one_line(tmp_path: Path, line: dict) -> Path:
    path = tmp_path / "in" / "batch.ndjson"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(line) + "\n")  # not orjson: it writes at most 254 levels
    return path


def test_two_groups_of_one_id_are_refused_before_the_job_exists(tmp_path):
    def same_id(groups):  # a copy-paste slip: the Procedure group keeps the Diagnosis group's id
        groups[2]["id"] = groups[1]["id"]

    crtdl = example_crtdl(tmp_path, same_id)
    with pytest.raises(JobError) as refused:
        refuse_unusable_group_names(crtdl, json.loads(crtdl.read_text()))
    assert str(refused.value) == (
        f"invalid CRTDL {crtdl} for the flattening step: attribute groups 2 ('Diagnosis') and 3 ('Procedure') of the "
        f"CRTDL's attributeGroups share the id '{group_ids()['Condition']}'; resources are routed to a group by its "
        "id: give group 3 an id of its own in the CRTDL"
    )
    with pytest.raises(FlatteningError, match="share the id"):  # a job made before the check: refused at the step
        plan_views(crtdl, LOOKUP)


@pytest.mark.parametrize(
    "attributes", [5, True, {"attributeRef": "Procedure.status"}, [{"attributeRef": 7}], ["Procedure.status"]], ids=repr
)
def test_attributes_that_are_no_list_of_references_are_refused_naming_the_group(tmp_path, attributes):
    """A number failed start with a bare TypeError; an object gave the group no columns without a word."""

    def broken(groups):
        groups[2]["attributes"] = attributes

    crtdl = example_crtdl(tmp_path, broken)
    with pytest.raises(JobError) as refused:
        refuse_unusable_group_names(crtdl, json.loads(crtdl.read_text()))
    assert "its attributes must be a list of objects with a string attributeRef; fix the CRTDL" in str(refused.value)
    assert "attribute group 'd49d96a5-53af-4069-862b-2ff804eac084'" in str(refused.value)


def test_an_attribute_listed_twice_gives_its_columns_once(tmp_path):
    def twice(groups):
        groups[2]["attributes"].append(dict(groups[2]["attributes"][0]))

    views, _ = plan_views(example_crtdl(tmp_path, twice), LOOKUP)
    plain, _ = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    assert [v.view for v in views] == [v.view for v in plain]


@pytest.mark.parametrize(
    "kind", ["FamilyMemberHistory", "EpisodeOfCare", "NutritionOrder", "BodyStructure", "RelatedPerson"]
)
def test_the_patient_column_of_a_type_that_names_its_patient_patient(kind):
    url = f"https://example.org/{kind}"
    columns = {"viewDefinition": {"column": [{"name": "status", "path": "status"}]}}
    table = LookupTable(kind, {f"{kind}.status": columns}, {})
    view = build_view(AttributeGroup("g", kind, url, kind, [f"{kind}.status"]), table).view
    resource = {"resourceType": kind, "id": "r1", "patient": {"reference": "Patient/p1"}, "status": "active"}
    assert list(compile_view(view).rows(resource)) == [("r1", "Patient/p1", "active")]


PATIENT = {"resourceType": "Patient", "id": "p1", "gender": "male"}


def routed_patient(*more: dict) -> dict:
    provenance = {
        "resourceType": "Provenance",
        "target": [{"reference": "Patient/p1"}],
        "entity": [{"what": {"identifier": {"system": GROUP_SYSTEM, "value": group_ids()["Patient"]}}}],
    }
    entries = [{"resource": PATIENT}, {"resource": provenance}, *more]
    return {"resourceType": "Bundle", "type": "transaction", "entry": entries}


MALFORMED = {
    "an entry that is a string": {**routed_patient(), "entry": [*routed_patient()["entry"], "x"]},
    "entries that are an object": {"resourceType": "Bundle", "entry": {"resource": PATIENT}},
    "a Provenance target that is a string": routed_patient(
        {"resource": {"resourceType": "Provenance", "target": "Patient/p1", "entity": []}}
    ),
    "a Provenance entity.what that is a string": routed_patient(
        {"resource": {"resourceType": "Provenance", "target": [{"reference": "Patient/p1"}], "entity": [{"what": "x"}]}}
    ),
    "a Provenance identifier that is a list": routed_patient(
        {"resource": {"resourceType": "Provenance", "entity": [{"what": {"identifier": [{"system": GROUP_SYSTEM}]}}]}}
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_entries_and_provenance_parts_route_nothing_and_break_nothing(tmp_path, case):
    source = one_line(tmp_path, MALFORMED[case])
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    outcome = flatten_files([source], tmp_path / "out", views, skipped, max_line_bytes=MB)
    counted = [(g.resource_type, g.resources, g.rows) for g in outcome.groups]
    held = 0 if case == "entries that are an object" else 1  # an object of entries holds none
    assert counted == [("Patient", held, held), ("Condition", 0, 0), ("Procedure", 0, 0)]


def test_the_service_engine_names_the_line_of_a_resource_too_deep_to_send(tmp_path, flattener_fake):
    deep: dict = {}
    inner = deep
    for _ in range(300):  # orjson reads 1024 levels but writes 254
        inner["x"] = {}
        inner = inner["x"]
    line = routed_patient()
    line["entry"][0]["resource"] = {**PATIENT, "extension": [deep]}
    source = one_line(tmp_path, line)
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    retry = RetrySettings(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0)
    with ServiceClient(ServiceEndpoint("flattening", flattener_fake.base_url), TlsSettings(), retry) as client:
        with pytest.raises(FlatteningError) as refused:
            flatten_with_service([source], tmp_path / "out", views, skipped, MB, Flattener(client), 500 * MB)
    assert str(refused.value) == (
        f"{source}: line 1 is nested too deeply (over 254 levels) to be sent to the flattening service"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.csv"))


def test_a_line_whose_own_type_key_is_escaped_is_read_not_passed_over(tmp_path):
    line = b'{"resource\\u0054ype":"Patient","id":"p1","contained":[{"resourceType":"Observation","id":"o"}]}'
    assert may_hold(line, frozenset({b"Patient"}))
    assert not may_hold(line.replace(b"\\u0054", b"T"), frozenset({b"Condition"}))  # the plain form still skipped
    assert not may_hold(b'{"resourceType":"Observation","note":"Gr\\u00fc\\u00df"}', frozenset({b"Patient"}))
    view = compile_view({"resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]})
    assert list(read_rows(view, "data.ndjson", [(1, line)])) == [("p1",)]
