"""A job with ``services.flattening.formats: [csv, parquet]``: a Parquet file beside each group's CSV, with the same
rows, listed with the step's files and readable by DuckDB and polars."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import duckdb
import polars
import pytest

from flows.run import EXIT_OK, main
from tasks.sof.output import cell
from tests.conftest import TESTDATA
from tests.support.jobs import step_results

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

EXAMPLE = TESTDATA / "flattening" / "example"


def csv_rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as lines:
        return list(csv.reader(lines))[1:]


def as_csv_cells(rows: list[tuple]) -> list[list[str]]:
    """Typed Parquet rows written as the CSV writes cells (null empty, booleans true/false)."""
    return [[cell(value) for value in row] for row in rows]


def test_a_job_writes_a_parquet_beside_each_csv_with_the_same_rows(tmp_path, write_config):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(EXAMPLE / "input" / "fhir-data.ndjson", source)
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "flattening"]},
            "services": {
                "local_import": {"dir": source},
                "flattening": {
                    "lookup_path": TESTDATA / "flattening" / "flatten-lookup.json",
                    "formats": ["csv", "parquet"],
                },
            },
        }
    )

    assert main(["start", str(config), str(EXAMPLE / "example-crtdl.json"), "--no-progress"]) == EXIT_OK

    (job_dir,) = (tmp_path / "jobs").iterdir()
    out = job_dir / "flattening"
    csvs = sorted(out.glob("*.csv"))
    assert csvs and sorted(out.glob("*.parquet")) == [path.with_suffix(".parquet") for path in csvs]
    for csv_path in csvs:
        parquet_path = csv_path.with_suffix(".parquet")
        from_polars = polars.read_parquet(parquet_path).rows()
        from_duckdb = duckdb.execute("SELECT * FROM read_parquet(?)", [str(parquet_path)]).fetchall()
        assert from_polars == from_duckdb and as_csv_cells(from_polars) == csv_rows(csv_path)
    assert (
        polars.read_parquet(out / "MII PR Person Patient (Pseudonymisiert).parquet").schema["active"] == polars.Boolean
    )
    flattening = step_results(job_dir)[1]
    assert {f["name"] for f in flattening["files"]} == {p.name for p in csvs} | {
        p.with_suffix(".parquet").name for p in csvs
    }
