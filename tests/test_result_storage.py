"""Where Prefect writes a job's task results: every record inside the job's directory, the record of a failed
file (Prefect's, under a random key) too, in the flow's process and on a Dask worker; never the file system's root
(where a storage rooted at ``/`` put it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from config.settings import TaskRunnerSettings
from flows.run import EXIT_FAILED, main
from tasks.job.contract import StepInput, file_task
from tasks.job.filework import file_runner, map_files
from tasks.job.layout import JobPaths
from tests.support.jobs import only_job_dir

pytestmark = pytest.mark.slow  # flows on a Prefect server

FAILURE_NAME = re.compile("[0-9a-f]{32}")  # the random name Prefect gives the record of a failure


class DamagedFile(Exception):
    pass


@file_task("damaged", "damaged[{name}]")
def fail_on(step: StepInput, name: str) -> str:
    raise DamagedFile(f"{name} is damaged")


def failure_record_paths(runner: TaskRunnerSettings, step: StepInput) -> list[Path]:
    """Run ``fail_on`` for one file in a flow on ``runner``; the paths of the failure records Prefect wrote."""
    from prefect import flow

    @flow
    def one_damaged_file() -> list:
        with file_runner(runner, JobPaths(Path(step.job_dir)).log_file):
            return map_files(fail_on, [(step, "a.ndjson")], workers=1)

    (outcome,) = one_damaged_file()
    assert isinstance(outcome, DamagedFile)
    return list(JobPaths(Path(step.job_dir)).results.iterdir())


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(TaskRunnerSettings(), id="in-process"),
        pytest.param(TaskRunnerSettings(kind="dask", dask_workers=1), id="dask", marks=pytest.mark.slow),
    ],
)
def test_a_failed_files_record_is_written_in_its_jobs_results_folder(tmp_path, write_config, runner):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    job_dir = tmp_path / "jobs" / "failing-job"
    job_dir.mkdir(parents=True)
    step = StepInput(
        job_id=job_dir.name, job_dir=str(job_dir), position=0, step="local_import", config_path=str(config)
    )

    (record,) = failure_record_paths(runner, step)

    written = json.loads(record.read_bytes())
    assert written["metadata"]["storage_key"] == str(record)
    assert "a.ndjson is damaged" in written["result"]
    assert not Path("/", record.name).exists()


@pytest.mark.usefixtures("prefect_api")
def test_a_failed_jobs_records_of_its_file_and_its_step_are_in_its_results_folder(tmp_path, write_config):
    source = tmp_path / "in"
    source.mkdir()
    (source / "broken.ndjson").write_bytes(b'{"resourceType":"Patient","id":"p1"}\n{"resourceType":\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED

    records = [p for p in JobPaths(only_job_dir(tmp_path / "jobs")).results.iterdir() if FAILURE_NAME.fullmatch(p.name)]
    failures = [json.loads(json.loads(p.read_bytes())["result"]) for p in records]
    assert sorted(f["__exc_type__"] for f in failures) == ["tasks.streams.ndjson.NdjsonError"] * 2, (
        failures
    )  # file, step
    assert all("broken.ndjson" in f["message"] for f in failures)
    assert not [p for p in records if Path("/", p.name).exists()]
