"""The compiled engine's own parts: FHIRPath functions on empty input, member paths that must go the general way,
batched CSV rows, lines passed over by type, nested selects joined to their parent, and compiled selects giving the
rows (and errors) the general way gives."""

from __future__ import annotations

import io
from decimal import Decimal

import orjson
import pytest

from tasks.sof.view import compile_view
from tasks.sof import compiled_code
from tasks.sof.compiled_code import KEPT, PARSED, generated_rows
from tasks.sof.errors import ViewEvaluationError
from tasks.sof.fhirpath import _interpreted, compile_path
from tasks.sof.output import ROWS_PER_BATCH, CsvWriter, csv_cells
from tasks.sof.resources import may_hold
from tasks.sof.view import CACHED_ROWS
from tests.support.sof import (
    GENERATED_VIEW,
    IRREGULAR_CONDITIONS,
    IRREGULAR_VIEW,
    PAIRED_CONDITIONS,
    PATIENTS,
    SIBLING_WHERES_VIEW,
    WAYS,
    column_values,
    in_one_way,
    path_values,
    read_resources,
    with_compiled,
)


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
    assert path_values(compile_path(path), CONTAINED) == path_values(_interpreted(path), CONTAINED)


def test_rows_written_in_batches_are_the_same_bytes():
    rows = [(str(n), None, True, Decimal("1.10"), "a,b") for n in range(ROWS_PER_BATCH + 500)]
    rows[ROWS_PER_BATCH + 10] = ("x", "bare\rcarriage return", False, 1, "")
    same_csv_in_batches(rows)


def same_csv_in_batches(rows: list[tuple]) -> str:
    """The CSV of ``rows`` written in batches, checked to be the bytes of each row written as its cells."""
    one_by_one, batched = io.StringIO(), io.StringIO()
    writer = CsvWriter(one_by_one)
    for row in rows:
        writer.writerow(csv_cells(row))

    assert CsvWriter(batched).writerows(iter(rows)) == len(rows)
    assert batched.getvalue() == one_by_one.getvalue()
    return batched.getvalue()


def test_rows_of_strings_nulls_and_numbers_go_to_csv_as_they_are_the_same_bytes():
    rows = [(str(n), None, n, Decimal("1.10"), "a,b", 'q"') for n in range(ROWS_PER_BATCH + 5)]
    rows[3] = (None,)
    rows[ROWS_PER_BATCH + 2] = ("bare\rcarriage return", None, 2, Decimal("0.0"), "", "")
    same_csv_in_batches(rows)


@pytest.mark.parametrize(
    "rows",
    [
        [(None, "a", True), ("b", None, False), (None, None, None)],
        [(None, 1, "null"), ("x", "y", None), (2, None, "z")],
        [("a", "b]", None), ("c", "d", 1)],
        [("a", "b", None), ("c", "d]", 1)],
        [("[a", "b", None), ("c", "d", 1)],
        [("a", [], None), ("c", "d", 1)],
        [("a", "b", None), ("c", "d,e", 1)],
        [("a", True, None)],
    ],
    ids=["nulls", "null text", "bracket", "last bracket", "open bracket", "array", "comma", "one row"],
)
def test_rows_of_nulls_booleans_ints_and_brackets_go_to_csv_as_their_cells(rows: list[tuple]):
    """The CSV made from the rows' JSON (rows of more than strings): a null opening a line or after a comma is an
    empty cell; a bracket or comma in a cell, or an array, leaves the batch to ``csv``."""
    same_csv_in_batches(rows)


@pytest.mark.parametrize(
    ("value", "cell"),
    [({"k": 1}, '"{""k"":1}"'), ({"k": "v"}, '"{""k"":""v""}"'), (["a"], '"[""a""]"'), ([], "[]"), ({}, "{}")],
    ids=["object", "string member", "array", "empty array", "empty object"],
)
def test_rows_with_an_object_or_array_go_to_csv_as_its_json(value, cell):
    """A batch otherwise of the types ``json_lines`` takes (no type test per cell): the cell is the value's JSON,
    quoted, not its JSON with the quotes taken out."""
    rows = [(str(n), True, None, n) for n in range(ROWS_PER_BATCH)]
    rows[7] = ("x", value, None, 1)
    assert same_csv_in_batches(rows).splitlines()[7] == f"x,{cell},,1"


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


@pytest.mark.parametrize("resource", IRREGULAR_CONDITIONS, ids=lambda resource: resource["id"])
def test_compiled_selects_give_the_rows_the_general_way_gives(resource):
    view = compile_view(GENERATED_VIEW)
    general = with_compiled(view, None)

    assert view.compiled is not None
    assert list(view.rows(resource)) == list(general.rows(resource))


