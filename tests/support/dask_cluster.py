"""An external Dask cluster, started as workers on other machines are (docs/operations.md): a ``dask scheduler``
and ``dask worker`` processes from this checkout, each in a session of its own, ended with the block. The workers
inherit this process's environment (``PREFECT_API_URL`` included) with the checkout on ``PYTHONPATH``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_START_SECONDS = 120


@contextmanager
def external_cluster(folder: Path, workers: list[list[str]]) -> Iterator[Path]:
    """A scheduler, and one ``dask worker`` per entry of ``workers`` (each entry a command prefix such as
    ``["taskset", "-c", "0"]``, or ``[]``; 1 process, 1 thread each), whose logs are in ``folder``; the
    scheduler file, once the scheduler wrote it."""
    folder.mkdir(parents=True)
    scheduler_file = folder / "scheduler.json"
    dask = str(Path(sys.executable).parent / "dask")
    with ExitStack() as stack:
        scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        stack.enter_context(process(scheduler + ["--scheduler-file", str(scheduler_file)], folder / "scheduler.log"))
        for number, prefix in enumerate(workers):
            worker = [dask, "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "1", "--nthreads", "1"]
            worker += ["--no-dashboard", "--name", f"{folder.name}-{number}"]
            stack.enter_context(process([*prefix, *worker], folder / f"worker-{number}.log"))
        deadline = time.monotonic() + CLUSTER_START_SECONDS
        while not scheduler_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Dask scheduler within {CLUSTER_START_SECONDS} s; see {folder}")
            time.sleep(0.1)
        yield scheduler_file


@contextmanager
def process(command: list[str], log: Path) -> Iterator[None]:
    """Run ``command`` in a session of its own (its output in ``log``) until the block ends, then end its group."""
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with log.open("wb") as out:
        started = subprocess.Popen(
            command, cwd=REPO_ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield
        finally:
            end_group(started)


def end_group(started: subprocess.Popen) -> None:
    """SIGTERM to the process group ``started`` leads (a worker's nanny and its worker process), SIGKILL after 30 s."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(started.pid, sent)
        except ProcessLookupError:
            return
        try:
            started.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def scheduler_address(scheduler_file: Path, workers: int) -> str:
    """The scheduler's address once ``workers`` workers have joined it."""
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout=CLUSTER_START_SECONDS) as client:
        client.wait_for_workers(workers, timeout=CLUSTER_START_SECONDS)
        return client.scheduler.address
