"""Issue 20, item 13: the shipped automations (deployments/automations/notify.yaml) notify a person, on a real server.

Against a real ``prefect server start`` in a PREFECT_HOME of its own, as the README tells a user: a notification
block named ``dupflow-notify`` (here a custom webhook to a recording HTTP server on 127.0.0.1), the automations
applied with ``python -m deployments.automations.apply``, then real dupflow jobs from the command line that wait for
inspection, fail, and crash (SIGTERM while a download stalls). Each time the server's automation fires and the
recorder receives a message naming the job, its state and the state's message (or, for a ``Suspended`` run, which
Prefect leaves without one, what to do)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flows.prefect_server import ensure_server, stop_server
from flows.run import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from tests.conftest import REPO_ROOT, seed_prefect_home, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.support.ports import free_port
from tests.support.deployments import api
from tests.support.prefect_servers import kill_servers_of

pytestmark = pytest.mark.slow

SERVER_TIMEOUT = 240.0
NOTIFICATION_TIMEOUT = 90.0
COMMAND_TIMEOUT = 180.0
BLOCK = "dupflow-notify"  # the block name notify.yaml and the README use
AUTOMATIONS = {"dupflow job waiting for inspection", "dupflow job failed", "dupflow job crashed"}
# A custom webhook block as a user could save it; Prefect fills in {{subject}} and {{body}} when it notifies.
SAVE_BLOCK = """
import sys
from prefect.blocks.notifications import CustomWebhookNotificationBlock

CustomWebhookNotificationBlock(
    name=sys.argv[2], url=sys.argv[1], json_data={"subject": "{{subject}}", "body": "{{body}}"}
).save(sys.argv[2])
"""
NDJSON_TYPE = {"Content-Type": "application/fhir+ndjson"}


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory, prefect_database: Path) -> Iterator[dict[str, str]]:
    """A real Prefect server in a PREFECT_HOME of its own, on a free port; the environment of its clients."""
    home = seed_prefect_home(tmp_path_factory.mktemp("prefect-home"), prefect_database)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        monkeypatch.setenv("PREFECT_HOME", str(home))
        monkeypatch.setenv("PREFECT_SERVER_API_PORT", str(free_port()))
        api_url = ensure_server(home, startup_timeout=SERVER_TIMEOUT)
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    yield env | {"PREFECT_HOME": str(home), "PREFECT_API_URL": api_url, "PYTHONPATH": str(REPO_ROOT)}
    stop_server(home)
    kill_servers_of(home)


@pytest.fixture(scope="module")
def recorder() -> Iterator[LoopbackServer]:
    """The HTTP server the notification block posts to; it records every message."""
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


@pytest.fixture(scope="module")
def applied(environment: dict[str, str], recorder: LoopbackServer) -> dict[str, str]:
    """The block saved and the shipped automations applied twice (the second time replaces the first)."""
    python("-c", SAVE_BLOCK, f"{recorder.base_url}/notify", BLOCK, env=environment)
    for _ in range(2):
        applied = python("-m", "deployments.automations.apply", env=environment)
        assert applied.stdout.count("applied automation") == len(AUTOMATIONS), applied.stdout
    return environment


def test_applying_the_file_again_replaces_its_automations(applied):
    names = {automation["name"] for automation in automations_named(applied)}
    assert {name for name in names if not name.startswith("dupflow local run ")} == AUTOMATIONS  # not the guards


def test_two_applies_at_once_end_with_one_automation_of_each_name_and_no_error(applied):
    """Two applies at once: the second's delete of an automation the first had just deleted printed httpx's raw
    "404 ... Automation not found", and both could create one, which would notify twice."""
    command = [sys.executable, "-m", "deployments.automations.apply"]
    both = [
        subprocess.Popen(command, cwd=REPO_ROOT, env=applied, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    said = [apply.communicate(timeout=COMMAND_TIMEOUT) for apply in both]
    assert [apply.returncode for apply in both] == [0, 0], said
    assert all(stderr == "" for _, stderr in said), said
    for name in AUTOMATIONS:
        assert len(automations_named(applied, name)) == 1, name


def test_a_file_naming_a_missing_block_changes_none_of_its_automations(environment, tmp_path):
    notify = yaml.safe_load((REPO_ROOT / "deployments" / "automations" / "notify.yaml").read_text())
    (automation, *_) = notify["automations"]
    automation = {
        **automation,
        "name": "missing block",
        "actions": [{**automation["actions"][0], "block_document_id": "nowhere"}],
    }
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump({"automations": [automation]}))

    done = subprocess.run(
        [sys.executable, "-m", "deployments.automations.apply", str(tmp_path / "missing.yaml")],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert done.returncode == 1 and "no notification block named 'nowhere'" in done.stderr, done.stderr
    assert done.stdout == ""
    assert automations_named(environment, "missing block") == []


def job_at_a_wait_step(applied: dict[str, str], tmp_path: Path, write_config) -> tuple[str, str]:
    """A real job (local_import, then wait) started against the server: its id and its flow run's id."""
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.ndjson").write_text('{"resourceType": "Patient", "id": "p1"}\n')
    assert dupflow("start", config, source, env=applied).returncode == EXIT_OK
    return only_job(tmp_path / "jobs", applied)