@pytest.mark.parametrize("resource", IRREGULAR_CONDITIONS, ids=lambda resource: resource["id"])
def test_a_view_outside_the_generator_gives_the_rows_of_one_inside_it_joined(resource):
    """The irregular view is the generated one and a last ``unionAll`` (of ``id`` and ``'lit'``), outside the
    generator's subset: the general way's rows are the generated function's, each joined with both."""
    inside, outside = compile_view(GENERATED_VIEW), compile_view(IRREGULAR_VIEW)
    expected = [row + extra for row in inside.rows(resource) for extra in ((resource["id"],), ("lit",))]

    assert inside.compiled is not None and outside.compiled is None
    assert list(outside.rows(resource)) == expected


OFFICIAL_PERIODS = {
    "resource": "Patient",
    "select": [
        {"column": [{"name": "id", "path": "id"}]},
        {
            "forEach": "name.where(use = 'official')",
            "column": [{"name": "family", "path": "family"}],
            "select": [{"forEach": "period", "column": [{"name": "start", "path": "start"}]}],
        },
    ],
}
NAMED_PATIENTS = [
    {
        "resourceType": "Patient",
        "id": "a",
        "name": [
            {"use": "official", "family": "f", "period": {"start": "2020"}},
            {"use": "usual", "family": "u", "period": {"start": "2021"}},
            {"use": "official", "family": "g", "period": {"start": "2022"}},
        ],
    },
    {"resourceType": "Patient", "id": "b", "name": [{"use": "official", "family": "h"}]},
    {"resourceType": "Patient", "id": "c", "name": [{"use": "official", "period": [{"start": "x"}, None]}]},
    {"resourceType": "Patient", "id": "d", "name": [None, "text", {"use": ["official"]}]},
]


def test_an_iteration_over_a_member_of_a_where_gives_the_rows_the_general_way_gives():
    """A ``forEach`` over ``name.where(use = 'official')``, then over each one's ``period``: the generator's where step
    inside a chain, on regular and irregular data."""
    view = compile_view(OFFICIAL_PERIODS)
    general = with_compiled(view, None)

    assert view.compiled is not None and view.compiled(NAMED_PATIENTS[0]) is not None
    assert list(view.rows(NAMED_PATIENTS[0])) == [("a", "f", "2020"), ("a", "g", "2022")]
    for resource in NAMED_PATIENTS:
        assert list(view.rows(resource)) == list(general.rows(resource))


def test_a_column_of_several_values_is_the_same_error_compiled():
    view = compile_view({"resource": "Condition", "select": [{"column": [{"name": "note", "path": "note.text"}]}]})
    generated = generated_rows(view.root, "Condition", CACHED_ROWS)
    assert generated is not None
    assert generated(IRREGULAR_CONDITIONS[2]) is None  # a list where one value was expected: the general way
    errors = []
    for engine in (view, with_compiled(view, None)):
        with pytest.raises(ViewEvaluationError) as error:
            list(engine.rows(IRREGULAR_CONDITIONS[2]))
        errors.append(str(error.value))

    assert errors[0] == errors[1]
    assert "Collection value for column 'note'" in errors[0]
    assert list(view.rows(IRREGULAR_CONDITIONS[1])) == [("one",)]


def deep_view_and_patient(members: int) -> tuple[dict, dict]:
    """A view reading a chain of ``members`` members, as a column and as a forEach, and a Patient holding it."""
    chain, value = ".".join(["a"] * members), "deep"
    for _ in range(members):
        value = {"a": value}
    view = {
        "resource": "Patient",
        "select": [
            {"column": [{"name": "id", "path": "id"}, {"name": "deep", "path": chain}]},
            {"forEach": chain.rsplit(".", 1)[0], "column": [{"name": "leaf", "path": "a"}]},
        ],
    }
    return view, {"resourceType": "Patient", "id": "p1", **value}


@pytest.mark.parametrize("members", [99, 1000])
@pytest.mark.parametrize("way", WAYS)
def test_a_chain_of_any_length_runs_every_way(members, way):
    """The generated function was 99 levels deep at 99 members: Python refused it (IndentationError)."""
    definition, patient = deep_view_and_patient(members)
    view = in_one_way(compile_view(definition), way)
    assert list(view.rows(patient)) == [("p1", "deep", "deep")]


@pytest.mark.parametrize("way", WAYS)
def test_this_as_a_column_or_a_for_each_runs_every_way(way):
    """``$this`` is a member path of no step: the generator wrote a column never assigned (NameError) and took the
    last step of a forEach that has none (IndexError)."""
    definition = {
        "resource": "Patient",
        "select": [
            {"column": [{"name": "id", "path": "id"}]},
            {"forEach": "$this", "column": [{"name": "again", "path": "id"}]},
            {"forEach": "name", "column": [{"name": "name", "path": "$this"}]},
        ],
    }
    view = in_one_way(compile_view(definition), way)
    patient = {"resourceType": "Patient", "id": "p1", "name": [{"family": "f"}]}
    assert list(view.rows(patient)) == [("p1", "p1", {"family": "f"})]


