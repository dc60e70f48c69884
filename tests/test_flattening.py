"""The flattening step's plain functions: the shared example byte for byte (embedded and through a fake ``$run``),
routing through Provenance, unrouted counts, CSV cell rules, budgets, health checks, no half-written files."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.clients.flattener import Flattener, StepError, run_parameters
from tasks.flattening import flatten_with_service, plan_views, save_view_definitions
from tasks.job.flattening_outcome import FlatteningError
from tasks.sof.crtdl_views import (
    attribute_groups,
    csv_file_name,
    generated_group_id,
    group_name_problems,
    short_group_id,
)
from tasks.sof.errors import SofError
from tasks.sof.flatten import reference_key
from tasks.sof.resources import parse_line
from tests.conftest import TESTDATA
from tests.flattening_runs import flatten_files
from tests.support.flattening import open_service

EXAMPLE = TESTDATA / "flattening" / "example"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
TORCH_RESULT = TESTDATA / "extraction" / "example-result"
MB = 1024 * 1024
EXPECTED = sorted(p.name for p in (EXAMPLE / "expected").iterdir())


def run_example(out: Path, service: Flattener | None = None, budget: int = 500 * MB, inputs: list[Path] | None = None):
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    paths = inputs or [EXAMPLE / "input" / "fhir-data.ndjson"]
    if service is None:
        return flatten_files(paths, out, views, skipped, max_line_bytes=10 * MB)
    return flatten_with_service(paths, out, views, skipped, 10 * MB, service, budget)


def assert_expected_csvs(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == EXPECTED
    for name in EXPECTED:
        assert (out / name).read_bytes() == (EXAMPLE / "expected" / name).read_bytes(), name


# --- the shared example ------------------------------------------------------------------------------------------


def test_the_example_gives_the_expected_csvs_byte_for_byte_through_the_embedded_engine(tmp_path):
    outcome = run_example(tmp_path / "out")

    assert_expected_csvs(tmp_path / "out")
    assert outcome.routing == "provenance" and outcome.engine == "embedded"
    assert [(g.csv, g.resources, g.rows) for g in outcome.groups] == [
        ("MII PR Person Patient (Pseudonymisiert).csv", 2, 2),
        ("Diagnosis.csv", 1, 2),
        ("Procedure.csv", 1, 1),
    ]
    assert not outcome.unrouted
    assert sorted((f.name, f.resources) for f in outcome.files) == [
        ("Diagnosis.csv", 2),
        ("MII PR Person Patient (Pseudonymisiert).csv", 2),
        ("Procedure.csv", 1),
    ]


def test_the_example_gives_the_expected_csvs_byte_for_byte_through_the_service(flattener_fake, tmp_path):
    with open_service(flattener_fake) as client:
        service = Flattener(client)
        service.check()
        outcome = run_example(tmp_path / "out", service)

    assert_expected_csvs(tmp_path / "out")
    assert outcome.engine == "service"
    assert sorted(run.resources for run in flattener_fake.state.runs) == [1, 1, 2]


def test_the_service_budget_splits_a_group_into_several_runs_with_the_same_rows(flattener_fake, tmp_path):
    with open_service(flattener_fake) as client:
        run_example(tmp_path / "out", Flattener(client), budget=3 * 100)

    assert_expected_csvs(tmp_path / "out")
    assert [run.resources for run in flattener_fake.state.runs] == [1, 1, 1, 1]


def test_a_zstd_input_reads_like_a_plain_one(tmp_path):
    source = tmp_path / "in" / "batch.ndjson.zst"
    source.parent.mkdir()
    source.write_bytes(zstandard.ZstdCompressor().compress((EXAMPLE / "input" / "fhir-data.ndjson").read_bytes()))

    run_example(tmp_path / "out", inputs=[source])

    assert_expected_csvs(tmp_path / "out")


# --- the service client -----------------------------------------------------------------------------------------


def test_a_server_without_run_on_viewdefinition_is_not_a_flattening_service(flattener_fake):
    flattener_fake.state.reset(not_a_flattener=True)
    with open_service(flattener_fake) as client, pytest.raises(StepError, match="is not a flattening service"):
        Flattener(client).check()


def test_run_failures_are_retried_and_the_rows_come_back(flattener_fake, tmp_path):
    flattener_fake.state.reset(fail_next=2)
    with open_service(flattener_fake, max_attempts=3) as client:
        rows = list(
            Flattener(client).run(
                b'{"resource":"Patient","select":[{"column":[{"name":"id","path":"id"}]}]}',
                [b'{"resourceType":"Patient","id":"p1"}'],
            )
        )
    assert rows == [{"id": "p1"}]


def test_the_run_body_is_a_parameters_with_the_view_first_then_one_part_per_resource():
    body = json.loads(run_parameters(b'{"resource":"Patient"}', [b'{"id":"a"}', b'{"id":"b"}']))
    assert body == {
        "resourceType": "Parameters",
        "parameter": [
            {"name": "viewDefinition", "resource": {"resource": "Patient"}},
            {"name": "resources", "resource": {"id": "a"}},
            {"name": "resources", "resource": {"id": "b"}},
        ],
    }


# --- routing ----------------------------------------------------------------------------------------------------


def test_a_torch_batch_routes_through_provenance_and_counts_what_nothing_routes(tmp_path):
    crtdl = TORCH_RESULT / "example-crtdl-multi-procedure.json"
    views, skipped = plan_views(crtdl, LOOKUP)
    paths = [TORCH_RESULT / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"]

    outcome = flatten_files(paths, tmp_path / "out", views, skipped, max_line_bytes=10 * MB)

    counts = {g.group.name: g.resources for g in outcome.groups}
    assert counts == {
        "MII PR Person Patient (Pseudonymisiert)": 1,
        "Diagnosis": 2,
        "Procedure one": 2,
        "Procedure two": 2,
    }
    assert outcome.unrouted == Counter({"Encounter": 2})
    assert outcome.unknown_groups == Counter({"generated-86a1da51": 2})
    assert outcome.summary()["unrouted"] == {"Encounter": 2}
    procedure_two = (tmp_path / "out" / "Procedure two.csv").read_text().splitlines()
    assert procedure_two[0] == "id,patient,system_ops,code_ops,system_sct,code_sct,status"
    assert len(procedure_two) == 3


def test_without_any_provenance_resources_are_routed_by_type_and_it_says_so(tmp_path):
    bundle = json.loads((EXAMPLE / "input" / "fhir-data.ndjson").read_text())
    plain = tmp_path / "in" / "plain.ndjson"
    plain.parent.mkdir()
    resources = [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] != "Provenance"]
    plain.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in resources + [{"resourceType": "Encounter", "id": "e"}]))

    outcome = run_example(tmp_path / "out", inputs=[plain])

    assert outcome.routing == "resource type"
    assert_expected_csvs(tmp_path / "out")
    assert outcome.unrouted == Counter({"Encounter": 1})


def test_bare_provenance_lines_route_the_bare_resources_of_their_file(tmp_path):
    bundle = json.loads((EXAMPLE / "input" / "fhir-data.ndjson").read_text())
    resources = [e["resource"] for e in bundle["entry"]]
    provenance_first = [r for r in resources if r["resourceType"] == "Provenance"][::-1]
    data = [r for r in resources if r["resourceType"] != "Provenance"]
    source = tmp_path / "in" / "bare.ndjson"
    source.parent.mkdir()
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in data[:2] + provenance_first + data[2:]))

    outcome = run_example(tmp_path / "out", inputs=[source])

    assert outcome.routing == "provenance"
    assert_expected_csvs(tmp_path / "out")


def test_a_resource_routed_to_two_groups_is_in_both_csvs(tmp_path):
    bundle = json.loads((EXAMPLE / "input" / "fhir-data.ndjson").read_text())
    for entry in bundle["entry"]:
        if entry["resource"]["id"] == "provenance-procedure-group":
            entry["resource"]["entity"].append(
                {"what": {"identifier": dict(entry["resource"]["entity"][0]["what"]["identifier"], value="other")}}
            )
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    second = dict(crtdl["dataExtraction"]["attributeGroups"][2], id="other", name="Procedure again")
    crtdl["dataExtraction"]["attributeGroups"].append(second)
    (tmp_path / "crtdl.json").write_text(json.dumps(crtdl))
    (tmp_path / "in.ndjson").write_text(json.dumps(bundle) + "\n")
    views, skipped = plan_views(tmp_path / "crtdl.json", LOOKUP)

    outcome = flatten_files([tmp_path / "in.ndjson"], tmp_path / "out", views, skipped, max_line_bytes=MB)

    assert [g.resources for g in outcome.groups] == [2, 1, 1, 1]
    again = (tmp_path / "out" / "Procedure again.csv").read_bytes()
    assert again == (EXAMPLE / "expected" / "Procedure.csv").read_bytes()


def test_references_are_keyed_by_type_and_id():
    assert reference_key("Patient/1") == "Patient/1"
    assert reference_key("https://fhir.example/fhir/Patient/1/_history/3") == "Patient/1"
    assert reference_key("urn:uuid:abc") is None


# --- groups, files, cells ---------------------------------------------------------------------------------------


def test_a_group_without_a_lookup_table_is_skipped_with_a_warning_naming_its_profile(tmp_path, caplog):
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    crtdl["dataExtraction"]["attributeGroups"][1]["groupReference"] = "https://example.org/StructureDefinition/Unknown"
    (tmp_path / "crtdl.json").write_text(json.dumps(crtdl))

    with caplog.at_level("WARNING", logger="dupflow.flattening"):
        views, skipped = plan_views(tmp_path / "crtdl.json", LOOKUP)
        outcome = flatten_files(
            [EXAMPLE / "input" / "fhir-data.ndjson"], tmp_path / "out", views, skipped, max_line_bytes=MB
        )

    assert "https://example.org/StructureDefinition/Unknown" in caplog.text
    assert [g.name for g in skipped] == ["Diagnosis"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "MII PR Person Patient (Pseudonymisiert).csv",
        "Procedure.csv",
    ]
    assert outcome.skipped_resources == Counter({"Condition": 1})
    assert not outcome.unrouted


def run_with(
    engine: str,
    request,
    paths: list[Path],
    out: Path,
    crtdl: Path = EXAMPLE / "example-crtdl.json",
    lookup: Path = LOOKUP,
):
    """``paths`` flattened by the embedded engine or through the fake flattening service."""
    views, skipped = plan_views(crtdl, lookup)
    if engine == "embedded":
        return flatten_files(paths, out, views, skipped, max_line_bytes=10 * MB)
    with open_service(request.getfixturevalue("flattener_fake")) as client:
        return flatten_with_service(paths, out, views, skipped, 10 * MB, Flattener(client), 500 * MB)


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_a_group_with_no_rows_writes_a_csv_with_its_header_only(tmp_path, engine, request):
    bundle = json.loads((EXAMPLE / "input" / "fhir-data.ndjson").read_text())
    bundle["entry"] = [e for e in bundle["entry"] if e["resource"]["resourceType"] != "Procedure"]
    (tmp_path / "in.ndjson").write_text(json.dumps(bundle) + "\n")

    outcome = run_with(engine, request, [tmp_path / "in.ndjson"], tmp_path / "out")

    header = (EXAMPLE / "expected" / "Procedure.csv").read_bytes().splitlines(keepends=True)[0]
    assert (tmp_path / "out" / "Procedure.csv").read_bytes() == header
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == EXPECTED
    assert outcome.summary()["groups"][2] == {
        "group": "Procedure",
        "id": outcome.groups[2].group.id,
        "csv": "Procedure.csv",
        "resources": 0,
        "rows": 0,
    }
    assert [f.name for f in outcome.files if not f.resources] == ["Procedure.csv"]


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_a_job_whose_resources_all_went_to_groups_without_a_lookup_table_fails_naming_them(tmp_path, engine, request):
    crtdl = json.loads((TORCH_RESULT / "example-crtdl-multi-procedure.json").read_text())
    for group in crtdl["dataExtraction"]["attributeGroups"]:
        if group["name"] != "Procedure one":
            group["groupReference"] = f"https://example.org/StructureDefinition/no-table-{group['name'][:4]}"
    (tmp_path / "crtdl.json").write_text(json.dumps(crtdl))
    bundles = [json.loads(line) for line in (TORCH_RESULT / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson").open()]
    for bundle in bundles:  # "Procedure one" gets no resource: no row anywhere
        bundle["entry"] = [e for e in bundle["entry"] if e["resource"]["resourceType"] != "Procedure"]
    source = tmp_path / "in" / "batch.ndjson"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(bundle) + "\n" for bundle in bundles))

    with pytest.raises(FlatteningError) as error:
        run_with(engine, request, [source], tmp_path / "out", tmp_path / "crtdl.json")

    message = str(error.value)
    assert message.startswith("no CSV has a row:")
    assert "'Diagnosis' (profile https://example.org/StructureDefinition/no-table-Diag)" in message
    assert "https://example.org/StructureDefinition/no-table-MII " in message
    assert "services.flattening.lookup_path" in message
    assert not list((tmp_path / "out").glob("*.csv"))


TORCH_CRTDLS = Path(__file__).parent / "data" / "torch"
STUDY_PERSON = (
    "https://www.medizininformatik-initiative.de/fhir/modul-studie/StructureDefinition/mii-pr-studie-beteiligte-person"
)


@pytest.mark.parametrize("engine", ["embedded", "service"])
def test_two_groups_of_one_name_write_two_files_named_by_their_ids(tmp_path, engine, request, caplog):
    """TORCH's own CRTDL names two groups PractitionerRole: each gets its file, one warning names both."""
    crtdl = TORCH_CRTDLS / "crtdl-orga-with-practitioner-filter.json"
    table = {
        "url": STUDY_PERSON,
        "resourceType": "PractitionerRole",
        "elements": {
            "PractitionerRole.period": {
                "viewDefinition": {"select": [{"column": [{"name": "period_start", "path": "period.start"}]}]}
            }
        },
    }
    lookup = tmp_path / "lookup.json"
    lookup.write_text(json.dumps([*json.loads(LOOKUP.read_text()), table]))
    role = {"resourceType": "PractitionerRole", "id": "r1", "meta": {"profile": [STUDY_PERSON]}}
    role["period"] = {"start": "2023-01-05"}
    source = tmp_path / "in" / "data.ndjson"
    source.parent.mkdir()
    source.write_text(json.dumps(role) + "\n")

    assert group_name_problems(json.loads(crtdl.read_text())) == []
    with caplog.at_level("WARNING", logger="dupflow.flattening"):
        outcome = run_with(engine, request, [source], tmp_path / "out", crtdl, lookup)

    files = ["PractitionerRole-prac-group-1.csv", "PractitionerRole-prac-group-2.csv"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["Main Pat for Extraction.csv", *files]
    for name in files:
        assert (tmp_path / "out" / name).read_text() == "id,period_start\nr1,2023-01-05\n"
    shared = [r.getMessage() for r in caplog.records if "share the name" in r.getMessage()]
    assert shared == [
        "attribute groups 'prac-group-1' and 'prac-group-2' share the name 'PractitionerRole': "
        "their files are 'PractitionerRole-prac-group-1.csv' and 'PractitionerRole-prac-group-2.csv'"
    ]
    assert [(g["id"], g["csv"]) for g in outcome.summary()["groups"]][1:] == [
        ("prac-group-1", files[0]),
        ("prac-group-2", files[1]),
    ]


def test_a_group_id_that_is_no_plain_name_ends_the_file_name_as_a_short_hash():
    assert short_group_id("d20a1423-4188-4c3f-98c8-725b0f09746b") == "d20a1423-4188-4c3f-98c8-725b0f09746b"
    assert short_group_id("a/b") == hashlib.sha256(b"a/b").hexdigest()[:8]
    crtdl = {
        "dataExtraction": {
            "attributeGroups": [
                {"id": "x", "name": "Obs", "groupReference": "p"},
                {"id": "y", "name": "obs", "groupReference": "p"},
                {"id": "z", "name": "Other", "groupReference": "p"},
            ]
        }
    }
    assert [g.csv_name for g in attribute_groups(crtdl)] == ["Obs-x.csv", "obs-y.csv", "Other.csv"]
    crtdl["dataExtraction"]["attributeGroups"][1]["id"] = "x"  # one id twice: no resource could tell them apart
    with pytest.raises(SofError) as refused:
        group_name_problems(crtdl)
    assert str(refused.value) == (
        "attribute groups 1 ('Obs') and 2 ('obs') of the CRTDL's attributeGroups share the id 'x'; resources are "
        "routed to a group by its id: give group 2 an id of its own in the CRTDL"
    )


def test_group_names_one_in_unicode_normalization_end_their_file_names_with_their_ids():
    """macOS and SMB take a name's NFC and NFD forms for one file, as they take two cases for one."""
    named = [("x", "Caf\u00e9"), ("y", "Cafe\u0301"), ("z", "CAFE\u0301")]
    crtdl = {"dataExtraction": {"attributeGroups": [{"id": i, "name": n, "groupReference": "p"} for i, n in named]}}

    assert [g.csv_name for g in attribute_groups(crtdl)] == ["Caf\u00e9-x.csv", "Cafe\u0301-y.csv", "CAFE\u0301-z.csv"]
    assert group_name_problems(crtdl) == []


def test_a_group_copied_without_an_id_is_refused_naming_each_copy_by_its_position():
    """TORCH takes a CRTDL whose group is there twice (both get one generated id); names alone cannot tell the two
    apart (a group without a name is named by its id), positions can."""
    crtdl = json.loads((TESTDATA / "crtdl" / "CRTDL_observation.json").read_text())
    groups = crtdl["dataExtraction"]["attributeGroups"]
    copied = {key: value for key, value in groups[0].items() if key != "id"}
    groups[:] = [groups[1], copied, dict(copied)]

    with pytest.raises(SofError) as refused:
        attribute_groups(crtdl)

    generated = generated_group_id(copied)
    assert str(refused.value) == (
        f"attribute groups 2 ('{generated}') and 3 ('{generated}') of the CRTDL's attributeGroups share the id "
        f"'{generated}'; resources are routed to a group by its id: give group 3 an id of its own in the CRTDL"
    )


def test_cells_keep_numbers_as_written_strings_verbatim_and_json_for_objects(tmp_path):
    lookup = [
        {
            "url": "https://example.org/Obs",
            "resourceType": "Observation",
            "elements": {
                "Observation.value[x]": {
                    "viewDefinition": {
                        "column": [
                            {"name": "value", "path": "value.ofType(Quantity).value"},
                            {"name": "quantity", "path": "value.ofType(Quantity)"},
                            {"name": "note", "path": "note.text.first()"},
                            {"name": "flag", "path": "value.ofType(Quantity).value > 1"},
                        ]
                    }
                }
            },
        }
    ]
    crtdl = {
        "dataExtraction": {
            "attributeGroups": [
                {
                    "id": "g",
                    "name": "Obs: a/b",
                    "groupReference": "https://example.org/Obs",
                    "attributes": [{"attributeRef": "Observation.value[x]"}],
                }
            ]
        }
    }
    o1 = '"id":"o1","meta":{"profile":["https://example.org/Obs"]},"subject":{"reference":"Patient/1"}'
    o1 += ',"valueQuantity":{"value":1.50,"unit":"mg"}'
    note = '"note":[{"text":"=1+1, \\"quoted\\"\\nnext"}]'
    o2 = '"id":"o2","meta":{"profile":["https://example.org/Obs"]},"subject":{"reference":"Patient/2"}'
    o2 += ',"valueQuantity":{"value":12345678901234567890.000001}'
    (tmp_path / "lookup.json").write_text(json.dumps(lookup))
    (tmp_path / "crtdl.json").write_text(json.dumps(crtdl))
    source = tmp_path / "obs.ndjson"
    source.write_text(f'{{"resourceType":"Observation",{o1},{note}}}\n{{"resourceType":"Observation",{o2}}}\n')
    views, skipped = plan_views(tmp_path / "crtdl.json", tmp_path / "lookup.json")

    flatten_files([source], tmp_path / "out", views, skipped, max_line_bytes=MB)

    assert csv_file_name("Obs: a/b") == "Obs_ a_b.csv"
    assert (tmp_path / "out" / "Obs_ a_b.csv").read_bytes() == (
        b"id,patient,value,quantity,note,flag\n"
        b'o1,Patient/1,1.50,"{""value"":1.50,""unit"":""mg""}","=1+1, ""quoted""\nnext",true\n'
        b'o2,Patient/2,12345678901234567890.000001,"{""value"":12345678901234567890.000001}",,true\n'
    )


def test_a_failure_midway_leaves_no_csv_and_no_temporary_file(tmp_path):
    source = tmp_path / "in.ndjson"
    shutil.copy(EXAMPLE / "input" / "fhir-data.ndjson", source)
    with source.open("a") as out:
        out.write("{not json\n")

    with pytest.raises(FlatteningError, match="line 2 is not valid JSON"):
        run_example(tmp_path / "out", inputs=[source])

    assert list((tmp_path / "out").iterdir()) == []


def test_each_view_is_saved_as_json_that_runs_again(tmp_path):
    views, _ = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    save_view_definitions(tmp_path / "viewdefinitions", views)

    saved = sorted(p.name for p in (tmp_path / "viewdefinitions").iterdir())
    assert saved == ["Diagnosis.json", "MII PR Person Patient (Pseudonymisiert).json", "Procedure.json"]
    view = json.loads((tmp_path / "viewdefinitions" / "Diagnosis.json").read_text())
    assert view["resourceType"] == "ViewDefinition" and view["resource"] == "Condition"


def test_lines_with_decimals_keep_their_digits_and_others_parse_fast():
    assert parse_line(Path("x"), 1, b'{"a":1.50,"b":"2024-01-01T10:00:00.5"}') == {
        "a": Decimal("1.50"),
        "b": "2024-01-01T10:00:00.5",
    }
    assert parse_line(Path("x"), 1, b'{"a":1,"b":[true]}') == {"a": 1, "b": [True]}
