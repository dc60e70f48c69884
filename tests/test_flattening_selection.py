"""Data without TORCH Provenance (a plain import): each attribute group takes the resources of its type that TORCH's
search would have given it: its profile, its token and date filters; what cannot be applied is said once per group.
The data are TORCH's own test patients (BlazeBundle.json), the CRTDLs TORCH's own, changed where a test says so."""

from __future__ import annotations

import copy
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tasks.clients.flattener import Flattener
from tasks.flattening import flatten_with_service, plan_views
from tasks.job.flattening_outcome import FlatteningError, report_selection
from tasks.sof.selection import FILTERED_OUT, OTHER_PROFILE, TAKEN, compile_selection
from tests.conftest import TESTDATA
from tests.flattening_runs import flatten_files
from tests.support.flattening import open_service

CRTDLS = TESTDATA / "crtdl"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
MB = 1024 * 1024
FALL = (
    "https://www.medizininformatik-initiative.de/fhir/core/modul-fall/StructureDefinition/KontaktGesundheitseinrichtung"
)
ICD = "http://fhir.de/CodeSystem/bfarm/icd-10-gm"


def blaze_resources() -> list[dict[str, Any]]:
    bundle = json.loads((TESTDATA / "extraction" / "BlazeBundle.json").read_text())
    return [entry["resource"] for entry in bundle["entry"]]


def plain_import(tmp_path: Path, resources: list[dict[str, Any]] | None = None) -> Path:
    """TORCH's test patients one resource a line, as a folder import reads them: no Provenance anywhere."""
    path = tmp_path / "in" / "patients.ndjson"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(resource) + b"\n" for resource in resources or blaze_resources()))
    return path


def crtdl_file(tmp_path: Path, crtdl: dict[str, Any]) -> Path:
    path = tmp_path / "crtdl.json"
    path.write_text(json.dumps(crtdl))
    return path


def encounter_lookup(tmp_path: Path) -> Path:
    """The shared lookup file and a table for the MII Encounter profile (the shared one has none)."""
    table = {
        "url": FALL,
        "resourceType": "Encounter",
        "elements": {
            "Encounter.period": {
                "viewDefinition": {"select": [{"column": [{"name": "period_start", "path": "period.start"}]}]}
            }
        },
    }
    path = tmp_path / "lookup.json"
    path.write_text(json.dumps([*json.loads(LOOKUP.read_text()), table]))
    return path


def flatten(tmp_path: Path, crtdl: Path, lookup: Path = LOOKUP, engine: str = "embedded", request=None, data=None):
    views, skipped = plan_views(crtdl, lookup)
    paths, out = [plain_import(tmp_path, data)], tmp_path / "out"
    if engine == "embedded":
        return flatten_files(paths, out, views, skipped, max_line_bytes=MB)
    with open_service(request.getfixturevalue("flattener_fake")) as client:
        return flatten_with_service(paths, out, views, skipped, MB, Flattener(client), 500 * MB)


def csv_ids(tmp_path: Path, name: str) -> list[str]:
    return [line.split(",")[0] for line in (tmp_path / "out" / name).read_text().splitlines()[1:]]


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_a_code_filter_takes_only_the_conditions_of_its_code_and_a_condition_date_is_said_not_applied(
    tmp_path, engine, request, caplog
):
    """TORCH's CRTDL_diagnosis_basic: SNOMED 45252009 and a ``date`` filter; of the five Conditions one has that
    code. A Condition has no search parameter ``date`` (its dates are onset-date, recorded-date, abatement-date), so
    that filter is named as not applied; the Patient group takes every Patient, as TORCH's search does."""
    outcome = flatten(tmp_path, CRTDLS / "CRTDL_diagnosis_basic.json", engine=engine, request=request)

    assert csv_ids(tmp_path, "diagnosis basic.csv") == ["4"]
    assert {g.group.name: g.resources for g in outcome.groups} == {"diagnosis basic": 1, "Patient": 5}
    assert outcome.filtered_out == Counter({"Condition": 4})
    (note,) = {g.group.name: g.not_applied for g in outcome.groups}["diagnosis basic"]
    assert note == (
        "the date filter 'date' ('2021-01-01' to '2025-01-01'): 'date' is no date search parameter of Condition "
        "dupflow knows (known: abatement-date, onset-date, recorded-date); the group takes its Conditions of any date"
    )
    with caplog.at_level(logging.INFO, logger="dupflow.flattening"):
        report_selection(outcome)
    warned = [r.getMessage() for r in caplog.records if "diagnosis basic" in r.getMessage()]
    assert warned == [f"attribute group 'diagnosis basic': not applied: {note}"]
    assert outcome.summary()["not_applied"] == {"diagnosis basic": [note]}
    assert "filters leave out (not in any CSV): Condition 4" in caplog.text


