"""A job seen from outside, as the command line leaves it: its directory, record and artifacts, its flow run's
state, and a command run in a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import zstandard

from tasks.job.layout import JobPaths, directory_tag, job_tag
from tasks.job.record import read_record
from tests.conftest import REPO_ROOT

LONG_AGO = "2026-01-01T00:00:00+00:00"


def write_ndjson(path: Path, count: int, pad: int = 0) -> Path:
    filler = "x" * pad
    path.write_bytes(
        b"".join(b'{"resourceType":"Patient","id":"p%d","note":"%s"}\n' % (i, filler.encode()) for i in range(count))
    )
    return path


def source_dir(tmp_path: Path, files: dict[str, int], pad: int = 0) -> Path:
    """An import directory holding NDJSON files of the given numbers of resources."""
    source = tmp_path / "in"
    source.mkdir(parents=True)
    for name, count in files.items():
        write_ndjson(source / name, count, pad)
    return source


def only_job_dir(jobs_dir: Path) -> Path:
    (job_dir,) = [d for d in jobs_dir.iterdir() if d.is_dir()]
    return job_dir


def made_old(job_dir: Path) -> Path:
    """The job as if it last changed on disk long ago (its record, log and results)."""
    paths, long_ago = JobPaths(job_dir), datetime.fromisoformat(LONG_AGO).timestamp()
    for path in (paths.job_file, paths.log_file, paths.results):
        if path.exists():
            os.utime(path, (long_ago, long_ago))
    return job_dir


def job_file(job_dir: Path) -> dict:
    """The job as ``status`` shows it: its ``job.json``, with the state and message of its newest flow run on the
    server of ``PREFECT_API_URL`` (by the one rule: ``Unknown`` without one) and that run's id in ``flow_run_ids``
    (empty without one)."""
    from flows.job_state import newest_run, run_state
    from flows.status_cli import state_message

    paths = JobPaths(job_dir)
    run = newest_run(paths)
    state = run_state(run) or "Unknown"
    shown = {"state": state, "state_message": state_message(paths, run, state)}
    return json.loads(paths.job_file.read_text()) | shown | {"flow_run_ids": [str(run["id"])] if run else []}


def read_artifacts(key_prefix: str) -> dict[str, str]:
    """The job's artifacts in the Prefect API, by key (data as text), each key's newest version (the server returns a
    page of 200 in no set order unless it is told to sort)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=key_prefix)), sort=ArtifactSort.CREATED_DESC
        )
    newest_first: dict[str, str] = {}
    for artifact in found:  # the newest version of each key
        newest_first.setdefault(artifact.key, str(artifact.data))
    return newest_first


def flow_run_state(flow_run_id: str) -> tuple[str, str]:
    state = read_flow_run_state(flow_run_id)
    return state.type.value, state.name


def read_flow_run_state(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


def start_cli_process(*args: str) -> subprocess.Popen:
    """``python -m flows.run ARGS`` as from a terminal: SIGINT (Ctrl+C) handled by default, whatever the test set."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.run", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )


def sigint_as_in_a_terminal() -> None:
    """In the child before it starts: SIGINT and SIGHUP handled by default and not blocked, as in a terminal (a test
    run started in the background ignores SIGINT, one under ``nohup`` SIGHUP, and the child would inherit that)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGHUP])


def wait_for(probe, process: subprocess.Popen, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := probe()) is not None:
            return found
        if process.poll() is not None:
            raise AssertionError(f"process ended early: {process.communicate()}")
        time.sleep(0.02)
    process.kill()
    raise AssertionError("condition not reached in time")


def read_report_artifact(key: str) -> list[dict[str, Any]]:
    """The newest version of the artifact ``key``'s data."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    data = artifact.data
    return json.loads(data) if isinstance(data, str) else data


def resources_in(path: Path) -> int:
    data = path.read_bytes()
    if path.name.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return sum(1 for line in data.splitlines() if line.strip())


def job_record_card(job_id: str, flow_run_id: str) -> str:
    """The one "Job record" artifact the flow run made (its Artifacts tab shows one card per job)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        (card,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[f"job-{job_id}"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
            )
        )
    return str(card.data)


def step_results(job_dir: Path) -> dict[int, Any]:
    """The steps the job's newest flow run finished, by position, as ``status`` reads them (the run's task runs on
    the server of ``PREFECT_API_URL``, each step's result record in the job folder): a step's record as a dict, a
    gate's form answer; none before the job has a record or a run."""
    from flows.job_state import finished_steps, newest_run
    from tasks.job.record import StepRecord

    if not (paths := JobPaths(job_dir)).job_file.is_file() or (run := newest_run(paths)) is None:
        return {}
    done = finished_steps(paths, read_record(job_dir).enabled_steps, run)
    return {p: step.model_dump() if isinstance(step, StepRecord) else step for p, step in done.items()}


def put_flow_run(api: Any, job_dir: Path, state_type: str, state_name: str, message: str = "") -> str:
    """A flow run of the job on the fake Prefect API (``tests.fakes.prefect_api``) as the real server returns it:
    tagged with the job and its directory, in the given state; its id."""
    run_id = str(uuid.uuid4())
    state = {"type": state_type, "name": state_name, "message": message}
    tags = [job_tag(job_dir.name), directory_tag(job_dir)]
    api.state.flow_runs.insert(
        0, {"id": run_id, "tags": tags, "state_name": state_name, "state": state, "run_count": 1}
    )
    return run_id