def test_a_view_python_cannot_compile_is_left_to_the_general_way(monkeypatch):
    """Whatever the generator writes that Python refuses (here 30 nested loops; it allows 20) runs the general way."""
    monkeypatch.setattr(compiled_code, "MAX_GENERATED_DEPTH", 64)
    select: dict = {"column": [{"name": "id", "path": "id"}]}
    for _ in range(30):
        select = {"forEach": "a", "select": [select]}
    view = compile_view({"resource": "Patient", "select": [select]})
    assert generated_rows(view.root, "Patient", CACHED_ROWS) is None
    nested: dict = {"id": "inner"}
    for _ in range(30):
        nested = {"a": nested}
    assert list(view.rows({"resourceType": "Patient", **nested})) == [("inner",)]


def test_a_product_of_rows_is_every_combination_in_order_and_none_beyond_the_limit():
    """Two forEach over two codings each give four rows, the second's varying fastest; over a limit of three the
    generated function gives None (the general way then takes the resource), as it does for a row per coding of four;
    a forEach over nothing gives none."""
    view = compile_view(
        {
            "resource": "Condition",
            "select": [
                {"column": [{"name": "id", "path": "id"}]},
                {"forEach": "code.coding", "column": [{"name": "code", "path": "code"}]},
                {"forEach": "code.coding", "column": [{"name": "system", "path": "system"}]},
            ],
        }
    )
    codings = [{"system": "s", "code": "1"}, {"system": "t", "code": "2"}]
    condition = {"resourceType": "Condition", "id": "c", "code": {"coding": codings}}
    generated = generated_rows(view.root, "Condition", 4)

    assert generated is not None
    assert generated(condition) == [("c", "1", "s"), ("c", "1", "t"), ("c", "2", "s"), ("c", "2", "t")]
    assert generated({**condition, "code": {"coding": codings[:1]}}) == [("c", "1", "s")]
    assert generated({**condition, "code": {}}) == []
    assert generated_rows(view.root, "Condition", 3)(condition) is None
    one_each = compile_view({**SIBLING_WHERES_VIEW, "select": SIBLING_WHERES_VIEW["select"][:2]})
    many = {**condition, "code": {"coding": [{"system": "s", "code": str(n)} for n in range(4)]}}
    assert len(generated_rows(one_each.root, "Condition", 4)(many)) == 4
    assert generated_rows(one_each.root, "Condition", 3)(many) is None  # a row a coding: four


THREE_LISTS_VIEW = {
    "resource": "Condition",
    "select": [
        {"column": [{"name": "id", "path": "id"}]},
        {"forEach": "code.coding", "column": [{"name": "code", "path": "code"}]},
        {"column": [{"name": "date", "path": "recordedDate"}]},
        {"forEachOrNull": "note", "column": [{"name": "note", "path": "text"}]},
        {"forEach": "bodySite", "column": [{"name": "site", "path": "text"}]},
    ],
}


@pytest.mark.parametrize(
    "counts",
    [(1, 1, 1), (3, 1, 1), (1, 2, 1), (1, 1, 3), (2, 2, 1), (0, 2, 2), (2, 0, 1), (3, 2, 0), (0, 1, 0), (2, 2, 2)],
)
def test_rows_of_several_lists_are_their_product_in_order_whichever_gives_several(counts):
    """The product of a select's lists in the generated function: one row where each gives one, a loop where one
    gives several (whichever it is), none where a list gives none, else every combination, the last varying fastest."""
    codes, notes, sites = counts
    condition = {
        "resourceType": "Condition",
        "id": "c",
        "recordedDate": "2024",
        "code": {"coding": [{"code": f"k{n}"} for n in range(codes)]},
        "note": [{"text": f"n{n}"} for n in range(notes)],
        "bodySite": [{"text": f"s{n}"} for n in range(sites)],
    }
    view = compile_view(THREE_LISTS_VIEW)
    expected = list(with_compiled(view, None).rows(condition))
    assert len(expected) == codes * max(notes, 1) * sites
    assert generated_rows(view.root, "Condition", CACHED_ROWS)(condition) == expected


@pytest.mark.parametrize("cells", [False, True], ids=["values", "cells"])
@pytest.mark.parametrize("resource", IRREGULAR_CONDITIONS + PAIRED_CONDITIONS, ids=lambda resource: resource["id"])
def test_sibling_wheres_and_a_walk_of_two_members_give_the_general_way_s_rows(resource, cells):
    """The generator's shortcuts: two members from the resource read at once where the first is one object (else
    step by step: a list, a single value, another type), sibling wheres kept in one pass, a forEachOrNull's null row
    before its loop, a select of nested selects alone. Rows as the general way gives them, or None (irregular)."""
    view = compile_view(SIBLING_WHERES_VIEW)
    generated = generated_rows(view.root, "Condition", CACHED_ROWS, PARSED if cells else KEPT, cells)
    assert generated is not None
    try:
        expected = [csv_cells(row) if cells else row for row in with_compiled(view, None).rows(resource)]
    except ViewEvaluationError:
        expected = None
    rows = generated(resource)
    if resource["id"] in {"c1", "c2", "c3", "c4", "c5", "o1", "p3", "p5"}:  # not of the planned shape
        assert rows is None
    else:
        assert rows is not None and [list(row) if cells else row for row in rows] == expected