def icd_groups(codes: list[str]) -> dict[str, Any]:
    """TORCH's kds CRTDL with its Diagnosis group (an ICD-10-GM code filter) once per code."""
    crtdl = json.loads((CRTDLS / "CRTDL_test_it-kds-perf-w-ref.json").read_text())
    groups = crtdl["dataExtraction"]["attributeGroups"]
    diagnosis = next(g for g in groups if g["id"] == "diagnosis")
    copies = []
    for code in codes:
        group = copy.deepcopy(diagnosis)
        group.update(id=f"diagnosis-{code}", name=f"Diagnosis {code}")
        group["filter"][0]["codes"] = [{"system": ICD, "code": code}]
        copies.append(group)
    groups[:] = [groups[0], *copies]
    return crtdl


def test_groups_of_one_type_filtered_on_different_icd_codes_each_take_their_own(tmp_path):
    """As the extraction expands a code to its descendants (its ontology's tree), I95 takes the I95.0 diagnosis;
    a group filtered on another code takes none of it."""
    outcome = flatten(tmp_path, crtdl_file(tmp_path, icd_groups(["I95", "B05", "I95.0"])))

    counts = {g.group.name: g.resources for g in outcome.groups}
    assert counts == {"patient": 5, "Diagnosis I95": 1, "Diagnosis B05": 0, "Diagnosis I95.0": 1}
    assert csv_ids(tmp_path, "Diagnosis I95.csv") == ["VHF00006-CD-1"]
    assert outcome.filtered_out == Counter({"Condition": 4})  # the SNOMED-coded ones


def encounter_month(start: str, end: str) -> dict[str, Any]:
    """TORCH's kds CRTDL's Patient and Encounter groups, the Encounter group filtered to ``start`` … ``end`` and
    a group of its own (there it takes the Encounters other groups reference: includeReferenceOnly)."""
    crtdl = json.loads((CRTDLS / "CRTDL_test_it-kds-perf-w-ref.json").read_text())
    groups = crtdl["dataExtraction"]["attributeGroups"]
    encounter = next(g for g in groups if g["id"] == "encounter")
    encounter["includeReferenceOnly"] = False
    encounter["filter"] = [{"type": "date", "name": "date", "start": start, "end": end}]
    groups[:] = [groups[0], encounter]
    return crtdl


@pytest.mark.parametrize(
    ("start", "end", "taken"),
    [
        ("2021-01-01", "2021-01-31", ["VHF00006-E-1", "VHF00006-E-1-A-1"]),  # the period ends on 2021-01-02
        ("2018-12-01", "2018-12-31", []),  # before it began
        ("2021-01-03", "2021-01-31", []),  # after it ended
    ],
)
def test_an_encounter_group_filtered_to_a_month_takes_the_encounters_of_that_month(tmp_path, start, end, taken):
    crtdl = crtdl_file(tmp_path, encounter_month(start, end))

    outcome = flatten(tmp_path, crtdl, encounter_lookup(tmp_path))

    assert csv_ids(tmp_path, "Encounter.csv") == taken
    assert outcome.filtered_out == (Counter({"Encounter": 2}) if not taken else Counter())
    assert outcome.other_profile == Counter({"Encounter": 2})  # two Encounters without a meta.profile
    assert not [g.not_applied for g in outcome.groups if g.not_applied]


