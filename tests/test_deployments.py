"""A deployment run is a job like any other, against a real ``prefect server start`` on loopback.

The flow is served (``python -m deployments.serve``) from a directory other than the configuration's, and runs
are created through the server's REST API, as the UI or a schedule would: a new job takes the run's id, so the run
bears the job's name from the flow's first log line, and is tagged ``job-<id>``; the job lands under the
configuration's directory (relative paths in a configuration file resolve against that file), ``status`` agrees
with the server, and a secret among the deployment's overrides is refused before the run does any work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT, run_cli_here, wait_until
from tests.support.deployments import api
from tests.support.jobs import source_dir

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def server(prefect_api) -> tuple[str, dict[str, str]]:
    """The test run's Prefect server (``prefect_api``) and the environment for its clients: this module's tests read
    only their own deployments, runs and jobs, so a server of the module's own (a start costs some 7 CPU-seconds)
    would tell them nothing more."""
    api_url = prefect_api["api_url"]
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    return api_url, env | {"PREFECT_API_URL": api_url, "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory with a configuration whose paths are relative to it, and data to import."""
    site = tmp_path_factory.mktemp("site")
    (site / "data").mkdir(parents=True)
    (site / "data" / "a.ndjson").write_text(
        '{"resourceType":"Patient","id":"1"}\n{"resourceType":"Patient","id":"2"}\n'
    )
    (site / "job.yaml").write_text(
        "pipeline:\n  enabled_steps: [local_import]\njobs_dir: ./jobs\n"
        "services:\n  local_import:\n    dir: ./data\n  pseudonymizer:\n    url: http://127.0.0.1:9\n"
    )
    return site


