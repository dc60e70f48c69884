"""A job's inputs are its ``job.json``'s: a flow run whose parameters give others is refused, and ``continue``
runs the job's run with the job's own, never with the copy on the Prefect server that anyone with access may
have changed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from config.runtime import CLI
from flows.job_state import newest_run
from flows.jobs import prepare_job
from flows.run import EXIT_OK, main
from tasks.core.errors import JobError
from tasks.job.layout import JobPaths
from tests.conftest import run_cli
from tests.support.jobs import only_job_dir, source_dir

SAMPLE = Path(__file__).resolve().parent.parent / "config" / "sample-data"


def test_a_flow_run_whose_parameters_give_other_inputs_than_its_job_is_refused_naming_them(tmp_path, write_config):
    """What a worker's run would do with parameters edited on the server: refused, never merged into the job."""
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    job = prepare_job(None, str(config), str(SAMPLE), {}, overrides_source="--set")
    before = job.paths.job_file.read_bytes()
    edited = {"services.flattening.lookup_path": "/elsewhere.json", "compression.enabled": "false"}

    with pytest.raises(JobError) as refused:
        prepare_job(job.job_id, str(config), str(SAMPLE), edited, overrides_source="the flow")

    assert str(refused.value) == (
        f"job {job.job_id}: its flow run's parameters differ from its job.json in "
        "overrides.services.flattening.lookup_path, overrides.compression.enabled; a job runs with the inputs it "
        f"was started with: {CLI} continue {job.job_id} runs it with them, --set KEY=VALUE changes one"
    )
    assert job.paths.job_file.read_bytes() == before


def test_a_flow_run_with_its_jobs_inputs_as_first_given_goes_on(tmp_path, write_config, monkeypatch):
    """A suspended deployment run, resumed, runs again with the parameters it was started with: relative paths
    that ``start`` froze absolute are the same inputs."""
    monkeypatch.chdir(tmp_path)
    write_config({"pipeline": {"enabled_steps": ["local_import"]}}, tmp_path / "job.yaml")
    given = {"services.local_import.dir": "in", "retry.max_attempts": "3"}
    source_dir(tmp_path, {"a.ndjson": 1})
    job = prepare_job(None, "job.yaml", None, given, overrides_source="--set")

    again = prepare_job(job.job_id, "job.yaml", None, given, overrides_source="the flow")

    assert again.record.overrides["services.local_import.dir"] == str(tmp_path / "in")


@pytest.mark.slow
def test_continue_of_a_flow_run_edited_on_the_server_goes_on_with_its_jobs_own_inputs(
    tmp_path, write_config, prefect_api
):
    """The finding: a PATCH of a suspended run's parameters redirected the operator's next ``continue``."""
    tree = {"pipeline": {"enabled_steps": ["local_import", "wait", "flattening"]}, "compression": {"enabled": False}}
    tree["services"] = {"flattening": {"lookup_path": SAMPLE / "flatten-lookup.json"}}
    config = write_config(tree)
    crtdl = SAMPLE / "crtdl.json"
    assert main(["start", str(config), str(crtdl), "--dir", str(SAMPLE), "--no-progress"]) == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    recorded, run = job_dir.joinpath("job.json").read_bytes(), newest_run(JobPaths(job_dir))
    assert run is not None
    edited = {**run["parameters"]["overrides"], "services.flattening.lookup_path": str(tmp_path / "theirs.json")}
    edited["compression.enabled"] = "true"
    url = f"{prefect_api['api_url']}/flow_runs/{run['id']}"
    httpx.patch(url, json={"parameters": {**run["parameters"], "overrides": edited}}).raise_for_status()

    continued = run_cli("continue", str(job_dir), "--no-progress")

    assert continued.returncode == EXIT_OK, continued.stderr
    assert (
        "its flow run's parameters on the server differed from its job.json in overrides.compression.enabled, "
        "overrides.services.flattening.lookup_path: reset" in continued.stdout
    )
    assert job_dir.joinpath("job.json").read_bytes() == recorded
    assert httpx.get(url).json()["parameters"]["overrides"] == run["parameters"]["overrides"]
    assert sorted(p.name for p in (job_dir / "flattening").glob("*.csv")) == sorted(
        p.name for p in (job_dir / "flattening").iterdir() if not p.name.startswith(".")
    )
    assert not list((job_dir / "flattening").glob("*.zst"))