def test_a_filter_that_cannot_be_applied_is_named_once_and_the_group_takes_its_profile(tmp_path):
    """A search parameter of another resource type (``code`` on an Encounter), includeReferenceOnly and mustHave:
    each named in the group's one warning; the group takes every Encounter of its profile."""
    crtdl = encounter_month("2021-01-01", "2021-01-31")
    encounter = crtdl["dataExtraction"]["attributeGroups"][1]
    encounter["filter"].append({"type": "token", "name": "code", "codes": [{"system": ICD, "code": "I95"}]})
    encounter["includeReferenceOnly"] = True
    encounter["attributes"][0]["mustHave"] = True

    outcome = flatten(tmp_path, crtdl_file(tmp_path, crtdl), encounter_lookup(tmp_path))

    assert csv_ids(tmp_path, "Encounter.csv") == ["VHF00006-E-1", "VHF00006-E-1-A-1"]
    assert {g.group.name: g.not_applied for g in outcome.groups}["Encounter"] == (
        f"the token filter 'code' ('{ICD}|I95'): 'code' is no token search parameter of Encounter dupflow knows "
        "(known: class, type); the group takes its Encounters of any code",
        "includeReferenceOnly (the group takes every Encounter of its profile, not only those other groups reference)",
        f"mustHave of {encounter['attributes'][0]['attributeRef']} (patients without them are not left out)",
    )


def test_data_of_none_of_the_groups_profiles_fail_naming_the_profiles(tmp_path):
    """TORCH's Condition group on the test patients' Conditions as a server that keeps no meta.profile exports them:
    no group takes a resource, and the refusal says it is the profiles."""
    crtdl = json.loads((CRTDLS / "CRTDL_diagnosis_basic.json").read_text())
    crtdl["dataExtraction"]["attributeGroups"][1:] = []  # no Patient group, which would take every Patient
    diagnose = crtdl["dataExtraction"]["attributeGroups"][0]["groupReference"]
    conditions = [r for r in blaze_resources() if r["resourceType"] == "Condition"]
    for condition in conditions:
        del condition["meta"]

    with pytest.raises(FlatteningError) as refused:
        flatten(tmp_path, crtdl_file(tmp_path, crtdl), data=conditions)

    message = str(refused.value)
    assert "no input resource was routed to any attribute group" in message
    assert f"no meta.profile of the input's Condition 5 is theirs ({diagnose})" in message
    assert not list((tmp_path / "out").glob("*.csv"))


