"""The job's story as a person reads it: sizes in KB/MB/GB and times in s/min/h, ``status`` without Python dicts or
lists, the whole inspection message on the terminal at a local wait, and hints a user types as printed
(``uv run python -m flows.run …``). Jobs run against the suite's temporary Prefect API."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flows.run import EXIT_FAILED, EXIT_OK, main
from tasks.core.readable import duration_text, plain_lines, size_text
from tasks.job.record import record_facts
from config.runtime import CLI
from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

HINT = f"{CLI} continue"
PYTHON_REPR = re.compile(r"[{\[]['\"\d]|[}\]]$|': |\": ")


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KB"),
        (1536, "1.5 KB"),
        (1024**2 - 1, "1.0 MB"),
        (10 * 1024**2, "10.0 MB"),
        (3 * 1024**3 + 1024**3 // 2, "3.5 GB"),
        (5000 * 1024**3, "5000.0 GB"),
    ],
)
def test_sizes_read_in_b_kb_mb_gb(size, text):
    assert size_text(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0.0 s"), (4.24, "4.2 s"), (59.96, "1 min 0 s"), (125, "2 min 5 s"), (3600, "1 h 0 min"), (7620, "2 h 7 min")],
)
def test_times_read_in_s_min_h(seconds, text):
    assert duration_text(seconds) == text


def test_nested_values_read_as_key_value_lines():
    facts = {"crtdl_path": "/j/crtdl.json", "submission": {"generation": 2, "in_flight": True}, "warnings": ["a", "b"]}

    assert plain_lines(facts, "  ") == [
        "  crtdl_path: /j/crtdl.json",
        "  submission:",
        "    generation: 2",
        "    in_flight: yes",
        "  warnings:",
        "    - a",
        "    - b",
    ]


def test_a_local_wait_shows_the_whole_inspection_message_and_status_reads_plainly(tmp_path, write_config, capsys):
    source = write_patients(tmp_path / "in" / "a.ndjson", 3)
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}, "compression": {"enabled": False}})

    started = run_cli("start", str(config), str(source.parent), "--no-progress")

    assert started.returncode == EXIT_OK, started.stderr
    (job_dir,) = (tmp_path / "jobs").iterdir()
    terminal = started.stdout + started.stderr
    for line in (
        f"Job {job_dir.name} is paused for inspection at step 2 (wait).\n",
        f"  Data to inspect: {job_dir / 'import'}\n",
        f"  Corrected files go into: {job_dir / 'import_wait'}\n",
        f"the next step reads only that folder; otherwise it reads {job_dir / 'import'} unchanged.\n",
        f"  To continue: Resume in the Prefect UI, or run: {HINT} {job_dir}\n",
        "Suspended: awaiting inspection at step 2 (wait) until ",
        f"(pipeline.wait_timeout); to go on: Resume in the Prefect UI, or run: {HINT} {job_dir}\n",
    ):
        assert line in terminal, terminal

    record_facts(job_dir, extraction_submission={"generation": 2, "started_at": "2026-11-23T04:00:00+00:00"})
    record_facts(job_dir, crtdl_warnings=["no rule for Observation"])
    assert main(["status", str(job_dir)]) == EXIT_OK
    status = capsys.readouterr().out
    assert "  extraction_submission:\n    generation: 2\n" in status, status
    assert "  crtdl_warnings:\n    - no rule for Observation\n" in status, status
    assert f"1. local_import: done, 1 file, {source.stat().st_size} B in import, took " in status, status
    assert f"       a.ndjson  {source.stat().st_size} B  3 resources\n" in status, status
    assert re.search(r"took \d+\.\d s\n", status), status
    assert " bytes" not in status and not PYTHON_REPR.search(status), status


def test_a_failed_job_prints_the_hint_a_user_types(tmp_path, write_config, capsys):
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.ndjson").write_text('{"no": "resourceType"}\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED

    (job_dir,) = (tmp_path / "jobs").iterdir()  # not the default ./jobs: the hint names the directory
    assert f"after fixing the cause, resume with: {HINT} {job_dir}\n" in capsys.readouterr().err


def write_patients(path: Path, count: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"resourceType": "Patient", "id": f"p{i}"}) + "\n" for i in range(count)))
    return path


def test_continue_with_a_note_records_it_with_the_gate_of_a_local_run(tmp_path, write_config, capsys):
    source = write_patients(tmp_path / "in" / "a.ndjson", 2)
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    assert main(["start", str(config), str(source.parent), "--no-progress"]) == EXIT_OK
    (job_dir,) = (tmp_path / "jobs").iterdir()

    assert main(["continue", job_dir.name, "--jobs-dir", str(tmp_path / "jobs"), "--note", "checked 2"]) == EXIT_OK

    capsys.readouterr()
    assert main(["status", str(job_dir)]) == EXIT_OK
    assert re.search(
        r"\n  2\. wait: done, 1 file, .* in import\n +inspection note: checked 2\n",
        status := capsys.readouterr().out,
    ), status
