"""``compare``'s start-up and memory rows: the tiny job cold and warm, and a large job's process tree beside the
server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.memory import descendants, pss_mb, tree_peak_mb, vm_hwm_mb, vm_rss_mb
from tests.benchmarks.dataset import MB, write_dataset
from tests.benchmarks.runs import REPO_ROOT, Row


def startup_rows(root: Path, runs: int) -> tuple[list[Row], tuple[float, float]]:
    """The cold and warm tiny job next to a command that never imports Prefect; the flow's and server's peak RSS."""
    from flows.prefect_server import ensure_server, server_status, stop_server
    from tests.benchmarks.bench_startup import cli, clean_environment

    home = root / "prefect-home"
    env = clean_environment(home, root / "jobs")
    os.environ.pop("PREFECT_API_URL", None)  # ensure_server here must find the same local server
    anchor = min(timed_tree(cli("list"), env)[0] for _ in range(runs))
    try:
        ensure_server(home)  # migrates a fresh database: not part of any later command's start-up
        stop_server(home)
        cold, _ = timed_tree(cli("start", "--no-progress"), env)
        ensure_server(home)
        warm = [timed_tree(cli("start", "--no-progress"), env) for _ in range(runs)]
        status = server_status(home) or {}
        server_mb = tree_peak_mb(status["pid"]) if status.get("pid") else 0.0
    finally:
        stop_server(home)
    seconds, flow_mb = min(warm)
    return [
        Row("start-up, tiny job, no server", "flows.run start", cold, "flows.run list", anchor, "s", flow_mb, True),
        Row(
            "start-up, tiny job, server runs", "flows.run start", seconds, "flows.run list", anchor, "s", flow_mb, True
        ),
    ], (flow_mb, server_mb)


MEMORY_JOBS = (
    ("compression.enabled=false",),
    ("compression.level=default",),
    ("compression.enabled=false", "services.flattening.formats=csv,parquet"),
)


def memory_lines(root: Path, megabytes: int, files: int, seed: int) -> list[str]:
    """A large job through the command line with the local server running: the command's process tree (flow
    process plus worker processes, each pid's peak summed: an upper bound) and the server's peak, apart."""
    from flows.prefect_server import ensure_server, server_status, stop_server
    from tests.benchmarks.bench_startup import cli, clean_environment

    data = write_dataset(root / "job-data", megabytes, files, seed + 1)
    size = sum(p.stat().st_size for p in data) / MB
    config = root / "memory-job.yaml"
    config.write_text(
        json.dumps(
            {
                "pipeline": {"enabled_steps": ["local_import", "flattening"]},
                "services": {"flattening": {"lookup_path": str(LOOKUP)}},
            }
        )
    )
    home = root / "prefect-home"
    env = clean_environment(home, root / "jobs")
    os.environ.pop("PREFECT_API_URL", None)
    lines = []
    try:
        ensure_server(home)
        server_pid = (server_status(home) or {})["pid"]
        for settings in MEMORY_JOBS:
            options = [part for setting in settings for part in ("--set", setting)]
            command = cli(
                "start",
                str(config),
                str(EXAMPLE / "example-crtdl.json"),
                "--dir",
                str(data[0].parent),
                *options,
                "--no-progress",
            )
            resting = vm_rss_mb(server_pid)
            seconds, tree_mb, flow_mb, together, shared, own = sampled_tree(command, env, server_pid)
            lines.append(
                f"memory, {size:,.0f} MB job (local_import + flattening, {', '.join(settings)}, {seconds:.0f} s): "
                f"command tree {tree_mb:,.0f} MB (flow process {flow_mb:,.0f} MB); reused server "
                f"{tree_peak_mb(server_pid):,.0f} MB (at rest before the job {resting:,.0f} MB); tree and server "
                f"together at most {sum(together.values()):,.0f} MB ("
                + ", ".join(f"{role} {mb:,.0f}" for role, mb in together.items())
                + f"); their proportional set sizes (PSS: shared pages counted once) together at most "
                f"{shared:,.0f} MB, the job's own processes' at most {own:,.0f} MB"
            )
            shutil.rmtree(root / "jobs", ignore_errors=True)
    finally:
        stop_server(home)
    shutil.rmtree(root / "job-data", ignore_errors=True)
    return lines


def sampled_tree(
    command: list[str], env: dict[str, str], server_pid: int
) -> tuple[float, float, float, dict[str, float], float, float]:
    """Seconds, the sum of every tree member's peak RSS (sampled every 0.1 s), the flow process's own peak, the
    sample at which the tree and the server held the most together (their RSS summed), by role, and the most their
    PSS summed at one sample, with and without the server's, in MB. The flow's peak is its own high-water mark,
    sampled: wait4's ru_maxrss would be the largest of it and every child it waited for (the Parquet worker's peak
    was taken for the flow process's)."""
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=output)
        peaks: dict[int, float] = {}
        together: dict[str, float] = {}
        shared = own = 0.0
        while (ended := os.wait4(process.pid, os.WNOHANG))[0] == 0:
            members = descendants(process.pid)
            for pid in members:
                peaks[pid] = max(peaks.get(pid, 0.0), vm_hwm_mb(pid))
            roles = {"server": vm_rss_mb(server_pid)}
            for pid in members:
                role = "flow" if pid == process.pid else process_role(pid)
                roles[role] = roles.get(role, 0.0) + vm_rss_mb(pid)
            together = max(together, roles, key=lambda held: sum(held.values()))
            job = sum(map(pss_mb, members))
            shared, own = max(shared, job + pss_mb(server_pid)), max(own, job)
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(ended[1])
        if process.returncode != 0:
            output.seek(0)
            raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}): {output.read()[-3000:]!r}")
    flow_mb = peaks.pop(process.pid, 0.0)
    return seconds, flow_mb + sum(peaks.values()), flow_mb, together, shared, own


def process_role(pid: int) -> str:
    """What a process under a job's command is, by its command line: a worker, a resource tracker, or another."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    return "workers" if b"LokyProcess" in command else "trackers" if b"resource_tracker" in command else "other"


def timed_tree(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock seconds and the command's peak RSS in MB (os.wait4: the largest of it and of the processes it
    waited for, its workers, if any: a tiny job starts none)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}): {process.stderr.read()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024
