"""Prefect's controls pressed as the UI presses them, on jobs started as a user starts them on the home's server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT, wait_until
from tests.support.deployments import api
from tests.support.jobs import step_results


def press(api_url: str, run_id: str, state: dict[str, Any]) -> None:
    """A state change as the UI's buttons send it (``set_state``, forced)."""
    answer = api(api_url, "POST", f"/flow_runs/{run_id}/set_state", json={"state": state, "force": True})
    assert answer["status"] == "ACCEPT", answer


def server_state(api_url: str, run_id: str) -> str:
    return str(api(api_url, "GET", f"/flow_runs/{run_id}")["state"]["name"])


def finished(process: subprocess.Popen) -> tuple[int, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out + err


def home_command(*args: str, home: Path) -> subprocess.Popen[str]:
    """A command as a user types it on the home's local server: ``PREFECT_API_URL`` unset, so the command finds
    the home's server (and its runner) by itself."""
    env = {name: value for name, value in os.environ.items() if name != "PREFECT_API_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "flows.run", *args],
        cwd=REPO_ROOT,
        env=env | {"PREFECT_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def released_note(job: Path) -> str:
    """The inspection note of the job's released wait step (second), once the server has its task run (task runs
    arrive as events, a moment after the flow run's state)."""
    wait_until(lambda: 1 in step_results(job), "the wait step's task run", timeout=30, every=0.2)
    return str(step_results(job)[1]["summary"]["inspection note"])
