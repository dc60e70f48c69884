"""The job's one record (``tasks.job.record``): no update is lost to another thread or process, the one rule that
settles Prefect vs the file, gates with their notes, and the job lock that tells its holder in this process."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flows.jobs import JobLock
from tasks.job.contract import DataFile, count_text
from tasks.job.layout import JobPaths
from tasks.job.record import (
    AWAITING_INSPECTION,
    COMPLETED,
    CRASHED,
    RUNNING,
    SUSPENDED,
    counts_text,
    file_counts,
    gate,
    mark_gate_paused,
    read_facts,
    read_record,
    record_facts,
    record_state,
    record_step,
    release_awaiting_gates,
    settled_state,
    step_results,
)
from tests.conftest import REPO_ROOT

WRITERS, FACTS_EACH = 4, 25


def record_many(job_dir: str, writer: str) -> None:
    for number in range(FACTS_EACH):
        record_facts(Path(job_dir), **{f"{writer}-{number}": number})


@pytest.mark.slow
def test_facts_from_threads_and_processes_at_once_are_all_kept(tmp_path):
    record_state(tmp_path, RUNNING, flow_run_id="run-1")
    threads = [threading.Thread(target=record_many, args=(str(tmp_path), f"thread{i}")) for i in range(WRITERS)]
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=record_many, args=(str(tmp_path), f"process{i}")) for i in range(WRITERS)]
    for worker in [*threads, *processes]:
        worker.start()
    for worker in [*threads, *processes]:
        worker.join(timeout=120)
    assert all(process.exitcode == 0 for process in processes)

    assert len(read_facts(tmp_path)) == 2 * WRITERS * FACTS_EACH
    assert read_record(tmp_path)["state"] == RUNNING and read_record(tmp_path)["flow_run_ids"] == ["run-1"]


def test_a_fact_set_to_none_is_removed_and_the_others_are_kept(tmp_path):
    record_facts(tmp_path, extraction_job_id="x", crtdl_path="/c.json")
    assert record_facts(tmp_path, extraction_job_id=None) == {"crtdl_path": "/c.json"}


def test_the_file_settles_a_disagreement_with_the_server():
    assert settled_state(AWAITING_INSPECTION, locked=False, server="Running") == AWAITING_INSPECTION
    assert settled_state(RUNNING, locked=False, server="Running") == CRASHED
    assert settled_state(RUNNING, locked=True, server=None) == RUNNING
    assert settled_state(SUSPENDED, locked=False, server="Cancelled") == "Cancelled"
    assert settled_state(SUSPENDED, locked=False, server=None) == SUSPENDED
    assert settled_state(COMPLETED, locked=False, server="Running") == COMPLETED


def test_a_gate_publishes_once_and_continue_releases_it_with_its_note(tmp_path):
    mark_gate_paused(tmp_path, 1)
    first = gate(tmp_path, 1)["paused_at"]
    mark_gate_paused(tmp_path, 1)
    assert gate(tmp_path, 1)["paused_at"] == first
    assert release_awaiting_gates(tmp_path, "checked 3 patients") == [1]
    assert gate(tmp_path, 1)["released"] and gate(tmp_path, 1)["note"] == "checked 3 patients"
    assert release_awaiting_gates(tmp_path, "again") == []


def test_a_step_recorded_again_forgets_the_steps_after_it(tmp_path):
    for position in range(3):
        record_step(tmp_path, position, {"step": f"s{position}"})
    record_step(tmp_path, 1, {"step": "s1", "folder": "import_wait"})
    assert step_results(tmp_path) == {0: {"step": "s0"}, 1: {"step": "s1", "folder": "import_wait"}}


@pytest.mark.slow
def test_the_job_lock_is_taken_again_by_its_holder_and_refused_to_another_process(tmp_path):
    paths = JobPaths(tmp_path / "job")
    with JobLock(paths):
        with JobLock(paths):  # the same process (continue, then its flow): owns nothing, releases nothing
            pass
        take = (
            "from pathlib import Path; from flows.jobs import JobLock; from tasks.job.layout import JobPaths; "
            f"JobLock(JobPaths(Path({str(paths.job_dir)!r}))).acquire()"
        )
        other = subprocess.run(
            [sys.executable, "-c", take],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert "JobLockedError" in other.stderr, other.stderr
    assert (paths.job_dir / ".lock").read_text() == "", "released by its first holder, emptied"
    with JobLock(paths):
        pass


def test_counts_say_bundles_and_resources_apart():
    bundles = {"name": "batch.ndjson.zst", "resources": 2, "bundles": 2, "bundled": 19}
    bare = {"name": "core.ndjson", "resources": 12, "bundles": 0, "bundled": 0}
    mixed = {"name": "mixed.ndjson", "resources": 5, "bundles": 2, "bundled": 19}
    csv = {"name": "Patient.csv", "resources": 4}
    assert counts_text([file_counts(bundles)]) == "2 Bundles holding 19 resources"
    assert counts_text([file_counts(bare)]) == "12 resources"
    assert counts_text([file_counts(mixed)]) == "3 resources, 2 Bundles holding 19 resources"
    assert counts_text(map(file_counts, [bundles, bare, csv])) == "12 resources, 2 Bundles holding 19 resources, 4 rows"
    assert counts_text([]) == "0 resources"


def test_an_older_record_without_bundle_counts_shows_its_lines():
    """A job recorded before Bundles were counted: its lines may be Bundles or resources, so they are lines."""
    old = {"name": "batch.ndjson", "size": 10, "resources": 2}
    assert counts_text([file_counts(old), file_counts({"name": "Patient.csv", "resources": 4})]) == "2 lines, 4 rows"
    assert count_text([DataFile.model_validate(old)]) == "2 lines"  # an older cached result loads as it was
