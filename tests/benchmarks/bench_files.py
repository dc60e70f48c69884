"""A job's cost per file: many small files through ``local_import`` and ``flattening``, next to the floor.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_files [--files 200,1000,3000] [--rounds 3] [--repo DIR] [--against DIR]

A job is the embedded sample job (``config/default.yaml``, the sample CRTDL and lookup file) over N files, each a
copy of the sample's TORCH Bundle (12.7 KB), run as the command line runs it (``flows.run start ... --dir``) against
one local Prefect server started once in a temporary PREFECT_HOME and reused by every job. Per job: its wall time
(the command, start to exit), the flow process's peak RSS (``ru_maxrss``) and peak PSS (its own, and with the worker
processes flattening starts on a large input; sampled every ``PSS_EVERY_SECONDS``), its CPU (its own and its
children's, ``wait4``'s resource usage), the Prefect server's CPU meanwhile (its process tree's, from /proc before
and after the job, the server's work on the job's events included: taken once the task runs stopped arriving; its
idle rate, taken once before the rounds, is printed, and the fit without it), the task runs the server recorded for
the job's flow run, and the time the server takes to answer the run graph the UI loads (``graph-v2``). The floor is
``cat`` of the same files plus orjson parsing their every line (one core; its wall time, which is its CPU). Rounds
take the Ns in turn; each round prints the load average. At the end: min and median per N, and the growth fit (least
squares over every job: wall = a + b N, CPU of command and server = a + b N, peak RSS and PSS = c + d N). ``--repo``
runs the jobs with another checkout's code, with this checkout's Python environment; ``--against`` another
checkout's (the one measured before a change) in the same rounds, each job of one beside the same job of the other.
Job folders are kept until the benchmark ends, as a site keeps its jobs (deleting thousands of files just before the
next job makes ext4 scan the freed inodes for every file that job creates).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.benchmarks.memory import cpu_seconds, pss_mb, tree_pss_mb
from tests.benchmarks.runs import load

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = REPO_ROOT / "config" / "sample-data"
BUNDLE = SAMPLE / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
SETTLE_SECONDS = 60.0
PSS_EVERY_SECONDS = 0.2
IDLE_SECONDS = 20.0
FLOOR = """
import orjson, sys, time
from pathlib import Path
started = time.perf_counter()
for path in sorted(Path(sys.argv[1]).iterdir()):
    for line in path.read_bytes().splitlines():
        orjson.loads(line)
print(time.perf_counter() - started)
"""


@dataclass
class Job:
    files: int
    wall: float
    peak_mb: float
    peak_pss_mb: float
    tree_pss_mb: float
    cpu: float
    server_cpu: float
    task_runs: int
    graph_seconds: float
    graph_nodes: int
    floor: float


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="200,1000,3000", help="the Ns, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose code runs the jobs")
    parser.add_argument("--against", type=Path, help="a checkout whose jobs run beside, in the same rounds")
    args = parser.parse_args()
    counts = [int(n) for n in args.files.split(",")]
    repos = [args.repo, *([args.against] if args.against else [])]
    jobs: dict[Path, list[Job]] = {repo: [] for repo in repos}
    with tempfile.TemporaryDirectory(prefix="bench-files-") as scratch:
        env = job_environment(Path(scratch))
        api, server = start_server(env)
        try:  # the server stops with the benchmark, also when a job fails
            data = {n: write_files(Path(scratch) / f"data-{n}", n) for n in counts}
            idle = idle_cpu_rate(server)
            print(f"{os.cpu_count()} CPUs; server {api}, idle: {1000 * idle:.1f} ms CPU a second", flush=True)
            for round_number in range(1, args.rounds + 1):
                print(f"round {round_number}: load average {load()}", flush=True)
                for n, repo in itertools.product(counts, repos):
                    job = run_job(repo, env, (api, server), data[n])
                    jobs[repo].append(job)
                    print(f"  {repo.name:>10} {describe(job)}", flush=True)
            print(f"load average at the end: {load()}")
        finally:
            subprocess.run([sys.executable, "-m", "flows.run", "server", "stop"], cwd=REPO_ROOT, env=env, check=False)
    for repo in repos:
        print(f"\n{repo}")
        summarize(jobs[repo], counts, idle)


def job_environment(scratch: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("APP_", "PREFECT_"))}
    return {**env, "PREFECT_HOME": str(scratch / "home"), "APP_JOBS_DIR": str(scratch / "jobs")}


def start_server(env: dict[str, str]) -> tuple[str, int]:
    """The local server the jobs share, started as the command line starts it; its API URL and pid."""
    command = [sys.executable, "-m", "flows.run", "server", "start"]
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=300)
    record = json.loads((Path(env["PREFECT_HOME"]) / "dupflow-server.json").read_text())
    return record["url"], record["pid"]


def idle_cpu_rate(server: int) -> float:
    """The server's CPU seconds a second with no job running (its own loops), over ``IDLE_SECONDS``."""
    before = cpu_seconds(server)
    time.sleep(IDLE_SECONDS)
    return (cpu_seconds(server) - before) / IDLE_SECONDS


