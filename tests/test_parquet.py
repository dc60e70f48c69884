"""``tasks.sof.parquet``: a group CSV as Parquet, typed from its ViewDefinition, readable by DuckDB and polars."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import duckdb
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.streams.files import JobWriteError
from tasks.sof.errors import ViewError
from tasks.sof.output import CsvWriter, csv_data_rows
from tasks.sof.parquet import BLOCK_BYTES, parquet_rows, parquet_schema, write_parquet
from tests.peak_rss import run_measured
from tests.support.parquet import COLUMNS, ROWS, TYPED_VIEW, write_csv


def test_columns_are_typed_from_the_viewdefinition_and_empty_cells_are_null(tmp_path):
    csv_path = write_csv(tmp_path / "obs.csv", COLUMNS, ROWS)

    rows = write_parquet(csv_path, TYPED_VIEW, tmp_path / "obs.parquet")

    table = pq.read_table(tmp_path / "obs.parquet")
    assert rows == 3 == table.num_rows
    assert table.schema == pa.schema(
        [
            ("id", pa.string()),
            ("final", pa.bool_()),
            ("count", pa.int64()),
            ("value", pa.string()),
            ("effective", pa.string()),
            ("codes", pa.string()),
            ("note", pa.string()),
        ]
    )
    assert table.to_pylist()[0] == {
        "id": "o1",
        "final": True,
        "count": 7,
        "value": "1.50",
        "effective": "2020",
        "codes": '["a","b"]',
        "note": 'line one\nline "two", three',
    }
    assert table.column("count").to_pylist() == [7, None, -42]
    assert table.column("final").to_pylist() == [True, False, None]
    assert table.column("value").to_pylist()[1] == "123456789012345678901234567890123456789.5"
    assert table.column("note").to_pylist()[1:] == [None, "a bare\rCR"]


def test_duckdb_and_polars_read_the_same_rows(tmp_path):
    write_parquet(write_csv(tmp_path / "obs.csv", COLUMNS, ROWS), TYPED_VIEW, tmp_path / "obs.parquet")

    from_duckdb = duckdb.sql(f"SELECT id, final, count FROM '{tmp_path / 'obs.parquet'}' ORDER BY id").fetchall()
    from_polars = polars.read_parquet(tmp_path / "obs.parquet").select("id", "final", "count").rows()

    assert from_duckdb == from_polars == [("o1", True, 7), ("o2", False, None), ("o3", None, -42)]


def test_a_csv_larger_than_a_row_group_is_written_in_several(tmp_path):
    rows = [[f"o{i}", "true", str(i), "0.1", "2020-01", "[]", "x" * 50] for i in range(1000)]
    csv_path = write_csv(tmp_path / "obs.csv", COLUMNS, rows)

    count = write_parquet(csv_path, TYPED_VIEW, tmp_path / "obs.parquet", row_group_bytes=4096)

    parquet = pq.ParquetFile(tmp_path / "obs.parquet")
    assert count == 1000 == parquet.metadata.num_rows
    assert parquet.metadata.num_row_groups > 1
    assert parquet.read().column("count").to_pylist() == list(range(1000))


def test_a_csv_with_only_its_header_gives_an_empty_typed_parquet(tmp_path):
    rows = write_parquet(write_csv(tmp_path / "obs.csv", COLUMNS, []), TYPED_VIEW, tmp_path / "obs.parquet")

    assert rows == 0
    assert pq.read_table(tmp_path / "obs.parquet").schema == parquet_schema(TYPED_VIEW)


def test_union_branches_keep_a_type_only_where_they_agree_and_nested_selects_follow_their_parent():
    view = {
        "resource": "Patient",
        "select": [
            {
                "column": [{"name": "id", "path": "id"}],
                "select": [{"column": [{"name": "active", "path": "active", "type": "boolean"}]}],
                "unionAll": [
                    {"column": [{"name": "n", "path": "a", "type": "integer"}, {"name": "v", "path": "b"}]},
                    {"column": [{"name": "n", "path": "c", "type": "integer"}, {"name": "v", "path": "d"}]},
                    {
                        "column": [
                            {"name": "n", "path": "e", "type": "integer"},
                            {"name": "v", "path": "f", "type": "boolean"},
                        ]
                    },
                ],
            },
            {"column": [{"name": "last", "path": "x", "type": "positiveInt"}]},
        ],
    }

    assert parquet_schema(view) == pa.schema(
        [("id", pa.string()), ("active", pa.bool_()), ("n", pa.int64()), ("v", pa.string()), ("last", pa.int64())]
    )


def test_a_cell_that_does_not_fit_its_declared_type_names_the_column_and_leaves_no_file(tmp_path):
    rows = [["o1", "true", "7", "", "", "", ""], ["o2", "true", "MRN-4711-Mueller", "", "", "", ""]]

    with pytest.raises(ViewError) as raised:
        write_parquet(write_csv(tmp_path / "obs.csv", COLUMNS, rows), TYPED_VIEW, tmp_path / "obs.parquet")

    assert "obs.csv" in str(raised.value) and "column 'count'" in str(raised.value)
    assert "a value that is no int64" in str(raised.value)
    assert "correct the type or remove it" in str(raised.value)
    assert "Mueller" not in str(raised.value), "a cell's value is patient data: never in an error"
    assert list(tmp_path.iterdir()) == [tmp_path / "obs.csv"]


def test_a_row_longer_than_a_read_block_is_written_whole(tmp_path):
    long_note = random.Random(7).randbytes(3 * BLOCK_BYTES // 2).hex()  # 3 blocks of text in one cell
    rows = [*ROWS, ["o4", "true", "1", "", "", "", long_note], ["o5", "false", "2", "", "", "", "after"]]

    written = write_parquet(write_csv(tmp_path / "obs.csv", COLUMNS, rows), TYPED_VIEW, tmp_path / "obs.parquet")

    table = pq.read_table(tmp_path / "obs.parquet")
    assert written == table.num_rows == 5
    assert table.column("note").to_pylist()[3:] == [long_note, "after"]


def test_a_csv_of_other_columns_is_refused(tmp_path):
    csv_path = write_csv(tmp_path / "obs.csv", ["id", "other"], [["o1", "x"]])

    with pytest.raises(ViewError, match=r"has the columns \['id', 'other'\], but its ViewDefinition has"):
        write_parquet(csv_path, TYPED_VIEW, tmp_path / "obs.parquet")
    assert not (tmp_path / "obs.parquet").exists()


def test_the_rows_of_a_corrected_table_are_counted_as_the_flattening_counts_them(tmp_path):
    """What the wait step says of a corrected CSV or Parquet: quoted line breaks belong to their cell, a last row
    without its line end counts, any chunk boundary; a file that is no Parquet is named."""
    rows = [["p1", "a\nb"], ["p2", 'say "x"\r\n,y'], ["p3", ""]]
    with (tmp_path / "t.csv").open("w", newline="", encoding="utf-8") as stream:
        CsvWriter(stream).writerows([("id", "note"), *rows])
    text = (tmp_path / "t.csv").read_bytes()
    (tmp_path / "cut.csv").write_bytes(text.removesuffix(b"\n"))
    (tmp_path / "header.csv").write_bytes(b"id,note\n")
    for chunk in (1, 2, 3, 7, 1 << 20):
        assert csv_data_rows(tmp_path / "t.csv", chunk) == 3
        assert csv_data_rows(tmp_path / "cut.csv", chunk) == 3
        assert csv_data_rows(tmp_path / "header.csv", chunk) == 0
    view = {
        "resource": "Patient",
        "select": [{"column": [{"name": "id", "path": "id"}, {"name": "note", "path": "n"}]}],
    }
    assert write_parquet(tmp_path / "t.csv", view, tmp_path / "t.parquet") == parquet_rows(tmp_path / "t.parquet") == 3
    with pytest.raises(ViewError, match=r"^t\.csv cannot be read as a Parquet file"):
        parquet_rows(tmp_path / "t.csv")


def test_a_parquet_that_cannot_be_written_says_where_and_leaves_nothing(tmp_path):
    csv_path = write_csv(tmp_path / "obs.csv", COLUMNS, ROWS)

    with pytest.raises(JobWriteError, match="cannot write .*missing/obs.parquet"):
        write_parquet(csv_path, TYPED_VIEW, tmp_path / "missing" / "obs.parquet")


MEMORY_VIEW = {
    "resourceType": "ViewDefinition",
    "resource": "Patient",
    "select": [
        {
            "column": [
                {"name": "id", "path": "id", "type": "id"},
                {"name": "count", "path": "count", "type": "integer"},
                {"name": "active", "path": "active", "type": "boolean"},
                {"name": "name", "path": "name", "type": "string"},
            ]
        }
    ],
}
CONVERT_SCRIPT = """
import json, sys
from pathlib import Path
from tasks.sof.parquet import write_parquet
if sys.argv[1] == "convert":
    write_parquet(Path(sys.argv[2]), json.loads(sys.argv[3]), Path(sys.argv[4]))
