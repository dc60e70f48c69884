"""Per-file work in-process: one file at a time runs in the caller's thread; a worker process (a Dask worker) loads
the job's settings from ``job.json`` and again when ``continue --set`` or an edited configuration changed them."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from tasks.contract import StepInput, settings_of
from tasks.filework import map_files


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


def write_job_file(job_dir: Path, config: Path, overrides: dict[str, str]) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps({"config_path": str(config), "overrides": overrides}))


def test_a_worker_loads_the_settings_again_when_the_job_or_its_configuration_changed(tmp_path: Path):
    config = tmp_path / "job.yaml"
    config.write_text("pipeline:\n  enabled_steps: [local_import]\nretry:\n  max_attempts: 2\n")
    job_dir = tmp_path / "jobs" / "worker-job"
    write_job_file(job_dir, config, {})
    step = StepInput(job_id="worker-job", job_dir=str(job_dir), position=0, step="local_import")

    assert settings_of(step).retry.max_attempts == 2

    write_job_file(job_dir, config, {"retry.max_attempts": "4"})  # continue --set retry.max_attempts=4
    assert settings_of(step).retry.max_attempts == 4

    write_job_file(job_dir, config, {})
    assert settings_of(step).retry.max_attempts == 2

    before = config.stat().st_mtime_ns
    config.write_text("pipeline:\n  enabled_steps: [local_import]\nretry:\n  max_attempts: 3\n")
    os.utime(config, ns=(before + 10**9, before + 10**9))  # an edit, even within the file system's clock tick
    assert settings_of(step).retry.max_attempts == 3