def write_files(folder: Path, count: int) -> Path:
    folder.mkdir()
    for number in range(count):
        shutil.copyfile(BUNDLE, folder / f"batch-{number:05d}.ndjson")
    return folder


def run_job(repo: Path, env: dict[str, str], server: tuple[str, int], data: Path) -> Job:
    command = [sys.executable, "-m", "flows.run", "start", str(repo / "config" / "default.yaml")]
    command += [str(repo / "config" / "sample-data" / "crtdl.json"), "--dir", str(data), "--no-progress"]
    api, server_cpu = server[0], cpu_seconds(server[1])
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = PssSampler(process.pid)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    peak_pss, tree_pss = sampler.stop()
    stdout, stderr = process.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the job failed:\n{stderr.decode()[-3000:]}")
    job_dir = Path(stdout.decode().split("\n", 1)[0].split(": ", 1)[1])
    tags = {"flow_runs": {"tags": {"all_": [f"job-{job_dir.name}"]}}, "limit": 1}
    flow_run = httpx.post(f"{api}/flow_runs/filter", json=tags).raise_for_status().json()[0]["id"]
    files = sum(1 for _ in data.iterdir())
    task_runs = recorded_task_runs(api, flow_run)
    server_cpu = cpu_seconds(server[1]) - server_cpu
    graph_seconds, nodes = graph_load(api, flow_run)
    cpu, peak = usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
    return Job(
        files, wall, peak, peak_pss, tree_pss, cpu, server_cpu, task_runs, graph_seconds, nodes, floor_seconds(data)
    )


class PssSampler:
    """The peak PSS of a process and of its tree, sampled every ``PSS_EVERY_SECONDS`` until ``stop``."""

    def __init__(self, pid: int):
        self.pid, self.peaks, self.done = pid, (0.0, 0.0), threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.done.wait(PSS_EVERY_SECONDS):
            own, tree = pss_mb(self.pid), tree_pss_mb(self.pid)
            self.peaks = (max(self.peaks[0], own), max(self.peaks[1], tree))

    def stop(self) -> tuple[float, float]:
        self.done.set()
        self.thread.join()
        return self.peaks


def recorded_task_runs(api: str, flow_run: str) -> int:
    """The task runs the server holds for the flow run, once their count stopped changing (they arrive as events)."""
    body = {"task_runs": {"flow_run_id": {"any_": [flow_run]}}}
    deadline, last, count = time.monotonic() + SETTLE_SECONDS, -1, 0
    while time.monotonic() < deadline:
        count = httpx.post(f"{api}/task_runs/count", json=body, timeout=60).json()
        if count == last:
            return count
        last = count
        time.sleep(1.0)
    return count


def graph_load(api: str, flow_run: str) -> tuple[float, int]:
    """Seconds the server takes to answer the flow run's graph (as the UI asks for it), and its nodes."""
    started = time.perf_counter()
    answer = httpx.get(f"{api}/flow_runs/{flow_run}/graph-v2", timeout=300)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return seconds, len(answer.json()["nodes"])


