"""``view run``'s CSV made block by block (``tasks.sof.struct_rows``, ``resources.csv_parts``): the same bytes,
the same errors at the same line numbers as the line-by-line read, whatever a block holds, for flat views and nested
ones."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.sof.errors import ResourceLineError, ViewError
from tasks.sof.struct_rows import flat_keys
from tasks.sof.output import CsvWriter, json_bytes
from flows.view_cli import write_csv
from tasks.sof.resources import read_rows
from tasks.sof.view import compile_view
from tasks.streams.ndjson import CHUNK_SIZE, iter_lines
from tests.conftest import TESTDATA
from tests.support.sof import (
    GENERATED_VIEW,
    IRREGULAR_CONDITIONS,
    PAIRED_CONDITIONS,
    SIBLING_WHERES_VIEW,
    with_compiled,
)

PATIENTS = [
    entry["resource"]
    for entry in json.loads((TESTDATA / "extraction" / "BlazeBundle.json").read_text())["entry"]
    if entry["resource"]["resourceType"] == "Patient"
]
COLUMNS = [("id", "id"), ("active", "active"), ("deceased", "deceased.ofType(boolean)"), ("gender", "gender")]
FLAT = {"resource": "Patient", "select": [{"column": [{"name": name, "path": path} for name, path in COLUMNS[:2]]}]}
FLAT["select"].append({"select": [{"column": [{"name": name, "path": path} for name, path in COLUMNS[2:]]}]})
FLAT["select"][1]["select"].append({"column": [{"name": "birth", "path": "birthDate"}]})


def column_view(path: str) -> dict:
    return {"resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}, {"name": "x", "path": path}]}]}


def varied_patients(count: int, seed: int = 7) -> list[bytes]:
    """The test data's Patients, each line with another id and varied fields, compact as orjson writes them."""
    rng, lines = random.Random(seed), []
    for index in range(count):
        patient = dict(PATIENTS[index % len(PATIENTS)], id=f"p-{index}-{rng.randrange(10**9)}")
        patient["active"] = rng.choice([True, False, None])
        patient["gender"] = rng.choice(["male", "female", "other", "unknown"])
        if rng.random() < 0.2:
            patient["deceasedBoolean"] = rng.random() < 0.5
        lines.append(orjson.dumps(patient))
    return lines


def csv_of(rows) -> str:
    out = io.StringIO()
    CsvWriter(out).writerows(rows)
    return out.getvalue()


def both_ways(path: Path, definition: dict = FLAT) -> tuple[str, str]:
    """The CSV (or the error) of the file as ``view run`` writes it, block by block, and of its lines
    read one by one."""
    found = []
    for blocks in (True, False):
        view, out = compile_view(definition), io.StringIO()
        try:
            if blocks:
                write_csv(view, path, out)
            else:
                (writer := CsvWriter(out)).writerow(view.columns)
                writer.writerows(read_rows(view, path, iter_lines(path, 1 << 30), True))
            found.append(out.getvalue())
        except (ResourceLineError, ViewError) as exc:
            found.append(f"error: {exc}")
    return found[0], found[1]


def test_a_flat_view_reads_its_columns_keys_in_column_order():
    assert flat_keys(compile_view(FLAT)) == ["id", "active", "deceasedBoolean", "gender", "birthDate"]


