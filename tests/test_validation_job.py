"""The ``validation`` step task in a Prefect flow: reports per file, fail_on_error, the artifact, resume after kill -9.

The step runs as the pipeline runs it (``@step_task`` with one ``@file_task`` per input file through
``commit_each``), inside a small flow of this module, so the tests do not depend on the flow's wiring.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tasks.core.errors import StepError
from tests.support.ndjson import iter_resources
from tests.conftest import REPO_ROOT, TESTDATA
from tests.support.jobs import read_report_artifact, wait_for
from tests.support.validation import run_step, step_input, validation_flow
from tests.support.ndjson import write_lines
from tests.support.validation import marks, varied_patients

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def new_job(jobs: Path, inputs: dict[str, Path]) -> Path:
    """A job directory whose import/ folder holds copies of ``inputs`` (name -> source file)."""
    job_dir = jobs / str(uuid.uuid4())
    (job_dir / "import").mkdir(parents=True)
    for name, source in inputs.items():
        shutil.copy(source, job_dir / "import" / name)
    return job_dir


def shared_inputs() -> dict[str, Path]:
    folder = TESTDATA / "validation"
    return {name: folder / name for name in ("Patient.ndjson", "InvalidPatient.ndjson", "Condition.ndjson")}


def report_lines(path: Path) -> list[dict[str, Any]]:
    return [outcome for _, outcome in iter_resources(path, 1 << 30)]


# --- fail_on_error -----------------------------------------------------------------------------------------------


def test_with_fail_on_error_false_every_report_is_written_and_the_counts_are_in_result_and_artifact(
    validator_fake, tmp_path
):
    job_dir = new_job(tmp_path / "jobs", shared_inputs())

    result = run_step(job_dir, validator_fake.base_url, fail_on_error=False)

    assert result.folder == "validation"
    assert sorted(f.name for f in result.files) == [
        "Condition.ndjson.zst",
        "InvalidPatient.ndjson.zst",
        "Patient.ndjson.zst",
    ]
    assert all(f.resources == 1 for f in result.files)  # one OperationOutcome per chunk, one chunk each
    per_file = {
        f["file"]: (f["resources"], f["resources_with_errors"], f["errors"]) for f in result.summary["per_file"]
    }
    assert per_file == {"Condition.ndjson": (1, 1, 2), "InvalidPatient.ndjson": (2, 2, 4), "Patient.ndjson": (2, 0, 0)}
    assert (result.summary["resources_with_errors"], result.summary["errors"]) == (3, 6)
    outcome = report_lines(job_dir / "validation" / "InvalidPatient.ndjson.zst")[0]
    assert marks(outcome) == (1, ["Patient/val-invalid-1", "Patient/val-invalid-2"])
    rows = {row["file"]: row for row in read_report_artifact(f"job-{job_dir.name}-02-validation-report")}
    assert {name: (row["resources"], row["chunks"], row["errors"], row["warnings"]) for name, row in rows.items()} == {
        "Condition.ndjson": (1, 1, 2, 0),
        "InvalidPatient.ndjson": (2, 1, 4, 0),
        "Patient.ndjson": (2, 1, 0, 0),
    }
    assert (
        "Patient/val-invalid-1 at Bundle.entry[0].resource.birthDate" in rows["InvalidPatient.ndjson"]["first errors"]
    )
    assert list((job_dir / "import").iterdir()) and not list((job_dir / "validation").glob(".*"))


def test_with_fail_on_error_true_reports_are_written_then_the_step_fails_with_counts_per_file(validator_fake, tmp_path):
    job_dir = new_job(tmp_path / "jobs", shared_inputs())

    with pytest.raises(StepError) as caught:
        run_step(job_dir, validator_fake.base_url, fail_on_error=True)

    message = str(caught.value)
    assert "Condition.ndjson: 1 of 1 resources with errors (2 errors)" in message
    assert "InvalidPatient.ndjson: 2 of 2 resources with errors (4 errors)" in message
    assert "Patient.ndjson:" not in message.replace("InvalidPatient.ndjson:", "")
    assert str(job_dir / "validation") in message
    assert len(list((job_dir / "validation").glob("*.ndjson.zst"))) == 3
    rows = read_report_artifact(f"job-{job_dir.name}-02-validation-report")
    assert sum(row["errors"] for row in rows) == 6


def test_a_failed_step_run_again_reuses_every_report_and_passes_once_fail_on_error_is_false(validator_fake, tmp_path):
    job_dir = new_job(tmp_path / "jobs", shared_inputs())
    with pytest.raises(StepError):
        run_step(job_dir, validator_fake.base_url, fail_on_error=True)
    sent = len(validator_fake.state.requests)
    written = {p.name: p.stat().st_mtime_ns for p in (job_dir / "validation").iterdir()}

    with pytest.raises(StepError):
        run_step(job_dir, validator_fake.base_url, fail_on_error=True)
    result = run_step(job_dir, validator_fake.base_url, fail_on_error=False)

    assert len(validator_fake.state.requests) == sent == 3
    assert {p.name: p.stat().st_mtime_ns for p in (job_dir / "validation").iterdir()} == written
    assert result.summary["errors"] == 6


def test_a_valid_input_passes_with_fail_on_error_true(validator_fake, tmp_path):
    job_dir = new_job(tmp_path / "jobs", {"Patient.ndjson": TESTDATA / "validation" / "Patient.ndjson"})
    result = run_step(job_dir, validator_fake.base_url, fail_on_error=True)
    assert result.summary["errors"] == 0 and [f.name for f in result.files] == ["Patient.ndjson.zst"]


def test_core_is_validated_first(validator_fake, tmp_path):
    job_dir = new_job(
        tmp_path / "jobs",
        {
            "a.ndjson": TESTDATA / "validation" / "Patient.ndjson",
            "core.ndjson": TESTDATA / "validation" / "Condition.ndjson",
        },
    )
    run_step(job_dir, validator_fake.base_url, fail_on_error=False)
    assert [r.entries for r in validator_fake.state.requests] == [1, 2]


def test_an_unset_url_fails_the_step_naming_the_key(tmp_path):
    job_dir = new_job(tmp_path / "jobs", {"Patient.ndjson": TESTDATA / "validation" / "Patient.ndjson"})
    with pytest.raises(StepError, match="services.validation.url is not set"):
        validation_flow(step_input(job_dir, {"pipeline.enabled_steps": "[local_import]"}))


# --- kill -9 and resume ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_mid_step_continue_keeps_finished_reports_and_leaves_none_half_written_or_duplicated(
    validator_fake, tmp_path
):
    validator_fake.state.reset(latency_seconds=0.1)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    write_lines(inputs / "a.ndjson", varied_patients(20))
    write_lines(inputs / "b.ndjson", varied_patients(3000, max_pad=4000))  # about 10 chunks of 1 MB
    job_dir = new_job(tmp_path / "jobs", {"a.ndjson": inputs / "a.ndjson", "b.ndjson": inputs / "b.ndjson"})
    reports = job_dir / "validation"

    call = f"run_in_this_process({str(job_dir)!r}, {validator_fake.base_url!r})"
    code = f"from tests.support.validation import run_in_this_process; {call}"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for(lambda: (reports / ".b.ndjson.zst.part").exists() or None, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (reports / "a.ndjson.zst").exists() and not (reports / "b.ndjson.zst").exists()
    finished = (reports / "a.ndjson.zst").stat().st_mtime_ns
    validator_fake.state.reset()

    result = run_step(job_dir, validator_fake.base_url, fail_on_error=False, concurrency=2, batch_files=1)

    assert (reports / "a.ndjson.zst").stat().st_mtime_ns == finished
    b_lines = report_lines(reports / "b.ndjson.zst")
    assert [marks(o)[0] for o in b_lines] == list(range(1, len(b_lines) + 1)) and len(b_lines) > 3
    assert [label for o in b_lines for label in marks(o)[1]] == [f"Patient/p{i}" for i in range(3000)]
    assert len(validator_fake.state.requests) == len(b_lines)  # a was not validated again
    assert sorted(p.name for p in reports.iterdir()) == ["a.ndjson.zst", "b.ndjson.zst"]
    assert {f["file"]: f["resources"] for f in result.summary["per_file"]} == {"a.ndjson": 20, "b.ndjson": 3000}
