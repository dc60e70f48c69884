"""Member paths (and the functions ending them) walked without the interpreter give exactly what fhirpathpy gives
for them."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tasks.sof.fhirpath import _interpreted, compile_path, member_steps
from tasks.sof.fhirpath_shared import MODEL
from tasks.sof.flatten import FilePlan, GroupPlan, flatten_file
from tasks.streams.ndjson import WHOLE_FILE
from tasks.streams.spans import Piece
from tasks.sof.output import csv_cells, json_bytes
from tasks.sof.resources import line_resources, parse_line, read_rows
from tasks.sof.view import compile_view
from tests.conftest import TESTDATA
from tests.support.sof import path_values

INPUTS = [
    TESTDATA / "flattening/example/input/fhir-data.ndjson",
    TESTDATA / "extraction/example-result/b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson",
]
PATHS = [
    "id",
    "subject.reference",
    "code.coding",
    "code.coding.system",
    "name.first().given",
    "name.family.first()",
    "deceased.ofType(boolean)",
    "deceased.ofType(dateTime)",
    "performed.ofType(Period).start",
    "performed.ofType(dateTime)",
    "code.coding.where(system = 'http://fhir.de/CodeSystem/bfarm/icd-10-gm').code",
    "code.coding.where(system='http://snomed.info/sct')",
    "extension.where(url = 'http://hl7.org/fhir/StructureDefinition/condition-assertedDate').value.ofType(dateTime)",
    "meta.profile",
    "clinicalStatus.coding.code",
    "identifier.type.coding.code",
    "address.city",
    "$this.id",
    "name.given.join(',')",
    "name.family.join()",
    "name.exists()",
    "code.coding.where(system = 'http://snomed.info/sct').exists()",
    "getResourceKey()",
    "subject.getReferenceKey()",
    "subject.getReferenceKey(Patient)",
]


def resources() -> list[dict]:
    return [
        r
        for path in INPUTS
        for line in path.read_text().splitlines()
        for r in line_resources(json.loads(line, parse_float=Decimal))
    ]


@pytest.mark.parametrize("path", PATHS)
def test_a_fast_path_agrees_with_the_interpreter(path):
    assert path == "$this.id" or member_steps(path) is not None
    fast, slow = compile_path(path), _interpreted(path)
    for resource in resources():
        assert path_values(fast, resource) == path_values(slow, resource), (path, resource["id"])


def test_the_member_paths_read_fhirpathpy_s_own_r4_model():
    """Read from its files without importing fhirpathpy (its package loads the interpreter): the same tables."""
    from fhirpathpy.models import models

    assert models["r4"] == MODEL


@pytest.mark.parametrize(
    "path", ["name[0]", "a + b", "where(value > 1)", "name.where(use = %u)", "a.b()", "'x'", "true"]
)
def test_anything_else_goes_to_the_interpreter(path):
    assert member_steps(path) is None


def test_lines_read_by_orjson_first_keep_the_decimals_a_column_reads_and_give_the_rows_of_the_general_way():
    view = compile_view(
        {
            "resource": "Observation",
            "select": [
                {"column": [{"name": "id", "path": "id"}, {"name": "q", "path": "valueQuantity"}]},
                {"column": [{"name": "v", "path": "value.ofType(Quantity).value"}]},
                {"forEach": "code.coding", "column": [{"name": "code", "path": "code"}]},
            ],
        }
    )
    lines = [
        b'{"resourceType":"Observation","id":"a","valueQuantity":{"value":1.50},"code":{"coding":[{"code":"x"}]}}',
        b'{"resourceType":"Observation","id":"b","code":{"coding":[{"code":"y"},{"code":"z"}]},"note":[{"v":2.50}]}',
        b'{"resourceType":"Observation","id":"c","valueQuantity":{"value":7},"code":{"coding":{"code":"w"}}}',
        b'{"resourceType":"Patient","id":"p"}',
        b'{"resourceType": "Observation", "id": "d", "code": {"coding": [{"code": "v"}]}}',
    ]
    assert view.parsed_rows is not None
    general = [row for line in lines for row in view.rows(parse_line("test", 1, line))]
    rows = list(read_rows(view, "test", enumerate(lines, 1)))
    assert rows == general
    assert rows[0] == ("a", {"value": Decimal("1.50")}, Decimal("1.50"), "x")
    assert [row[0] for row in rows] == ["a", "b", "b", "c", "d"]


def test_the_flattener_reads_lines_by_orjson_first_and_a_resource_a_view_reads_a_decimal_of_with_its_digits(tmp_path):
    view = {
        "resource": "Observation",
        "select": [{"column": [{"name": "id", "path": "id"}, {"name": "v", "path": "value.ofType(Quantity).value"}]}],
    }
    entries = [
        {"resource": {"resourceType": "Observation", "id": "a", "valueQuantity": {"value": Decimal("1.50")}}},
        {"resource": {"resourceType": "Observation", "id": "b", "valueQuantity": {"value": 7}}},
        {"resource": {"resourceType": "Patient", "id": "p", "extension": [{"valueDecimal": Decimal("2.50")}]}},
    ]
    source = tmp_path / "in.ndjson"
    lines = [{"resourceType": "Bundle", "entry": entries}, entries[1]["resource"] | {"id": "c"}]
    source.write_bytes(b"".join(json_bytes(line) + b"\n" for line in lines))
    group = GroupPlan("g", "obs.csv", "Observation", json.dumps(view))
    pieces = [Piece(source.name, WHOLE_FILE, 1, 1)]
    plan = FilePlan(str(tmp_path), pieces, str(tmp_path / "parts"), "f", (group,), (), False, 1 << 20)
    parts = flatten_file(plan)
    assert (tmp_path / "parts" / "f" / "obs.csv").read_text() == "a,1.50\nb,7\nc,7\n"
    assert parts["rows"] == [3]


def test_the_csv_rows_are_the_cells_of_the_general_rows_every_one_a_string():
    columns = [("id", "id"), ("active", "active"), ("births", "multipleBirthInteger"), ("gender", "gender")]
    view = compile_view(
        {
            "resource": "Patient",
            "select": [
                {"column": [{"name": name, "path": path} for name, path in columns]},
                {"column": [{"name": "status", "path": "maritalStatus.text"}]},
                {"forEachOrNull": "link", "column": [{"name": "other", "path": "other.reference"}]},
            ],
        }
    )
    patients = [
        {
            "resourceType": "Patient",
            "id": "p1",
            "active": True,
            "multipleBirthInteger": 2,
            "gender": "female",
            "maritalStatus": {"text": "M"},
            "link": [{"other": {"reference": "Patient/p2"}}, {"other": {}}],
        },
        {"resourceType": "Patient", "id": "p2", "active": False, "multipleBirthInteger": 0, "maritalStatus": {}},
        {"resourceType": "Patient", "id": "p3", "gender": None, "multipleBirthInteger": -12345678901234},
    ]
    cells = [view.csv_rows(patient) for patient in patients]

    assert cells == [[tuple(csv_cells(row)) for row in view.rows(patient)] for patient in patients]
    assert {type(cell) for rows in cells for row in rows for cell in row} == {str}
    assert view.csv_rows({**patients[0], "multipleBirthInteger": 1.5}) is None  # a float: the decimal-keeping way