@pytest.fixture(scope="module")
def served(server, site: Path, tmp_path_factory: pytest.TempPathFactory):
    """The flow served from another working directory; yields the deployment id."""
    api_url, env = server
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    name = f"test-{uuid.uuid4().hex[:8]}"
    process = subprocess.Popen(
        [sys.executable, "-m", "deployments.serve", str(site / "job.yaml"), "--name", name],
        cwd=elsewhere,
        env=env | {"PREFECT_RUNNER_POLL_FREQUENCY": "1"},  # a run is taken up within 1 s, not 10
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield wait_for_deployment(api_url, f"dupflow/{name}", process)
    finally:
        process.terminate()
        process.wait(30)
    assert list(elsewhere.iterdir()) == []


def wait_for_deployment(api_url: str, name: str, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, "the serve process ended"
        response = httpx.get(f"{api_url}/deployments/name/{name}")
        if response.status_code == 200:
            return response.json()["id"]
        time.sleep(0.5)
    raise AssertionError(f"deployment {name} did not appear")


def run_deployment(api_url: str, deployment_id: str, parameters: dict) -> dict:
    """Create a run as the UI does and wait for it to end; the final flow run as the server has it."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while (
        (
            created := httpx.post(
                f"{api_url}/deployments/{deployment_id}/create_flow_run", json={"parameters": parameters}
            )
        ).status_code
        == 503
        and time.monotonic() < deadline
    ):  # a busy SQLite server asks to try again, as Prefect's client does
        time.sleep(0.5)
    created.raise_for_status()
    run_id = created.json()["id"]
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        run = httpx.get(f"{api_url}/flow_runs/{run_id}").json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"flow run {run_id} did not end")


def flow_run_log(api_url: str, run_id: str) -> str:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return "\n".join(entry["message"] for entry in httpx.post(f"{api_url}/logs/filter", json=body).json())


@pytest.fixture(scope="module")
def completed(server, served) -> dict:
    """One run of the deployment with its defaults, ended; the server's flow run (a run costs seconds: shared)."""
    api_url, _ = server
    return run_deployment(api_url, served, {})


def test_a_deployment_run_is_a_named_tagged_job_under_the_configs_directory(server, site, completed):
    api_url, env = server
    run = completed
    assert run["state"]["type"] == "COMPLETED", run["state"]
    job_id = run["name"]
    assert job_id == run["id"], "a new job takes its flow run's id, so the run bears the job's name from the start"
    assert f"job-{job_id}" in run["tags"]
    beginning = f"Beginning flow run '{job_id}'"
    wait_until(
        lambda: beginning in flow_run_log(api_url, run["id"]), "the run's logs reach the API", timeout=120, every=0.25
    )
    log = flow_run_log(api_url, run["id"])
    assert "new-job" not in log, log
    job_dir = site / "jobs" / job_id
    assert (job_dir / "import" / "a.ndjson.zst").is_file()

    status = run_cli_here("status", job_id, "--jobs-dir", str(site / "jobs"), env=env)
    assert status.returncode == 0, status.stderr
    assert f"state:     Completed (flow run {run['id']})" in status.stdout


def test_a_secret_in_the_deployments_overrides_is_refused_before_any_work(server, site, served):
    api_url, _ = server
    jobs_before = set((site / "jobs").glob("*")) if (site / "jobs").exists() else set()
    secret = "hunter2-" + uuid.uuid4().hex
    run = run_deployment(api_url, served, {"overrides": {"services.pseudonymizer.auth.password": secret}})
    assert run["state"]["type"] == "FAILED"
    assert "services.pseudonymizer.auth.password" in run["state"]["message"]
    assert "secret" in run["state"]["message"] and secret not in run["state"]["message"]
    jobs_after = set((site / "jobs").glob("*")) if (site / "jobs").exists() else set()
    assert jobs_after == jobs_before


def jobs_of(site: Path) -> set[Path]:
    return set((site / "jobs").glob("*")) if (site / "jobs").exists() else set()


def test_a_job_id_the_configuration_does_not_know_is_refused_never_made(server, site, served):
    """Typed into the form with another configuration than the job's: a new job of that id was made (a second
    extraction under the old job's name, its artifacts mixed with the other's)."""
    api_url, _ = server
    before, unknown = jobs_of(site), str(uuid.uuid4())
    run = run_deployment(api_url, served, {"job_id": unknown})
    assert run["state"]["type"] == "FAILED" and f"no job {unknown} in {site / 'jobs'}" in run["state"]["message"]
    assert "give the configuration the job was started with" in run["state"]["message"]
    assert jobs_of(site) == before


@pytest.mark.parametrize("attach", ["status-url-pasted-wrong", "https://alice:pw-in-url@torch.example/fhir/__status/1"])
def test_attach_on_a_completed_job_is_refused_and_changes_nothing(server, site, served, completed, attach):
    """A refused attach left job.json Running, and a text that was no URL replaced the job's extraction handle."""
    api_url, _ = server
    done = completed
    assert done["state"]["type"] == "COMPLETED", done["state"]
    job_file = site / "jobs" / done["name"] / "job.json"
    recorded = job_file.read_bytes()
    run = run_deployment(api_url, served, {"job_id": done["name"], "attach": attach})
    assert run["state"]["type"] == "FAILED" and "attach" in run["state"]["message"], run["state"]
    assert "pw-in-url" not in run["state"]["message"] and job_file.read_bytes() == recorded


def test_a_job_id_that_is_no_job_id_never_names_the_run_and_a_bad_override_names_the_parameter(server, site, served):
    api_url, _ = server
    forged = "ok\u202egnp.exe\nERROR: forged"
    run = run_deployment(api_url, served, {"job_id": forged})
    assert run["state"]["type"] == "FAILED" and run["name"] == run["id"], run["name"]
    run = run_deployment(api_url, served, {"overrides": {"retry.max_attempts": "many"}})
    assert run["state"]["type"] == "FAILED"
    assert "(from the flow's overrides parameter retry.max_attempts)" in run["state"]["message"], run["state"]


SAMPLE = Path(__file__).resolve().parent.parent / "config" / "sample-data"


@pytest.mark.parametrize(
    ("job_input", "schedule", "said"),
    [
        ("missing.json", [], "missing.json not found"),  # as start says it
        (str(SAMPLE / "crtdl.json"), ["--cron", "bogus"], "error: --cron 'bogus' --timezone 'UTC': Invalid cron"),
        (None, ["--cron", "bogus"], "Invalid cron"),  # without INPUT (each run gives it in the form): not refused
        (str(SAMPLE / "crtdl.json"), ["--cron", "0 2 * * *", "--timezone", "Europe/Berln"], "Invalid timezone"),
    ],
    ids=["missing-input", "cron", "no-input", "timezone"],
)
def test_serve_refuses_what_every_run_would_fail_on_in_one_line(tmp_path, write_config, job_input, schedule, said):
    """It served a deployment whose every run failed on a missing CRTDL; a bad schedule ended in a traceback."""
    services = {"local_import": {"dir": SAMPLE}, "flattening": {"lookup_path": SAMPLE / "flatten-lookup.json"}}
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "flattening"]}, "services": services})
    refused = subprocess.run(
        [sys.executable, "-m", "deployments.serve", str(config), *([job_input] if job_input else []), *schedule],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SAMPLE.parent.parent), "PREFECT_API_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_run_cancelled_from_the_ui_mid_step_is_a_cancelled_job(server, tmp_path, write_config):
    """The UI showed Cancelled and job.json, status and the record card said Crashed."""
    api_url, env = server
    source = source_dir(tmp_path, {"c.ndjson": 400_000}, pad=400)
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}, "compression": {"level": "best"}})
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    serving = subprocess.Popen(
        [sys.executable, "-m", "deployments.serve", str(config), str(source), "--name", name],
        cwd=tmp_path,
        env={**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deployment = wait_for_deployment(api_url, f"dupflow/{name}", serving)
        run_id = api(api_url, "POST", f"/deployments/{deployment}/create_flow_run", json={"parameters": {}})["id"]
        part = tmp_path / "jobs" / run_id / "import" / ".c.ndjson.zst.part"
        wait_until(part.exists, "the import is at work", timeout=RUN_TIMEOUT)
        cancel = {"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True}  # the UI's Cancel
        api(api_url, "POST", f"/flow_runs/{run_id}/set_state", json=cancel)
        wait_until(lambda: api(api_url, "GET", f"/flow_runs/{run_id}")["state"]["type"] == "CANCELLED", "the run ends")
    finally:
        serving.terminate()
        serving.wait(30)
    status = run_cli_here("status", str(tmp_path / "jobs" / run_id), env=env)
    resumes = f"continue {tmp_path / 'jobs' / run_id} resumes it"
    assert "state:     Cancelled" in status.stdout and resumes in status.stdout, status.stdout


def test_a_served_deployment_runs_one_job_at_a_time_the_next_queued(server, served):
    """A restart ran the missed scheduled run and the current one at once: with an extractor configuration, two
    extractions. Two runs created at the same moment run one after the other (Prefect's deployment concurrency)."""
    api_url, _ = server
    deployment = api(api_url, "GET", f"/deployments/{served}")
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    made = [api(api_url, "POST", f"/deployments/{served}/create_flow_run", json={"parameters": {}}) for _ in "ab"]
    ended = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

    def runs() -> list[dict]:
        return [api(api_url, "GET", f"/flow_runs/{run['id']}") for run in made]

    wait_until(lambda: all(run["state"]["type"] in ended for run in runs()), "both runs end", RUN_TIMEOUT, 0.5)
    first, second = sorted(runs(), key=lambda run: run["start_time"])
    assert [run["state"]["type"] for run in (first, second)] == ["COMPLETED", "COMPLETED"]
    assert first["end_time"] <= second["start_time"]


def test_stopping_serve_pauses_its_schedule(server, site):
    """``pause_on_shutdown``: a stopped serve leaves no schedule on to pile up runs for its restart."""
    api_url, env = server
    name = f"paused-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "deployments.serve", str(site / "job.yaml"), "--name", name, "--cron", "0 3 * * *"]
    serving = subprocess.Popen(command, cwd=site, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deployment = wait_for_deployment(api_url, f"dupflow/{name}", serving)
        polled = lambda: api(api_url, "GET", f"/deployments/{deployment}")["last_polled"] is not None  # noqa: E731
        wait_until(polled, "the runner polls for its runs", RUN_TIMEOUT, 0.5)
        assert api(api_url, "GET", f"/deployments/{deployment}")["paused"] is False
    finally:
        serving.terminate()
        serving.wait(30)
    assert api(api_url, "GET", f"/deployments/{deployment}")["paused"] is True