@pytest.mark.parametrize(
    "definition",
    [
        column_view("name.family"),
        {
            "resource": "Patient",
            "select": [{"forEach": "name.where(use = 'a')", "column": [{"name": "f", "path": "family"}]}],
        },
        {"resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]},
        {
            "resource": "Patient",
            "select": [{"forEach": "name", "column": [{"name": "f", "path": "family"}, {"name": "u", "path": "use"}]}],
        },
    ],
    ids=["member chain", "where", "one column", "forEach"],
)
def test_views_of_more_than_members_of_the_resource_are_read_by_blocks_but_not_flat(definition: dict):
    view = compile_view(definition)
    assert flat_keys(view) is None
    assert view.block_csv is not None


@pytest.mark.parametrize(
    "definition",
    [
        column_view("resourceType"),
        {**FLAT, "where": [{"path": "active"}]},
        {
            "resource": "Patient",
            "select": [{"column": [{"name": "i", "path": "%rowIndex"}, {"name": "id", "path": "id"}]}],
        },
        {"resource": "Patient", "select": [{"unionAll": [FLAT["select"][0], FLAT["select"][0]]}]},
        {
            **column_view("name.family"),
            "select": [{"column": [{"name": "n", "path": "name"}]}, *column_view("name.family")["select"]],
        },
        {
            "resource": "Patient",
            "select": [{"forEach": "name.where(use = '')", "column": [{"name": "f", "path": "family"}]}],
        },
        {
            "resource": "Patient",
            "select": [{"forEach": "contact.where(resourceType = 'x')", "column": [{"name": "f", "path": "gender"}]}],
        },
    ],
    ids=[
        "resourceType",
        "view where",
        "rowIndex",
        "unionAll",
        "a key as a value and an element",
        "where ''",
        "where resourceType",
    ],
)
def test_views_the_block_read_cannot_hold_to_the_lines_way_are_not_read_by_blocks(definition: dict):
    assert compile_view(definition).block_csv is None


def test_a_collection_column_is_not_read_by_blocks():
    definition = column_view("name")
    definition["select"][0]["column"][1]["collection"] = True
    assert compile_view(definition).block_csv is None


def test_a_block_of_the_view_s_type_gives_a_row_per_line():
    lines = varied_patients(50)
    made = compile_view(FLAT).block_csv(b"\n".join(lines) + b"\n")
    assert made[1] == 50
    assert made[0].decode() == csv_of(read_rows(compile_view(FLAT), "test", enumerate(lines, 1), True))


GOOD = b'{"resourceType":"Patient","id":"a","active":true}\n'


@pytest.mark.parametrize(
    "cells",
    [
        {"id": None, "gender": None, "active": None},
        {"id": "null", "gender": "Patient", "birthDate": "null,"},
        {"id": '],["Patient",', "gender": "x"},
        {"id": "],[", "gender": "[x]"},
        {"id": "a,b", "gender": 'say "x"'},
        {"id": "a\rb", "gender": "\u00e9\u2028"},
        {"id": "\x00", "active": 12345678901234567890123},
        {"id": "", "gender": "", "birthDate": "", "active": 0},
    ],
    ids=["nulls", "null text", "a row's opening", "brackets", "quoting", "CR, not ASCII", "NUL, big int", "empty"],
)
def test_a_flat_block_s_cells_are_the_lines_way_s(cells: dict):
    """Cells that look like the JSON the flat view's lines are made from, or need quoting, among plain lines."""
    lines = varied_patients(30)
    lines[12] = json_bytes({**orjson.loads(lines[12]), **cells})  # json_bytes: ints beyond 64 bits too
    made = compile_view(FLAT).block_csv(b"\n".join(lines) + b"\n")
    assert made is not None
    assert made[0].decode() == csv_of(read_rows(compile_view(FLAT), "test", enumerate(lines, 1), True))


@pytest.mark.parametrize(
    "block",
    [
        GOOD + b"\n" + GOOD,
        GOOD + b"   \n" + GOOD,
        b" " + GOOD,
        GOOD + b"\t" + GOOD,
        GOOD.rstrip() + b" " + GOOD,
        GOOD.rstrip() + GOOD,
        GOOD + b'{"resourceType":"Condition","id":"c"}\n',
        GOOD + b'{"resourceType":"Bundle","entry":[]}\n',
        GOOD + b'{"id":"no type"}\n',
        GOOD + b'{"resourceType":"","id":"e"}\n',
        GOOD + b'{"resourceType":"Patient","id":"a","active":1.5}\n',
        GOOD + b'{"resourceType":"Patient","id":{"a":1}}\n',
        GOOD + b'{"resourceType":"Patient","id":["a"]}\n',
        GOOD + b'{"resourceType":"Patient","id":"a","name":"\xff"}\n',
        GOOD + b'{"resourceType":"Patient","id":"a","name":"\xed\xa0\x80"}\n',
        GOOD + b'{"resourceType":"Patient","id":"a","x":' + b"[" * 2000 + b"]" * 2000 + b"}\n",
        GOOD + b'{"resourceType":"Patient","id":"a","x":NaN}\n',
        GOOD + b'{"resourceType":"Patient","id":"a",}\n',
        GOOD + b'{"resourceType":"Patient","resourceType":"Bundle"}\n',
        GOOD + b"[1,2]\n",
        b"\xef\xbb\xbf" + GOOD,
        GOOD + b'{"resourceType":"Patient",\n"id":"a"}\n' + GOOD,
    ],
    ids=[
        "blank line",
        "spaces line",
        "opens with a space",
        "opens with a tab",
        "two objects",
        "two objects touching",
        "another type",
        "Bundle",
        "no resourceType",
        "the empty type",
        "decimal read",
        "object read",
        "array read",
        "not UTF-8 skipped",
        "surrogate skipped",
        "deep nesting skipped",
        "NaN skipped",
        "trailing comma",
        "type given twice",
        "not an object",
        "byte order mark",
        "an object over two lines",
    ],
)
def test_a_block_is_left_to_the_line_by_line_read(block: bytes):
    assert compile_view(FLAT).block_csv(block) is None


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
@pytest.mark.parametrize(
    "odd",
    [
        None,
        b'{"resourceType":"Bundle","type":"collection","entry":[{"resource":{"resourceType":"Patient","id":"in-b"}}]}',
        b'{"resourceType":"Patient","id":"dec","active":1.50}',
        b"",
        b'{"resourceType":"Patient","id":"q","gender":"a,\\"b\\""}',
        b'{"resourceType":"Condition","id":"c"}',
        b'{"resourceType":"Patient","id":"bad",',
        b'{"resourceType":"Patient","id":"bad",\n"gender":"male"}',
    ],
    ids=["all flat", "a Bundle", "a decimal", "blank lines", "quoting", "another type", "bad JSON", "split"],
)
def test_a_file_gives_the_line_by_line_csv_or_error(tmp_path: Path, odd: bytes | None, compressed: bool):
    """Three chunks and more of Patients with an odd line in the second chunk and one near the end: blocks before
    and after are taken, the odd ones read line by line, the line numbers of an error the same."""
    lines = varied_patients(4 * CHUNK_SIZE // len(b"".join(varied_patients(100))) * 100)
    if odd is not None:
        lines[len(lines) // 3] = lines[len(lines) - 5] = odd
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "Patient.ndjson"
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compressed else data)
    by_blocks, by_lines = both_ways(path)
    assert by_blocks == by_lines
    if odd is not None and odd.startswith(b'{"resourceType":"Patient","id":"bad",'):
        assert by_blocks.startswith(f"error: {path}: line {len(lines) // 3 + 1} is not valid JSON")
    else:
        assert by_blocks.count("\n") >= len(lines) - 2


def test_a_file_without_a_last_newline_and_a_line_across_chunks(tmp_path: Path):
    long_line = orjson.dumps({**PATIENTS[0], "id": "long", "text": {"div": "x" * (CHUNK_SIZE + 100)}})
    lines = varied_patients(3000)
    lines[1500] = long_line
    path = tmp_path / "Patient.ndjson"
    path.write_bytes(b"\n".join(lines))
    by_blocks, by_lines = both_ways(path)
    assert by_blocks == by_lines
    assert by_blocks.count("\n") == 3001  # the header and a line a Patient


def test_two_columns_of_one_key_both_get_its_value(tmp_path: Path):
    definition = column_view("id")
    path = tmp_path / "Patient.ndjson"
    path.write_bytes(b"\n".join(varied_patients(20)) + b"\n")
    assert flat_keys(compile_view(definition)) == ["id", "id"]
    by_blocks, by_lines = both_ways(path, definition)
    assert by_blocks == by_lines
    assert all(first == second for first, second in (line.split(",") for line in by_blocks.splitlines()[1:]))


CODED_VIEW = {  # the sample CRTDL's Condition view in small: sibling wheres in a forEachOrNull, chains, one where
    "resource": "Condition",
    "select": [
        {"column": [{"name": "id", "path": "id"}, {"name": "patient", "path": "subject.reference"}]},
        {
            "forEachOrNull": "code",
            "select": [
                {
                    "forEachOrNull": f"coding.where(system = '{system}')",
                    "column": [
                        {"name": f"{system}_system", "path": "system"},
                        {"name": f"{system}_code", "path": "code"},
                    ],
                }
                for system in ("s", "t")
            ],
        },
        {"column": [{"name": "recorded", "path": "recordedDate"}]},
        {"forEachOrNull": "clinicalStatus.coding", "column": [{"name": "status", "path": "code"}]},
        {"forEachOrNull": "extension.where(url = 'u')", "column": [{"name": "at", "path": "value.ofType(dateTime)"}]},
    ],
}
STRUCT_CONDITIONS = [  # what a struct meets: values of each kind, nulls, members missing or of another shape
    {"resourceType": "Condition", "id": None, "recordedDate": None, "subject": None},
    {"resourceType": "Condition", "id": 7, "recordedDate": True, "subject": {}},
    {
        "resourceType": "Condition",
        "id": "big",
        "recordedDate": 123456789012345678901234,
        "subject": {"reference": None},
    },
    {
        "resourceType": "Condition",
        "id": "typed",
        "code": {"resourceType": "CodeableConcept", "coding": [{"system": "t", "code": "x", "resourceType": "Coding"}]},
    },
    {"resourceType": "Condition", "id": "null type", "code": {"coding": [{"system": "t", "resourceType": None}]}},
    {
        "resourceType": "Condition",
        "id": "no system",
        "code": {"coding": [{"code": "x"}, {"system": 5, "code": "y"}, {"system": "t"}, {"system": None}]},
    },
    {"resourceType": "Condition", "id": "empty", "code": [], "clinicalStatus": {"coding": []}, "extension": []},
    {
        "resourceType": "Condition",
        "id": "single objects",
        "extension": {"url": "u", "valueDateTime": "2024"},
        "clinicalStatus": [{"coding": {"code": "active"}}, {"coding": [{"code": "x"}, {"code": False}]}],
    },
    {"resourceType": "Condition", "id": "object", "recordedDate": {"a": 1}},
    {"resourceType": "Condition", "id": 'quoted, "here"\n', "subject": {"reference": "\u00e9"}},
    {"resourceType": "Condition", "id": "system in a list", "code": {"coding": [{"system": ["t"]}]}},
    {
        "resourceType": "Condition",
        "id": "several of one system",
        "code": {"coding": [{"system": s, "code": c} for s, c in [("s", "1"), ("t", "a"), ("s", "2"), ("t", "b")]]},
        "clinicalStatus": {"coding": [{"code": "active"}, {"code": "recurrence"}]},
    },
]
CONDITIONS = IRREGULAR_CONDITIONS + PAIRED_CONDITIONS + STRUCT_CONDITIONS
CODED = {
    "resourceType": "Condition",
    "id": "c",
    "subject": {"reference": "Patient/p"},
    "recordedDate": "2024-01-02",
    "code": {"coding": [{"system": "s", "code": "a"}, {"system": "t", "code": "b"}, {"system": "t", "code": "c"}]},
    "clinicalStatus": {"coding": [{"code": "active"}]},
    "extension": [{"url": "u", "valueDateTime": "2024"}],
}
TAKEN = {"c0", "p0", "p1", "p2", "p4", None, 7, "big", "typed", "no system", "empty", "single objects"}
TAKEN |= {'quoted, "here"\n', "several of one system"}
"""Conditions every view below reads by blocks: the rest are left to the lines way (or to its error)."""


@pytest.mark.parametrize(
    "definition", [CODED_VIEW, GENERATED_VIEW, SIBLING_WHERES_VIEW], ids=["coded", "generated", "wheres"]
)
def test_a_line_read_by_blocks_gives_the_general_way_s_csv(definition: dict):
    """A line alone in a block: its rows (nulls, booleans and ints as read) go to CSV as the general way's rows do,
    in the same order, or the block is left to the lines way."""
    view = compile_view(definition)
    taken = set()
    for resource in CONDITIONS:
        made = view.block_csv(json_bytes(resource) + b"\n")
        if made is not None:
            assert made == (csv_of(with_compiled(view, None).rows(resource)).encode(), 1), resource["id"]
            taken.add(resource.get("id"))
    assert taken >= TAKEN


@pytest.mark.parametrize(
    "definition", [CODED_VIEW, GENERATED_VIEW, SIBLING_WHERES_VIEW], ids=["coded", "generated", "wheres"]
)
@pytest.mark.parametrize("odd", CONDITIONS, ids=lambda resource: str(resource.get("id")))
def test_a_file_of_a_nested_view_gives_the_line_by_line_csv_or_error(tmp_path: Path, definition: dict, odd: dict):
    """A file of two chunks of Conditions with an odd one in each: the same CSV, or error, read by blocks."""
    lines = [json_bytes({**CODED, "id": f"c{number}"}) for number in range(2 * CHUNK_SIZE // len(json_bytes(CODED)))]
    lines[len(lines) // 4] = lines[-3] = json_bytes(odd)
    path = tmp_path / "Condition.ndjson"
    path.write_bytes(b"\n".join(lines) + b"\n")
    by_blocks, by_lines = both_ways(path, definition)
    assert by_blocks == by_lines


def test_a_line_of_more_rows_than_a_resource_may_give_is_the_same_error_read_by_blocks(tmp_path: Path):
    path = tmp_path / "Condition.ndjson"
    path.write_bytes(b"".join(json_bytes({**CODED, "id": f"c{number}"}) + b"\n" for number in range(50)))
    errors = []
    for blocks in (True, False):
        view = compile_view(CODED_VIEW, max_rows_per_resource=1)  # each gives two: two codings of system t
        with pytest.raises(ViewError) as error:
            write_csv(view, path, io.StringIO()) if blocks else csv_of(read_rows(view, path, iter_lines(path, 1 << 30)))
        errors.append(str(error.value))
    assert errors[0] == errors[1]
    assert "more than 1 rows" in errors[0]
