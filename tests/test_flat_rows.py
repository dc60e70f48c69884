"""``view run``'s CSV of a flat view read block by block (``tasks.sof.flat_rows``, ``resources.flat_csv_rows``): the
same bytes, the same errors at the same line numbers as the line-by-line read, whatever a block holds."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.sof.errors import ResourceLineError
from tasks.sof.flat_rows import flat_block_rows, flat_keys
from tasks.sof.output import CsvWriter
from tasks.sof.resources import flat_csv_rows, read_rows
from tasks.sof.view import compile_view
from tasks.streams.ndjson import CHUNK_SIZE, iter_lines
from tests.conftest import TESTDATA

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
    """The CSV (or the error) of the file read block by block and read line by line."""
    view, found = compile_view(definition), []
    for blocks in (True, False):
        try:
            rows = (
                flat_csv_rows(view, path, 1 << 30) if blocks else read_rows(view, path, iter_lines(path, 1 << 30), True)
            )
            found.append(csv_of(rows))
        except ResourceLineError as exc:
            found.append(f"error: {exc}")
    return found[0], found[1]


def test_a_flat_view_reads_its_columns_keys_in_column_order():
    assert flat_keys(compile_view(FLAT)) == ["id", "active", "deceasedBoolean", "gender", "birthDate"]


@pytest.mark.parametrize(
    "definition",
    [
        column_view("name.family"),
        column_view("resourceType"),
        column_view("name.where(use = 'official').family"),
        {"resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]},
        {
            "resource": "Patient",
            "select": [{"forEach": "name", "column": [{"name": "f", "path": "family"}, {"name": "u", "path": "use"}]}],
        },
        {**FLAT, "where": [{"path": "active"}]},
        {
            "resource": "Patient",
            "select": [{"column": [{"name": "i", "path": "%rowIndex"}, {"name": "id", "path": "id"}]}],
        },
        {"resource": "Patient", "select": [{"unionAll": [FLAT["select"][0], FLAT["select"][0]]}]},
    ],
    ids=["member chain", "resourceType", "where", "one column", "forEach", "view where", "rowIndex", "unionAll"],
)
def test_other_views_are_not_flat(definition: dict):
    assert flat_block_rows(compile_view(definition)) is None


def test_a_collection_column_is_not_flat():
    definition = column_view("name")
    definition["select"][0]["column"][1]["collection"] = True
    assert flat_block_rows(compile_view(definition)) is None


def test_a_block_of_the_view_s_type_gives_a_row_per_line():
    lines = varied_patients(50)
    rows = flat_block_rows(compile_view(FLAT))(b"\n".join(lines) + b"\n")
    assert len(rows) == 50
    assert rows[0][0] == orjson.loads(lines[0])["id"]


GOOD = b'{"resourceType":"Patient","id":"a","active":true}\n'


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
    ],
)
def test_a_block_is_left_to_the_line_by_line_read(block: bytes):
    assert flat_block_rows(compile_view(FLAT))(block) is None


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
    ],
    ids=["all flat", "a Bundle", "a decimal", "blank lines", "quoting", "another type", "bad JSON"],
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
    if odd == b'{"resourceType":"Patient","id":"bad",':
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
    assert by_blocks.count("\n") == 3000


def test_two_columns_of_one_key_both_get_its_value(tmp_path: Path):
    definition = column_view("id")
    path = tmp_path / "Patient.ndjson"
    path.write_bytes(b"\n".join(varied_patients(20)) + b"\n")
    assert flat_keys(compile_view(definition)) == ["id", "id"]
    by_blocks, by_lines = both_ways(path, definition)
    assert by_blocks == by_lines
    assert all(first == second for first, second in (line.split(",") for line in by_blocks.splitlines()))
