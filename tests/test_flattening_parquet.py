"""A job with ``services.flattening.formats: [csv, parquet]``: a Parquet file beside each group's CSV, with the same
rows, listed with the step's files and readable by DuckDB and polars."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars
import pytest

from flows.run import EXIT_OK, main
from tasks.sof.output import cell
from tests.conftest import REPO_ROOT, TESTDATA
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


CONVERT = """
import json, sys
from pathlib import Path
from tasks.flattening import FlatteningError, add_parquet_files, plan_views
from tasks.job.contract import DataFile
from tasks.job.flattening_outcome import FlattenOutcome
from tasks.sof.view import compile_view

crtdl, lookup, out, bad = map(Path, sys.argv[1:5])
views, skipped = plan_views(crtdl, lookup)
files = []
for view in views:
    columns = compile_view(view.view).columns
    cells = ["maybe" if bad.name == view.group.csv_name and name == "active" else "" for name in columns]
    (out / view.group.csv_name).write_text(",".join(columns) + "\\n" + ",".join(cells) + "\\n")
    files.append(DataFile(name=view.group.csv_name, size=1, resources=1))
outcome = FlattenOutcome([], skipped, "type", "embedded", files=list(files))
try:
    add_parquet_files(out, views, outcome)
    error = None
except FlatteningError as exc:
    error = str(exc)
rows = {f.name: f.resources for f in outcome.files if f.name.endswith(".parquet")}
print(json.dumps({"pyarrow": "pyarrow" in sys.modules, "rows": rows, "error": error}))
"""


def convert_in_a_fresh_process(out: Path, bad: str = "") -> dict:
    arguments = [EXAMPLE / "example-crtdl.json", TESTDATA / "flattening" / "flatten-lookup.json", out, out / bad]
    command = [sys.executable, "-c", CONVERT, *map(str, arguments)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_parquet_is_written_in_worker_processes_and_the_flow_process_never_loads_pyarrow(tmp_path):
    found = convert_in_a_fresh_process(tmp_path)

    assert found["error"] is None and found["pyarrow"] is False
    assert found["rows"] and set(found["rows"].values()) == {1}
    assert sorted(tmp_path.glob("*.parquet")) == [tmp_path / name for name in sorted(found["rows"])]
    assert not list(tmp_path.glob(".*")), "no temporary file is left"


def test_a_cell_its_parquet_type_cannot_hold_fails_the_step_naming_the_file_and_column(tmp_path):
    patient = "MII PR Person Patient (Pseudonymisiert).csv"
    found = convert_in_a_fresh_process(tmp_path, patient)

    assert found["pyarrow"] is False
    assert found["error"].startswith(f"{patient} cannot be written as Parquet") and "active" in found["error"]
    assert "maybe" not in found["error"]  # a cell is patient data
    assert not (tmp_path / patient.replace(".csv", ".parquet")).exists()