"""


@pytest.mark.slow
def test_a_large_csv_is_converted_in_bounded_memory(tmp_path):
    """120 MB of varied rows: the process grows by far less than the file (it grew by 196 MB: Arrow's allocator kept
    what it freed, and 32 MB row groups)."""
    rng = random.Random(5)
    source = tmp_path / "big.csv"
    with source.open("w") as out:
        out.write("id,count,active,name\n")
        while out.tell() < 120_000_000:
            out.write(
                "".join(
                    f"p{rng.getrandbits(64):x},{rng.randint(0, 10**6)},{rng.choice(['true', 'false', ''])},"
                    f"Name{rng.getrandbits(40)} Sur{rng.getrandbits(30)}\n"
                    for _ in range(20_000)
                )
            )
    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-c", CONVERT_SCRIPT]
    target = tmp_path / "big.parquet"
    loaded = run_measured([*command, "load"], timeout=120, cwd=repo)
    converted = run_measured(
        [*command, "convert", str(source), json.dumps(MEMORY_VIEW), str(target)], timeout=300, cwd=repo
    )
    assert loaded.returncode == converted.returncode == 0
    assert pq.ParquetFile(target).metadata.num_rows > 1_000_000
    assert converted.peak_mb - loaded.peak_mb < 140, (loaded.peak_mb, converted.peak_mb)
