"""A running job shows its progress: ``status`` gives the step at work with what its progress artifact says (files
done of total, bytes, rate, percent), the job record's card a link to that progress; a wait step that holds the job
shows the files that wait."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import REPO_ROOT, run_cli, run_cli_here, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply

pytestmark = pytest.mark.slow
NDJSON = b"".join(b'{"resourceType":"Patient","id":"p%06d"}\n' % i for i in range(2000))


def test_status_and_the_card_show_the_step_at_work(tmp_path, write_config, prefect_api):
    """status said "not finished" and the card "not run yet" for a step hours into its work."""
    slow = Reply(200, {"Content-Type": "application/fhir+ndjson"}, NDJSON, drip=0.002)  # about 2 minutes
    with LoopbackServer(EchoHandler, EchoState(replies=[slow])) as files:
        config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})
        command = [sys.executable, "-m", "flows.run", "start", str(config), f"{files.base_url}/Patient.ndjson"]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: (tmp_path / "jobs").is_dir() and any((tmp_path / "jobs").iterdir()), "the job exists")
            (job_dir,) = (tmp_path / "jobs").iterdir()
            said = {}

            def working() -> bool:
                said["status"] = run_cli_here("status", str(job_dir)).stdout
                return "1. http_import: working: " in said["status"]

            wait_until(working, "status shows the step at work", timeout=120, every=0.25)
            card = httpx.get(f"{prefect_api['api_url']}/artifacts/job-{job_dir.name}/latest").json()["data"]
        finally:
            job.kill()
            job.wait()
    line = next(line for line in said["status"].splitlines() if "http_import: working" in line)
    assert "/ 1 files" in line and "/s" in line and line.endswith(" %)"), line
    assert "| 1 | http_import | running |" in card and f"job-{job_dir.name}-01-http-import-progress" in card, card


def test_a_wait_step_holding_the_job_shows_the_files_that_wait(tmp_path, write_config, prefect_api):
    (tmp_path / "in").mkdir()
    for name in ("a.ndjson", "b.ndjson"):
        (tmp_path / "in" / name).write_text('{"resourceType":"Patient","id":"p1"}\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    assert run_cli("start", str(config), str(tmp_path / "in"), "--no-progress").returncode == 0
    (job_dir,) = (tmp_path / "jobs").iterdir()
    status = run_cli_here("status", str(job_dir)).stdout
    assert "2. wait: awaiting inspection: 2 files, " in status and " in import" in status, status