def floor_seconds(data: Path) -> float:
    """``cat`` of the files to /dev/null, plus orjson parsing their every line."""
    started = time.perf_counter()
    subprocess.run(f"find {data} -type f -exec cat {{}} + > /dev/null", shell=True, check=True)  # many: no glob
    cat = time.perf_counter() - started
    parsed = subprocess.run([sys.executable, "-c", FLOOR, str(data)], check=True, capture_output=True, text=True)
    return cat + float(parsed.stdout)


def describe(job: Job) -> str:
    def per_file(seconds: float) -> str:
        return f"{1000 * seconds / job.files:6.2f} ms/file"

    return (
        f"N={job.files:>6}: wall {job.wall:7.1f} s ({per_file(job.wall)}), CPU: command {job.cpu:6.1f} s "
        f"({per_file(job.cpu)}), server {job.server_cpu:6.1f} s ({per_file(job.server_cpu)}); flow peak RSS "
        f"{job.peak_mb:5.0f} MB, PSS {job.peak_pss_mb:5.0f} MB (with its workers {job.tree_pss_mb:5.0f}); "
        f"task runs {job.task_runs:>6}, graph-v2 {job.graph_seconds:6.2f} s ({job.graph_nodes} nodes); "
        f"floor {per_file(job.floor)}"
    )


def summarize(jobs: list[Job], counts: list[int], idle: float) -> None:
    print("per N: min / median over the rounds")
    names = ["wall ms/file", "CPU ms/file", "server ms/file", "peak RSS MB", "peak PSS MB", "task runs", "graph-v2 s"]
    print(f"{'N':>6} " + " ".join(f"{name:>15}" for name in [*names, "floor ms/file"]))
    for n in counts:
        of_n = [job for job in jobs if job.files == n]
        columns = [
            [1000 * j.wall / n for j in of_n],
            [1000 * j.cpu / n for j in of_n],
            [1000 * j.server_cpu / n for j in of_n],
            [j.peak_mb for j in of_n],
            [j.peak_pss_mb for j in of_n],
            [j.task_runs for j in of_n],
            [j.graph_seconds for j in of_n],
            [1000 * j.floor / n for j in of_n],
        ]
        cells = [f"{min(c):7.2f} / {statistics.median(c):6.2f}" for c in columns]
        cells[5] = f"{min(columns[5]):5d} / {statistics.median(columns[5]):5.0f}"
        print(f"{n:>6} " + " ".join(f"{cell:>15}" for cell in cells))
    if len(counts) > 1:
        files = [j.files for j in jobs]
        wall = statistics.linear_regression(files, [j.wall for j in jobs])
        cpu = statistics.linear_regression(files, [j.cpu for j in jobs])
        server = statistics.linear_regression(files, [j.server_cpu for j in jobs])
        both = statistics.linear_regression(files, [j.cpu + j.server_cpu for j in jobs])
        busy = statistics.linear_regression(files, [j.cpu + j.server_cpu - idle * j.wall for j in jobs])
        floor = statistics.linear_regression(files, [j.floor for j in jobs])
        peak = statistics.linear_regression(files, [j.peak_mb for j in jobs])
        pss = statistics.linear_regression(files, [j.peak_pss_mb for j in jobs])
        print(f"growth fit: wall = {wall.intercept:.1f} s + {1000 * wall.slope:.2f} ms x N")
        print(f"  CPU, command = {cpu.intercept:.1f} s + {1000 * cpu.slope:.3f} ms x N; server = ", end="")
        print(f"{server.intercept:.1f} s + {1000 * server.slope:.3f} ms x N; both = {both.intercept:.1f} s ", end="")
        print(f"+ {1000 * both.slope:.3f} ms x N; floor = {1000 * floor.slope:.3f} ms x N")
        print(f"  both without the server's idle CPU over the job's wall: {1000 * busy.slope:.3f} ms x N")
        print(f"  flow peak RSS = {peak.intercept:.0f} MB + {1024 * peak.slope:.2f} KB x N; ", end="")
        print(f"peak PSS = {pss.intercept:.0f} MB + {1024 * pss.slope:.2f} KB x N")


if __name__ == "__main__":
    main()
