"""The bundled sample data (config/sample-data) flattens with its CRTDL and lookup file, no service running, and
every resource lands in a CSV: nothing unrouted, no Provenance group missing from the CRTDL (no warning)."""

from __future__ import annotations

from tasks.flattening import plan_views
from tasks.sof.lookup import lookup_problems
from tests.conftest import REPO_ROOT
from tests.flattening_runs import flatten_files

SAMPLE = REPO_ROOT / "config" / "sample-data"


def test_the_sample_data_flattens_into_one_csv_per_group(tmp_path):
    assert lookup_problems(SAMPLE / "flatten-lookup.json") == []
    views, skipped = plan_views(SAMPLE / "crtdl.json", SAMPLE / "flatten-lookup.json")
    inputs = sorted(SAMPLE.glob("*.ndjson"))

    outcome = flatten_files(inputs, tmp_path, views, skipped, max_line_bytes=1 << 20)

    assert not skipped and outcome.routing == "provenance"
    rows = {f.name: f.resources for f in outcome.files}
    assert rows == {
        "MII PR Person Patient (Pseudonymisiert).csv": 3,
        "Diagnosis.csv": 4,
        "Procedure one.csv": 3,
        "Procedure two.csv": 2,
        "Encounter.csv": 2,
    }
    assert not outcome.unrouted and not outcome.unknown_groups
    header = (tmp_path / "Diagnosis.csv").read_text().splitlines()[0]
    assert header.startswith("id,patient,code_system_sct,code_code_sct,code_system_icd10gm")
