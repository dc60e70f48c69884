"""End-to-end time of a tiny job with and without a running local Prefect server, and the process tree's memory.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_startup [--runs 5] [--fresh 1] [--against REV]

Each measurement is ``python -m flows.run start --no-progress`` (the embedded default job on the bundled
sample data) in a fresh child process, in a temporary PREFECT_HOME and jobs directory, without
PREFECT_API_URL or any APP_* variable of the caller:

- fresh home:  no server and no database, as after the README's Quick start (the command starts a server, which
               migrates the new database first), ``--fresh`` runs, each in a new home, in turn with its anchor:
               ``prefect server start`` alone (dupflow's server settings) in a new home until its API answers;
- cold:        no server, migrated database (a stopped or killed server);
- warm:        the server from before still runs (the case every later command is in); the first job
               after the server's start is shown apart. Each warm run is taken in turn with ``import prefect``
               (the floor of any command that runs a flow), and their CPU is printed side by side.

Other anchors on the same machine and interpreter: a bare ``python -c pass`` and ``python -m flows.run list`` (a
command that never imports Prefect). Figures go to stdout: best and median wall-clock and the command's own CPU
time (on a shared machine the CPU figure is the steadier one; the load average is printed too); a job's figures
run to its process's end (the flow run's heartbeat thread joined, the logs sent). Then the memory of the warm case:
the flow process's peak RSS (its own rusage), the server's peak RSS (VmHWM of the server and any child), and their
sum. Last, whether the server kept every flow run and task run of the warm jobs (task runs reach it as events after
the command has exited). The server is stopped at the end.

``--against REV`` (e.g. ``91120ab``) compares instead: the tree of that commit (``git archive``, run with this
checkout's environment) and this tree start the same tiny job in turn, A then B, with the tree's server running
(warm) and stopped (cold), so both see the same machine load; the figures of both and their ratio are printed side by
side. Each tree has a PREFECT_HOME of its own, its server started and stopped by its own code: trees from before the
home's own server (ce43d6f) write the same server record in another form, so in one home each would start a server
beside the other's and leave one running.

The project's own modules are byte-compiled first: these machines set PYTHONDONTWRITEBYTECODE=1, so without
that every command would compile them from source (0.2 s), which no ordinary installation does after its first
run.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from flows.prefect_server import DEFAULT_PORT, HOST, SERVER_DEFAULTS, STARTUP_TIMEOUT, ensure_server, is_healthy
from flows.prefect_server import next_free_port, server_status, stop_server
from flows.server_process import POLL_INTERVAL
from tests.benchmarks.runs import load
from tests.benchmarks.memory import tree_peak_mb

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("config", "flows", "tasks")
RECORDS_TIMEOUT = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of the cold and warm cases")
    parser.add_argument("--fresh", type=int, default=1, help="runs of the fresh-home case and its anchor")
    parser.add_argument("--against", metavar="REV", help="compare with the tree of this commit, run by run")
    args = parser.parse_args()
    os.environ.pop("PREFECT_API_URL", None)  # this process's ensure_server must find the local server too
    compile_tree(REPO_ROOT)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        home = Path(scratch) / "prefect-home"
        env = clean_environment(home, Path(scratch) / "jobs")
        print(f"load average: {load()} on {os.cpu_count()} CPUs")
        try:
            if args.against:
                compare(env, home, args.runs, args.against, Path(scratch) / "baseline")
            else:
                measure_fresh(env, Path(scratch), args.fresh)
                measure(env, home, args.runs)
        finally:
            stop_server(home)
        print(f"load average: {load()}")


def compile_tree(root: Path) -> None:
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


def measure_fresh(env: dict[str, str], scratch: Path, runs: int) -> None:
    """The tiny job on a new home, in turn with ``prefect server start`` alone on a new home until it answers."""
    job, server = [], []
    for number in range(runs):
        server.append(server_alone(env | {"PREFECT_HOME": str(scratch / f"server-home-{number}")}))
        fresh = scratch / f"fresh-home-{number}"
        try:
            job.append(timed(cli("start", "--no-progress"), env | {"PREFECT_HOME": str(fresh)}))
        finally:
            stop_server(fresh)
    report("fresh home: tiny job", job)
    report("fresh home: server alone", server)
    print(f"fresh home: job / server alone = {ratios(job, server, WALL)} wall", flush=True)


def server_alone(env: dict[str, str]) -> tuple[float, float, float]:
    """``prefect server start`` in a new home, as dupflow starts it, until its API answers: seconds, CPU, MB."""
    port = next_free_port(DEFAULT_PORT)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
    env = env | SERVER_DEFAULTS | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not is_healthy(f"http://{HOST}:{port}/api"):
            if process.poll() is not None or time.perf_counter() - started > STARTUP_TIMEOUT:
                raise SystemExit(f"prefect server start on port {port} did not come up ({process.returncode})")
            time.sleep(POLL_INTERVAL)
        seconds = time.perf_counter() - started
        cpu = process_cpu_seconds(process.pid)
    finally:
        process.terminate()
        _, _, usage = os.wait4(process.pid, 0)
    return seconds, cpu, usage.ru_maxrss / 1024


def process_cpu_seconds(pid: int) -> float:
    """The CPU seconds of a running process (and of its waited-for children) so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measure(env: dict[str, str], home: Path, runs: int) -> None:
    report("anchor: python -c pass", [timed([sys.executable, "-c", "pass"], env) for _ in range(runs)])
    report("anchor: flows.run list", [timed(cli("list"), env) for _ in range(runs)])

    cold = []
    for _ in range(runs):
        stop_server(home)
        cold.append(timed(cli("start", "--no-progress"), env))
    report("cold (server stopped)", cold)

    api_url = ensure_server(home)
    before = run_counts(api_url)
    # A server answers its first job's requests slower (its request handlers import lazily) and is still busy
    # with its own start-up: that job is shown on its own, the warm figures are the jobs after it.
    first = timed(cli("start", "--no-progress"), env)
    report("warm, server's first job", [first])
    anchor, warm = [], []
    for _ in range(runs):  # in turn: both see the same load
        anchor.append(timed([sys.executable, "-c", "import prefect"], env))
        warm.append(timed(cli("start", "--no-progress"), env))
    report("anchor: import prefect", anchor)
    report("warm (server running)", warm)
    print(f"warm / import prefect = {ratios(warm, anchor, CPU)} CPU, {ratios(warm, anchor, WALL)} wall", flush=True)
    report_memory(home, max(peak for _, _, peak in [first, *warm]))
    report_records(api_url, before, runs + 1)


