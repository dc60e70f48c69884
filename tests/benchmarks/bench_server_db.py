"""The local Prefect server on SQLite and on PostgreSQL: its start-up time and its memory, at rest and after a job.

Run on demand (not collected by pytest; needs Debian's postgresql package, as ``.ci/run`` installs it):

    uv run --locked python -m tests.benchmarks.bench_server_db [--runs 5]

Each round starts the server dupflow starts (``ensure_server``) in a fresh PREFECT_HOME, in turn on SQLite (the
home's ``prefect.db``) and on a fresh PostgreSQL database (``PREFECT_API_DATABASE_CONNECTION_URL``), both already
migrated by a first start (a migration is a one-off, not what a user waits for each time): the wall time until the
server answers as this home's own, its RSS at rest (summed over its processes) and its peak RSS (VmHWM) after one
tiny job (the embedded sample job) has run against it. Min and median of the rounds, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from flows.prefect_server import ensure_server, read_record, stop_server
from tests.benchmarks.runs import load
from tests.benchmarks.memory import descendants, tree_peak_mb
from tests.support.postgres import running_postgres

REPO_ROOT = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    total = 0.0
    for member in descendants(pid):
        for line in Path(f"/proc/{member}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def one_round(home: Path, database_url: str | None) -> tuple[float, float, float]:
    """Start-up seconds, RSS at rest, peak RSS after a job (MB) of the server of ``home``."""
    os.environ.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
    if database_url:
        os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    started = time.monotonic()
    api_url = ensure_server(home)
    seconds = time.monotonic() - started
    pid = read_record(home).pid
    time.sleep(2.0)  # the server's services run their first loops
    at_rest = rss_mb(pid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APP_")} | {"PREFECT_API_URL": api_url}
    with tempfile.TemporaryDirectory() as jobs:
        env["APP_JOBS_DIR"] = jobs
        subprocess.run(
            [sys.executable, "-m", "flows.run", "start", "--no-progress"],
            cwd=REPO_ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
    peak = tree_peak_mb(pid)
    stop_server(home)
    return seconds, at_rest, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.pop("PREFECT_API_URL", None)
    results: dict[str, list[tuple[float, float, float]]] = {"SQLite": [], "PostgreSQL": []}
    print(f"load average before: {load()}", flush=True)
    with ExitStack() as stack:
        homes = {name: Path(stack.enter_context(tempfile.TemporaryDirectory())) for name in results}
        urls = {"SQLite": None, "PostgreSQL": stack.enter_context(running_postgres())}
        for name in results:  # the first start migrates the database: not counted
            one_round(homes[name], urls[name])
        for _ in range(args.runs):
            for name in results:
                results[name].append(one_round(homes[name], urls[name]))
    print(f"{'database':<12} {'start-up s':>16} {'RSS at rest MB':>16} {'peak after a job MB':>20}   (min / median)")
    for name, rounds in results.items():
        cells = [f"{min(v):.1f} / {statistics.median(v):.1f}" for v in zip(*rounds, strict=True)]
        print(f"{name:<12} {cells[0]:>16} {cells[1]:>16} {cells[2]:>20}")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