def test_with_provenance_the_filters_are_the_extraction_s_and_nothing_is_filtered_again(tmp_path):
    """TORCH's own result: its Provenance routes; a filter the CRTDL has is not applied a second time."""
    result = TESTDATA / "extraction" / "example-result"
    crtdl = json.loads((result / "example-crtdl-multi-procedure.json").read_text())
    diagnosis = crtdl["dataExtraction"]["attributeGroups"][1]
    diagnosis["filter"] = [{"type": "token", "name": "code", "codes": [{"system": ICD, "code": "none"}]}]
    views, skipped = plan_views(crtdl_file(tmp_path, crtdl), LOOKUP)

    outcome = flatten_files(
        [result / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"], tmp_path / "out", views, skipped, max_line_bytes=MB
    )

    assert {g.group.name: g.resources for g in outcome.groups}["Diagnosis"] == 2
    assert "not_applied" not in outcome.summary()


# --- the test on one resource ------------------------------------------------------------------------------------


def test_a_profile_is_matched_with_or_below_its_version():
    encounters = [r for r in blaze_resources() if r["resourceType"] == "Encounter"]  # FALL, FALL|2024, none, none
    any_version = compile_selection("Encounter", FALL, [], False, [])
    assert [any_version.check(r) for r in encounters] == [TAKEN, TAKEN, OTHER_PROFILE, OTHER_PROFILE]
    versioned = compile_selection("Encounter", FALL + "|2024", [], False, [])
    assert [versioned.check(r) for r in encounters[:2]] == [OTHER_PROFILE, TAKEN]
    assert compile_selection("Encounter", FALL + "|20", [], False, []).check(encounters[1]) == OTHER_PROFILE


@pytest.mark.parametrize(
    ("value", "taken"),
    [
        ("2021", True),  # a year overlaps the month
        ("2021-02", False),
        ("2021-01-31T23:30:00+01:00", True),  # the date as written, whatever its offset
        ("2020-12-31", False),
        ({"start": "2020-12-01"}, True),  # open-ended: still going on
        ({"end": "2021-01-01"}, True),
        ({"start": "2021-02-01", "end": "2021-03-01"}, False),
        ({}, False),
        (None, False),  # a resource without the element is not taken, as in a search
    ],
)
def test_a_date_filter_takes_what_overlaps_its_days(value, taken):
    date = [{"type": "date", "name": "date", "start": "2021-01-01", "end": "2021-01-31"}]
    selection = compile_selection("Encounter", FALL, date, False, [])
    encounter = {"resourceType": "Encounter", "meta": {"profile": [FALL]}}
    if value is not None:
        encounter["period"] = value if isinstance(value, dict) else {"start": value, "end": value}
    assert selection.check(encounter) == (TAKEN if taken else FILTERED_OUT)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_the_step_on_a_plain_import_records_what_its_filters_left_out_and_could_not_apply(tmp_path):
    """The step in a Prefect run: its summary (the job's record) and its table artifact say what the profiles and
    filters left out, and what of the CRTDL could not be applied."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from tasks.job.contract import DataFile
    from tasks.job.layout import artifact_key
    from tests.steps import step_input
    from tests.support.flattening import run_step

    job_dir = tmp_path / "plain-import-job"
    source = plain_import(job_dir)  # job_dir/in/
    files = [DataFile(name=source.name, size=source.stat().st_size, resources=23)]
    crtdl = str(CRTDLS / "CRTDL_diagnosis_basic.json")
    step = step_input(
        job_dir,
        "flattening",
        folder="in",
        files=files,
        facts={"crtdl_path": crtdl},
        position=1,
        pipeline__enabled_steps="[local_import, flattening]",
        services__flattening__lookup_path=str(LOOKUP),
    )

    result = run_step(step)

    assert result.summary["routing"] == "resource type"
    assert result.summary["filtered_out"] == {"Condition": 4}
    assert list(result.summary["not_applied"]) == ["diagnosis basic"]
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(step.job_id, "flattening")])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert {"group": "(left out by the filters)", "id": "", "csv": "Condition", "resources": 4, "rows": 0} in rows


def test_a_filter_torch_would_refuse_is_named_and_a_patient_group_takes_every_patient():
    condition = next(r for r in blaze_resources() if r["resourceType"] == "Condition")
    diagnose = condition["meta"]["profile"][0]
    no_system = [{"type": "token", "name": "code", "codes": [{"code": "I95"}]}]
    no_date = [{"type": "date", "name": "recorded-date", "start": "2021-13-01"}]

    assert compile_selection("Condition", diagnose, no_system, False, []).not_applied == (
        "the token filter 'code' ('None|I95'): a code without its system or code; the group takes its Conditions of "
        "any code",
    )
    assert compile_selection("Condition", diagnose, no_date, False, []).not_applied == (
        "the date filter 'recorded-date' ('2021-13-01' to …): '2021-13-01' is no date (YYYY-MM-DD); the group "
        "takes its Conditions of any date",
    )
    patients = compile_selection("Patient", diagnose, no_system + no_date, True, ["Patient.gender"])
    assert patients.not_applied == () and patients.check({"resourceType": "Patient"}) == TAKEN


def test_codings_and_dates_of_any_shape_are_tested_without_an_error():
    """Data from anywhere: a coding whose system is a list (which would not hash), a date that is no date."""
    condition = next(r for r in blaze_resources() if r["id"] == "VHF00006-CD-1")  # ICD-10-GM I95.0, 2022-01-01
    diagnose = condition["meta"]["profile"][0]
    filters = [
        {"type": "token", "name": "code", "codes": [{"system": ICD, "code": "I95"}]},
        {"type": "date", "name": "recorded-date", "start": "2021-01-01", "end": "2022-12-31"},
    ]
    selection = compile_selection("Condition", diagnose, filters, False, [])
    assert selection.check(condition) == TAKEN

    odd = copy.deepcopy(condition)
    odd["code"]["coding"][:0] = [{"system": [ICD], "code": {"I95": 1}}, "I95", {"system": ICD}]
    assert selection.check(odd) == TAKEN
    odd["recordedDate"] = "yesterday, around noon"
    assert selection.check(odd) == FILTERED_OUT
    odd["meta"]["profile"] = [{"url": diagnose}, 7]
    assert selection.check(odd) == OTHER_PROFILE