def test_a_job_at_a_wait_step_notifies_that_it_waits_for_inspection(applied, recorder, tmp_path, write_config):
    job_id, flow_run_id = job_at_a_wait_step(applied, tmp_path, write_config)

    message = notification(recorder, job_id, "Suspended")
    assert message["subject"] == f"dupflow job {job_id} is waiting for inspection"
    assert f"python -m flows.run continue {job_id}" in message["body"]  # Prefect suspends a run without a message:
    assert "Resume a worker's run in the Prefect UI with the confirmation turned on" in message["body"]  # what to do
    assert f"/runs/flow-run/{flow_run_id}" in message["body"]  # a link: the local server knows its UI address


def test_a_failed_job_notifies_with_the_reason(applied, recorder, tmp_path, write_config):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    (tmp_path / "empty" / "sub").mkdir(parents=True)

    assert dupflow("start", config, tmp_path / "empty", env=applied).returncode == EXIT_FAILED
    job_id, flow_run_id = only_job(tmp_path / "jobs", applied)

    message = notification(recorder, job_id, "Failed")
    assert message["subject"] == f"dupflow job {job_id} failed"
    assert "no .ndjson or .ndjson.zst files" in message["body"]
    assert f"/runs/flow-run/{flow_run_id}" in message["body"]  # a link: the local server knows its UI address


def test_a_job_stopped_by_sigterm_notifies_that_it_crashed(applied, recorder, tmp_path, write_config):
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})
    stalled = EchoState(replies=[Reply(200, NDJSON_TYPE, b'{"resourceType": "Patient", "id": "p1"}\n', delay=60)])
    with LoopbackServer(EchoHandler, stalled) as source:
        process = start_dupflow("start", config, f"{source.base_url}/patients.ndjson", env=applied)
        try:
            wait_until(lambda: stalled.requests or process.poll() is not None, "the download to start")
            assert process.poll() is None, process.communicate()
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=COMMAND_TIMEOUT)
        finally:
            process.kill()
    assert process.returncode == EXIT_INTERRUPTED, err
    job_id, flow_run_id = only_job(tmp_path / "jobs", applied)

    message = notification(recorder, job_id, "Cancelled")
    assert message["subject"] == f"dupflow job {job_id} cancelled"
    assert "interrupted (Ctrl+C or SIGTERM)" in message["body"]
    assert f"/runs/flow-run/{flow_run_id}" in message["body"]  # a link: the local server knows its UI address


def notification(recorder: LoopbackServer, job_id: str, state: str, saying: str = "") -> dict[str, str]:
    """The first message the recorder got about ``job_id`` in ``state`` (with ``saying`` in it), waited for."""

    def first() -> dict[str, str] | None:
        with recorder.state.lock:
            bodies = [request.body for request in recorder.state.requests if request.path == "/notify"]
        messages = [json.loads(body) for body in bodies]
        heading = f"dupflow job {job_id}: {state}\n"
        return next((m for m in messages if m["body"].startswith(heading) and saying in m["body"]), None)

    wait_until(first, f"a notification that job {job_id} is {state}", timeout=NOTIFICATION_TIMEOUT)
    return first()


def automations_named(env: dict[str, str], *names: str) -> list[dict]:
    """The server's automations (of ``names``, when given)."""
    body = {"automations": {"name": {"any_": list(names)}}} if names else {}
    return api(env["PREFECT_API_URL"], "POST", "/automations/filter", json=body)


def only_job(jobs_dir: Path, env: dict[str, str]) -> tuple[str, str]:
    """The id and the (only) flow run id of the one job in ``jobs_dir``, on the server of ``env``."""
    (job_dir,) = [path for path in jobs_dir.iterdir() if path.is_dir()]
    tags = {"flow_runs": {"tags": {"all_": [f"job-{job_dir.name}"]}}}
    (run,) = api(env["PREFECT_API_URL"], "POST", "/flow_runs/filter", json=tags)
    flow_run_id = run["id"]
    return job_dir.name, flow_run_id


def python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root, as the README's ``uv run python ...``; it must succeed."""
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    assert done.returncode == 0, f"python {' '.join(args[:2])}:\n{done.stdout}\n{done.stderr}"
    return done


def dupflow(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m flows.run ARGS --no-progress`` to its end."""
    process = start_dupflow(*args, env=env)
    out, err = process.communicate(timeout=COMMAND_TIMEOUT)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def start_dupflow(*args: str | Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.run", *map(str, args), "--no-progress"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
