"""The compiled engine's own parts: FHIRPath functions on empty input, member paths that must go the general way,
batched CSV rows, lines passed over by type, and nested selects joined to their parent."""

from __future__ import annotations

import io
from decimal import Decimal

import orjson
import pytest

from tasks.sof import compile_view
from tasks.sof.fhirpath import Item, _interpreted, compile_path, values
from tasks.sof.output import ROWS_PER_BATCH, csv_cells, csv_writer
from tasks.sof.resources import may_hold, read_resources

PATIENTS = [
    {"resourceType": "Patient", "id": "pt1", "name": [{"given": ["g1", "g2"]}, {"given": ["g3"]}]},
    {"resourceType": "Patient", "id": "pt2", "name": [{"family": "f2"}]},
    {"resourceType": "Patient", "id": "pt3"},
]


def column_values(path: str, resources: list[dict] = PATIENTS) -> list:
    view = compile_view({"resource": "Patient", "select": [{"column": [{"name": "v", "path": path}]}]})
    return [row[0] for resource in resources for row in view.rows(resource)]


@pytest.mark.parametrize("path", ["name.given.join(', ')", "name.given.join()", "(name.given).join(', ')"])
def test_join_of_an_empty_collection_is_the_empty_string(path):
    """The SQL-on-FHIR suite's fhirpath.json ("string join", "string join: default separator")."""
    joined = column_values(path)
    assert joined[1:] == ["", ""]
    assert joined[0] in ("g1, g2, g3", "g1g2g3")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("name.family.replaceMatches('f', 'x')", [None, "x2", None]),
        ("name.family.matches('f')", [None, True, None]),
        ("id.matches('')", [True, True, True]),
        ("name.family.lowBoundary()", [None, None, None]),
        ("name.family.getReferenceKey()", [None, None, None]),
        ("name.family.exists()", [False, True, False]),
    ],
)
def test_functions_on_empty_input_give_no_value(path, expected):
    assert column_values(path) == expected


CONTAINED = {
    "resourceType": "Patient",
    "id": "p",
    "contained": [{"resourceType": "Observation", "id": "o", "valueQuantity": {"value": Decimal("1.50")}}],
    "name": [
        {"resourceType": "Observation", "valueString": "not a name"},
        {"family": "f", "_family": {"extension": [{"url": "u", "valueCode": "c"}]}},
    ],
    "deceasedBoolean": True,
}


@pytest.mark.parametrize(
    "path",
    [
        "contained.id",
        "contained.value.ofType(Quantity).value",
        "name.family",
        "name.value",
        "deceased",
        "name.family.exists()",
        "contained.getResourceKey()",
        "getResourceKey()",
    ],
)
def test_member_paths_the_data_decides_agree_with_the_interpreter(path):
    focus = Item(CONTAINED, "Patient")
    assert values(compile_path(path)(focus, {})) == values(_interpreted(path)(focus, {}))


def test_rows_written_in_batches_are_the_same_bytes():
    rows = [(str(n), None, True, Decimal("1.10"), "a,b") for n in range(ROWS_PER_BATCH + 500)]
    rows[ROWS_PER_BATCH + 10] = ("x", "bare\rcarriage return", False, 1, "")
    one_by_one, batched = io.StringIO(), io.StringIO()
    writer = csv_writer(one_by_one)
    for row in rows:
        writer.writerow(csv_cells(row))

    assert csv_writer(batched).writerows(iter(rows)) == len(rows)
    assert batched.getvalue() == one_by_one.getvalue()


def test_lines_of_other_types_are_passed_over_unparsed():
    lines = [
        b'{"resourceType":"Observation","id":"o1","valueQuantity":{"value":1.5}}',
        b'{"resourceType":"Observation", not json at all',
        b'{"resourceType":"Medication","contained":[{"resourceType":"Patient","id":"c"}]}',
        orjson.dumps({"resourceType": "Bundle", "entry": [{"resource": PATIENTS[0]}]}),
        b'{"resourceType":"Patient","id":"p","multipleBirthDecimal":2.50}',
    ]

    found = list(read_resources("batch.ndjson", enumerate(lines, start=1), ["Patient"]))

    assert [resource.get("id") for resource in found] == [None, "pt1", "p"]
    assert found[2]["multipleBirthDecimal"] == Decimal("2.50")
    patients = frozenset({b"Patient"})
    assert may_hold(b'{"id":"no type"}', patients)
    assert may_hold(b'{"resourceType":"Pat\\u0069ent"}', patients)
    assert may_hold(b'{"note":"resourceType","resourceType":"Pat\\u0069ent"}', patients)
    assert may_hold(b'{"note":"resourceType","resourceType":"Observation"}', patients)  # parsed to be sure
    assert not may_hold(b'{"resourceType":"Observation","contained":[{"resourceType":"Device"}]}', patients)


def test_nested_single_row_selects_keep_their_null_row():
    view = compile_view(
        {
            "resource": "Patient",
            "select": [
                {"column": [{"name": "id", "path": "id"}]},
                {
                    "forEachOrNull": "name",
                    "column": [{"name": "index", "path": "%rowIndex"}],
                    "select": [
                        {"column": [{"name": "inner", "path": "%rowIndex"}, {"name": "family", "path": "family"}]}
                    ],
                },
            ],
        }
    )

    assert view.columns == ["id", "index", "inner", "family"]
    assert [row for resource in PATIENTS for row in view.rows(resource)] == [
        ("pt1", 0, 0, None),
        ("pt1", 1, 1, None),
        ("pt2", 0, 0, "f2"),
        ("pt3", 0, None, None),
    ]
