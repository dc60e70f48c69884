"""Per-file work in-process: one file at a time runs in the caller's thread; a step (in the flow's process or on a
Dask worker) loads its settings from the configuration it names, and again when ``continue --set`` or an edited
configuration changed them."""

from __future__ import annotations

import os
import threading
import tracemalloc
from dataclasses import replace
from pathlib import Path

from tasks.job.contract import DataFile, StepInput, digest, settings_of
from tasks.job.filework import FileToDo, batch_label, file_batches, map_files, run_batches


def where_it_runs(number: int) -> tuple[int, threading.Thread]:
    if number == 2:
        raise ValueError("file 2 is damaged")
    return number, threading.current_thread()


def test_one_file_at_a_time_runs_in_the_calling_thread_and_nothing_starts_after_a_failure():
    outcomes = map_files(where_it_runs, [(1,), (2,), (3,)], workers=1)

    assert outcomes[0] == (1, threading.current_thread())  # Ctrl+C in this thread stops the file where it is
    assert isinstance(outcomes[1], ValueError)
    assert outcomes[2] is outcomes[1], "no file starts after one failed"


def test_several_files_at_once_run_on_worker_threads():
    outcomes = map_files(where_it_runs, [(1,), (3,)], workers=2)

    assert [number for number, _ in outcomes] == [1, 3]
    assert all(thread is not threading.current_thread() for _, thread in outcomes)


def test_the_settings_are_loaded_again_when_the_overrides_or_the_configuration_changed(tmp_path: Path, write_config):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}, "retry": {"max_attempts": 2}})
    step = StepInput(
        job_id="worker-job",
        job_dir=str(tmp_path / "jobs" / "worker-job"),
        position=0,
        step="local_import",
        config_path=str(config),
    )

    assert settings_of(step).retry.max_attempts == 2
    assert settings_of(step) is settings_of(step), "loaded once per identity"

    continued = step.model_copy(update={"overrides": {"retry.max_attempts": "4"}})  # continue --set
    assert settings_of(continued).retry.max_attempts == 4
    assert settings_of(step).retry.max_attempts == 2

    before = config.stat().st_mtime_ns
    write_config({"pipeline": {"enabled_steps": ["local_import"]}, "retry": {"max_attempts": 3}})
    os.utime(config, ns=(before + 10**9, before + 10**9))  # an edit, even within the file system's clock tick
    assert settings_of(step).retry.max_attempts == 3


def test_a_batch_gets_its_own_files_as_a_digest_so_a_changed_file_redoes_its_batch_alone(tmp_path: Path, write_config):
    """Every file task's parameters held the step's whole file list: 0.5 s of bookkeeping a task run at 5,000
    files, growing with the square of a step's files. Then a digest of that list was in every batch's key: one
    corrected file made every other file of the step be done again (hours of service work at 3,000 files)."""
    config = write_config({"pipeline": {"enabled_steps": ["local_import"], "file_batches": {"max_files": 1}}})
    files = [DataFile(name=f"batch-{n}.ndjson", size=100 + n, resources=n, modified_ns=n) for n in range(5_000)]
    step = StepInput(
        job_id="j",
        job_dir=str(tmp_path),
        position=1,
        step="pseudonymizer",
        folder="import",
        files=files,
        config_path=str(config),
    )

    def batches_of(step: StepInput) -> list[StepInput]:
        seen: list[StepInput] = []
        to_do = [FileToDo(f.name, f.size, (f.name,), f) for f in step.files[:3]]
        labels = run_batches(lambda given, label, _: seen.append(given) or label, step, to_do, 1)
        assert labels == [f.name for f in step.files[:3]]
        return seen

    before = batches_of(step)
    assert all(given.files == [] and given.files_digest for given in before)
    assert len(before[0].model_dump_json()) < 1_000
    rewritten = replace(files[1], modified_ns=10**18)  # in place: the same size, a new time of change
    after = batches_of(step.model_copy(update={"files": [files[0], rewritten, *files[2:]]}))
    assert [a.cache_identity() == b.cache_identity() for a, b in zip(before, after, strict=True)] == [True, False, True]


def test_a_digest_is_the_one_results_were_kept_under_and_made_without_holding_the_text_whole():
    """The cache keys of results kept before must not change (a job continued after an upgrade would redo its
    finished steps); the digest of a step's 3,000 files held 2.3 MB of JSON pieces at the flow's peak."""
    value = [
        {"job_id": "a1", "files": [{"name": "Ärzte café.ndjson", "size": 12, "modified_ns": None}], "ratio": 0.1},
        [Path("/jobs/x"), "batch-1 … batch-9 (9 files)", [1, 2.5, True, None]],
    ]
    assert digest(value) == "2b9be5c7fd3a5fd1c957"  # as sha256 of json.dumps(value, sort_keys=True, default=str)
    files = [DataFile(name=f"batch-{n:05d}.ndjson", size=12_000 + n, resources=12) for n in range(3_000)]
    step = StepInput(job_id="j", job_dir="/jobs/j", position=1, step="flattening", folder="import", files=files)
    identity = step.cache_identity()
    tracemalloc.start()
    try:
        digest(identity)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the digest takes 4 KB, the whole text 2.3 MB; tracemalloc counts every thread's allocations, and a test
    # worker's own threads (Prefect's, the logging's) added up to 261 KB in one run of the full suite
    assert peak < 1024 * 1024, f"{peak / 1024:.0f} KB"


def test_consecutive_files_make_batches_bounded_by_count_and_bytes_and_a_large_file_is_alone():
    sizes = [10, 10, 10, 10, 10, 100, 10, None, 10, 0, 60, 50]

    batches = file_batches(sizes, max_files=3, max_bytes=100)

    assert [list(batch) for batch in batches] == [[0, 1, 2], [3, 4], [5], [6], [7], [8, 9, 10], [11]]
    assert file_batches(sizes, max_files=3, max_bytes=100) == batches, "the same files, the same batches"
    assert file_batches([], max_files=3, max_bytes=100) == []


def test_a_batch_is_named_after_its_files():
    assert batch_label(["a.ndjson"]) == "a.ndjson"
    assert batch_label(["a.ndjson", "b.ndjson", "f.ndjson"]) == "a.ndjson … f.ndjson (3 files)"
