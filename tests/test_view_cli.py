"""``python -m flows.run view run``: rows printed as NDJSON, CSV or Parquet, invalid views exit 2, no Prefect."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import polars
import zstandard

import pytest

from tests.conftest import REPO_ROOT, TESTDATA, run_cli_here

pytestmark = pytest.mark.slow  # the command in a subprocess

EXAMPLE_INPUT = TESTDATA / "flattening" / "example" / "input" / "fhir-data.ndjson"
PATIENT_VIEW = {
    "resourceType": "ViewDefinition",
    "resource": "Patient",
    "select": [{"column": [{"name": "id", "path": "id"}, {"name": "active", "path": "active"}]}],
}


def test_view_run_prints_one_json_object_per_row_from_bundles_and_zstd(tmp_path):
    (tmp_path / "view.json").write_text(json.dumps(PATIENT_VIEW))
    packed = tmp_path / "data.ndjson.zst"
    packed.write_bytes(zstandard.ZstdCompressor().compress(EXAMPLE_INPUT.read_bytes()))

    result = run_cli_here("view", "run", str(tmp_path / "view.json"), str(packed))

    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"id": "mii-patient-example-1", "active": True},
        {"id": "mii-patient-example-42", "active": True},
    ]


def test_view_run_prints_csv_like_the_flattening_step(tmp_path):
    (tmp_path / "view.json").write_text(json.dumps(PATIENT_VIEW))

    result = run_cli_here("view", "run", str(tmp_path / "view.json"), str(EXAMPLE_INPUT), "--format", "csv")

    assert result.returncode == 0, result.stderr
    assert result.stdout == "id,active\nmii-patient-example-1,true\nmii-patient-example-42,true\n"


def view_run_into(out, *args: str) -> subprocess.CompletedProcess:
    """``view run`` with its standard output on ``out`` (a binary file or a terminal), as a user's ``>`` does."""
    return subprocess.run(
        [sys.executable, "-m", "flows.run", "view", "run", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


def test_view_run_writes_parquet_typed_from_the_viewdefinition(tmp_path):
    view = dict(
        PATIENT_VIEW,
        select=[{"column": [{"name": "id", "path": "id"}, {"name": "active", "path": "active", "type": "boolean"}]}],
    )
    (tmp_path / "view.json").write_text(json.dumps(view))

    with open(tmp_path / "rows.parquet", "wb") as out:
        result = view_run_into(out, str(tmp_path / "view.json"), str(EXAMPLE_INPUT), "--format", "parquet")

    assert result.returncode == 0, result.stderr
    rows = polars.read_parquet(tmp_path / "rows.parquet")
    assert rows.schema == polars.Schema({"id": polars.String, "active": polars.Boolean})
    assert rows.rows() == [("mii-patient-example-1", True), ("mii-patient-example-42", True)]


def test_view_run_refuses_to_print_parquet_on_a_terminal(tmp_path):
    (tmp_path / "view.json").write_text(json.dumps(PATIENT_VIEW))
    terminal, other_end = pty.openpty()
    try:
        result = view_run_into(other_end, str(tmp_path / "view.json"), str(EXAMPLE_INPUT), "--format", "parquet")
    finally:
        os.close(terminal)
        os.close(other_end)

    assert result.returncode == 2
    assert "send it to a file (> rows.parquet)" in result.stderr


def test_an_invalid_viewdefinition_exits_2_with_the_reason(tmp_path):
    view = dict(
        PATIENT_VIEW,
        select=[{"unionAll": [{"column": [{"name": "a", "path": "id"}]}, {"column": [{"name": "b", "path": "id"}]}]}],
    )
    (tmp_path / "view.json").write_text(json.dumps(view))

    result = run_cli_here("view", "run", str(tmp_path / "view.json"), str(EXAMPLE_INPUT))

    assert result.returncode == 2
    assert "unionAll[1] has columns ['b']" in result.stderr
    assert result.stdout == ""


def test_a_row_error_exits_1_naming_the_column(tmp_path):
    view = dict(PATIENT_VIEW, select=[{"column": [{"name": "ids", "path": "identifier.system | id"}]}])
    (tmp_path / "view.json").write_text(json.dumps(view))

    result = run_cli_here("view", "run", str(tmp_path / "view.json"), str(EXAMPLE_INPUT))

    assert result.returncode == 1
    assert "Collection value for column 'ids'" in result.stderr


@pytest.mark.parametrize(
    "command", [[sys.executable, "-m", "flows.run"], [str(Path(sys.executable).with_name("dupflow"))]]
)
def test_view_run_imports_the_engine_alone(tmp_path, command):
    """Neither Prefect nor the pipeline's configuration, clients and job record (0.3 s of a small file's 0.5 s), nor
    fhirpathpy's interpreter for a view of member paths (0.06 s more)."""
    (tmp_path / "view.json").write_text(json.dumps(PATIENT_VIEW))
    result = subprocess.run(
        [*command, "view", "run", str(tmp_path / "view.json"), str(EXAMPLE_INPUT), "--format", "csv"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "id,active\nmii-patient-example-1,true\nmii-patient-example-42,true\n"
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "tasks.sof.view" in imported
    unneeded = (
        "prefect",
        "pydantic",
        "httpx",
        "yaml",
        "config.loader",
        "config.settings",
        "tasks.clients",
        "tasks.job",
        "fhirpathpy",
        "antlr4",
    )
    assert not sorted(name for name in imported if name.startswith(unneeded))


def test_view_run_stops_quietly_when_its_reader_goes_away(tmp_path):
    """``view run … | head``: exit 0 and no word, as for ``list | head`` (it said ``view run failed: [Errno 32]``)."""
    (tmp_path / "view.json").write_text(json.dumps(PATIENT_VIEW))
    patients = b"".join(b'{"resourceType":"Patient","id":"p%d","active":true}\n' % n for n in range(100_000))
    (tmp_path / "patients.ndjson").write_bytes(patients)
    command = [sys.executable, "-m", "flows.run", "view", "run", str(tmp_path / "view.json")]
    with subprocess.Popen(
        [*command, str(tmp_path / "patients.ndjson"), "--format", "csv"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == b"id,active\n"
        process.stdout.close()  # far more rows than a pipe holds are still to come
        errors = process.stderr.read()
        assert process.wait(timeout=120) == 0
    assert errors == b""


def test_msgspec_is_imported_only_for_a_flat_view_s_csv():
    """Every command and every flattening worker would pay its import at start (10 ms)."""
    probe = "import sys, flows.run, tasks.sof.flatten; sys.exit('msgspec' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT)}).returncode == 0
    )


def test_the_dupflow_script_gives_every_other_command_the_whole_command_line():
    """``flows.command`` hands only ``view`` to the engine alone: ``--help`` is the full parser's, every command."""
    dupflow = str(Path(sys.executable).with_name("dupflow"))
    result = subprocess.run([dupflow, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert all(f"\n    {command} " in result.stdout for command in ("start", "continue", "status", "list", "view"))