WALL, CPU = 0, 1


def ratios(ours: list[tuple[float, float, float]], anchor: list[tuple[float, float, float]], column: int) -> str:
    """``ours`` over ``anchor`` in one column (wall or CPU): best over best / median over median."""
    best = min(run[column] for run in ours) / min(run[column] for run in anchor)
    median = statistics.median(run[column] for run in ours) / statistics.median(run[column] for run in anchor)
    return f"{best:.2f} / {median:.2f} (best / median)"


def compare(env: dict[str, str], home: Path, runs: int, revision: str, baseline: Path) -> None:
    """The tree of ``revision`` (A) and this tree (B), run in turn, each on the server of its own home, at one load."""
    baseline.mkdir()
    archive = subprocess.run(["git", "archive", revision], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
    compile_tree(baseline)
    trees = {f"A {revision}": baseline, "B this tree": REPO_ROOT}
    envs = {
        label: env | {"PYTHONPATH": str(tree), "PREFECT_HOME": f"{home}-{label[0]}"} for label, tree in trees.items()
    }
    start = {label: (cli("start", "--no-progress"), envs[label], tree) for label, tree in trees.items()}

    def stop(label: str) -> None:  # exit 1 when no server runs
        subprocess.run(cli("server", "stop"), env=envs[label], cwd=trees[label], capture_output=True)

    try:
        for label in trees:
            timed(*start[label])  # migrates the tree's fresh home; not counted
        cold: dict[str, list] = {label: [] for label in trees}
        for _ in range(runs):
            for label in trees:
                stop(label)
                cold[label].append(timed(*start[label]))
        for label in trees:
            timed(*start[label])  # the server's first job is slower; not counted
        warm: dict[str, list] = {label: [] for label in trees}
        for _ in range(runs):
            for label in trees:
                warm[label].append(timed(*start[label]))
    finally:
        for label in trees:
            stop(label)
    for case, figures in (("cold", cold), ("warm", warm)):
        for label, measured in figures.items():
            report(f"{case}, {label}", measured)
        a, b = figures.values()
        print(f"{case}: B / A = {ratios(b, a, WALL)} wall, {ratios(b, a, CPU)} CPU", flush=True)


def clean_environment(home: Path, jobs_dir: Path) -> dict[str, str]:
    """This environment without PREFECT_API_URL and the caller's APP_* settings, in a scratch home and jobs dir."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    env.pop("PREFECT_API_URL", None)
    return env | {"PREFECT_HOME": str(home), "APP_JOBS_DIR": str(jobs_dir), "PYTHONPATH": str(REPO_ROOT)}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "flows.run", *args]


def timed(command: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> tuple[float, float, float]:
    """Wall-clock seconds, CPU seconds and peak RSS in MB of the command (os.wait4: its rusage and that of the
    processes it waited for, its workers, if any; not a server it starts, which outlives it)."""
    with tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            output.seek(0)
            tail = output.read().decode()[-3000:]
            raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}):\n{tail}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def report(label: str, runs: list[tuple[float, float, float]]) -> None:
    walls, cpu = [wall for wall, _, _ in runs], [cpu for _, cpu, _ in runs]
    each = " ".join(f"{wall:.2f}" for wall in walls)
    print(
        f"{label:<26} best {min(walls):5.2f} s, median {statistics.median(walls):5.2f} s wall, "
        f"{min(cpu):5.2f} / {statistics.median(cpu):5.2f} s CPU   (wall per run: {each})",
        flush=True,
    )


def report_memory(home: Path, flow_mb: float) -> None:
    status = server_status(home) or {}
    server_mb = tree_peak_mb(status["pid"]) if status.get("pid") else 0.0
    print(
        f"peak RSS, warm runs: flow process {flow_mb:.0f} MB + Prefect server {server_mb:.0f} MB "
        f"= {flow_mb + server_mb:.0f} MB",
        flush=True,
    )


def run_counts(api_url: str) -> tuple[int, int]:
    """(flow runs, task runs) the server holds."""
    flow_runs = httpx.post(f"{api_url}/flow_runs/count", json={}, timeout=30).json()
    task_runs = httpx.post(f"{api_url}/task_runs/count", json={}, timeout=30).json()
    return flow_runs, task_runs


def report_records(api_url: str, before: tuple[int, int], jobs: int) -> None:
    """Flow and task runs the warm jobs left on the server, once the task runs (sent as events) stop arriving."""
    deadline, counts = time.monotonic() + RECORDS_TIMEOUT, run_counts(api_url)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        latest = run_counts(api_url)
        if latest == counts:
            break
        counts = latest
    flow_runs, task_runs = counts[0] - before[0], counts[1] - before[1]
    print(f"records of the {jobs} warm jobs on the server: {flow_runs} flow runs, {task_runs} task runs", flush=True)


if __name__ == "__main__":
    main()
