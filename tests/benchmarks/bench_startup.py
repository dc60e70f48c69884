"""End-to-end time of a tiny job with and without a running local Prefect server.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_startup [--runs 3]

Each measurement is ``python -m flows.run start --no-progress`` (the embedded default job on the bundled
sample data) in a fresh child process, in a temporary PREFECT_HOME and jobs directory, without
PREFECT_API_URL or any APP_* variable of the caller:

- cold, fresh home:  no server and no database (the command starts a server, which migrates first);
- cold:              no server, migrated database (a stopped or killed server);
- warm:              the server from before still runs (the case every later command is in).

Anchors on the same machine and interpreter: a bare ``python -c pass``, ``import prefect`` (the floor of any
command that runs a flow) and ``python -m flows.run list`` (a command that never imports Prefect). Figures go
to stdout, wall-clock and the command's own CPU time (on a shared machine the CPU figure is the steadier
one; the load average is printed too); the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from flows.prefect_server import ensure_server, stop_server

REPO_ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the cold and warm cases")
    runs = parser.parse_args().runs
    os.environ.pop("PREFECT_API_URL", None)  # this process's ensure_server must find the local server too
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        home = Path(scratch) / "prefect-home"
        env = clean_environment(home, Path(scratch) / "jobs")
        print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        try:
            measure(env, home, runs)
        finally:
            stop_server(home)


def measure(env: dict[str, str], home: Path, runs: int) -> None:
    report("anchor: python -c pass", [timed([sys.executable, "-c", "pass"], env) for _ in range(runs)])
    report("anchor: import prefect", [timed([sys.executable, "-c", "import prefect"], env) for _ in range(runs)])
    report("anchor: flows.run list", [timed(cli("list"), env) for _ in range(runs)])

    report("cold, fresh PREFECT_HOME", [timed(cli("start", "--no-progress"), env)])
    cold = []
    for _ in range(runs):
        stop_server(home)
        cold.append(timed(cli("start", "--no-progress"), env))
    report("cold (server stopped)", cold)

    api_url = ensure_server(home)
    before = flow_run_count(api_url)
    report("warm (server running)", [timed(cli("start", "--no-progress"), env) for _ in range(runs)])
    print(f"flow runs recorded by the running server during the warm runs: {flow_run_count(api_url) - before}")


def clean_environment(home: Path, jobs_dir: Path) -> dict[str, str]:
    """This environment without PREFECT_API_URL and the caller's APP_* settings, in a scratch home and jobs dir."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    env.pop("PREFECT_API_URL", None)
    return env | {"PREFECT_HOME": str(home), "APP_JOBS_DIR": str(jobs_dir), "PYTHONPATH": str(REPO_ROOT)}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "flows.run", *args]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock and CPU seconds of the command (CPU of the command's process, not of a server it starts)."""
    cpu_before, start = children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    elapsed, cpu = time.perf_counter() - start, children_cpu() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed, cpu


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def flow_run_count(api_url: str) -> int:
    return httpx.post(f"{api_url}/flow_runs/count", json={}, timeout=30).json()


def report(label: str, runs: list[tuple[float, float]]) -> None:
    wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
    each = " ".join(f"{w:.2f}" for w, _ in runs)
    print(f"{label:<26} median {wall:6.2f} s wall, {cpu:5.2f} s CPU   (wall per run: {each})", flush=True)


if __name__ == "__main__":
    main()
