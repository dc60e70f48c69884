"""local_import next to its physical floor on the same bytes: ``python -m tests.benchmarks.bench_local_import``.

    python -m tests.benchmarks.bench_local_import [--mb 1024] [--files 1] [--rounds 5] [--levels off,default]

Data: ``--mb`` MB of seeded, varied TORCH-shaped Bundles (``compare``'s data: every line a different patient) in
``--files`` files, written once. Each round runs, in turn on the same files (the rounds interleave, so each sees the
same machine load):

- ``cp``: the copy (GNU cp, into a fresh folder; nothing synced), and ``cp`` followed by ``sync`` apart (before each
  timed measurement the output folder is emptied and synced, so that none pays for an earlier one's files, and
  twice the data's size of memory is written and freed, so that none pays for memory the host took back:
  ``runs.back_memory``);
- the scan: the fastest validating scan of every line in one process (simdjson's parser over each line, nothing
  else: the least a line check can do);
- for a level: ``zstd -T1 -<level>`` of the files in place of ``cp``;
- ``local_import``: the step's per-file task body (``import_file``, each file its own thread as the step runs them,
  in the step's worker pool, started and ended in the run) in a fresh child process, timed from before its pool.

The floor of a level is its copy (``cp`` or ``zstd -T1``) plus the scan, one after the other; the ratio is
local_import / floor (the issue's goal: at most 1.5). Printed per round, then min and median of each over the
rounds, the load average before and after, and the peak RSS of the child (its own plus its worker processes').
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.dataset import MB, write_dataset
from tests.benchmarks.runs import load, run_command, settled

ZSTD_LEVELS = {"fastest": 1, "default": 5, "better": 9, "best": 12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of data (default 1024)")
    parser.add_argument("--files", type=int, default=1, help="files the data are written in (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--levels", default="off,default", help="off (plain) and zstd level names (off,default)")
    args = parser.parse_args()
    levels = [level.strip() for level in args.levels.split(",")]
    print(f"{os.cpu_count()} cores, load average {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-import-", dir=os.environ.get("DUPFLOW_BENCH_DIR")) as scratch:
        root = Path(scratch)
        files = write_dataset(root / "data", args.mb, args.files, seed=7)
        total = sum(path.stat().st_size for path in files) / MB
        print(f"data: {len(files)} file(s), {total:,.0f} MB of varied TORCH Bundles; {args.rounds} rounds")
        rounds = [one_round(root, files, levels) for _ in range(args.rounds)]
    print(f"\n{'':<28}{'min':>8}{'median':>8}")
    for key in rounds[0]:
        values = [measured[key] for measured in rounds]
        unit = "" if key.startswith("ratio") or key.startswith("peak") else " s"
        print(f"{key + unit:<28}{min(values):8.2f}{statistics.median(values):8.2f}")
    print(f"load average {load()}")


def one_round(root: Path, files: list[Path], levels: list[str]) -> dict[str, float]:
    out = root / "out"
    cp = ["cp", *map(str, files), str(out)]
    settled(out, files)
    measured = {"cp": timed(lambda: run_command(cp))}
    settled(out, files)
    measured["cp + sync"] = timed(lambda: (run_command(cp), os.sync()))
    measured["scan"] = timed(lambda: scan(files))
    for level in levels:
        copy = "cp"
        if level != "off":
            flag = f"-{ZSTD_LEVELS[level]}"
            copy = f"zstd -T1 {flag}"
            command = ["zstd", "-q", "-f", "-T1", flag, "--output-dir-flat", str(settled(out, files))]
            measured[copy] = timed(lambda command=command: run_command([*command, *map(str, files)]))
        seconds, peak = import_in_child(files, settled(out, files), level)
        measured[f"local_import {level}"] = seconds
        measured[f"ratio {level} / {copy} + scan"] = seconds / (measured[copy] + measured["scan"])
        measured[f"ratio {level} / cp + sync"] = seconds / measured["cp + sync"]
        measured[f"peak RSS {level} MB"] = peak
    print("  ".join(f"{key} {value:.2f}" for key, value in measured.items()), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return measured


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def scan(files: list[Path]) -> None:
    """simdjson's parser over every line, nothing else."""
    import simdjson

    parser = simdjson.Parser()
    for path in files:
        with open(path, "rb") as lines:
            for line in lines:
                parser.parse(line)


def import_in_child(files: list[Path], out: Path, level: str) -> tuple[float, float]:
    arguments = f"{[str(path) for path in files]!r}, {str(out)!r}, {level!r}"
    code = f"from tests.benchmarks.bench_local_import import import_once; import_once({arguments})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    seconds, peak = done.stdout.split()
    return float(seconds), float(peak)


def import_once(files: list[str], out: str, level: str) -> None:
    """Child process: the files through ``import_file`` in the step's worker pool, one thread per file as the step
    runs them; prints seconds and the peak RSS of the process and its workers."""
    from tasks.local_import import file_identity, import_file
    from tasks.streams.fanout import results_or_raise, run_bounded
    from tasks.streams.processes import worker_pool
    from tests.benchmarks.memory import tree_peak_mb
    from tests.steps import step_input

    overrides = {"compression.enabled": "false"} if level == "off" else {"compression.level": level}
    step = step_input(Path(out) / "job", "local_import", **overrides)
    suffix = ".ndjson" if level == "off" else ".ndjson.zst"
    calls = [lambda p=path: import_file(step, p, Path(p).stem + suffix, file_identity(Path(p))) for path in files]
    started = time.perf_counter()
    with worker_pool():
        results_or_raise(run_bounded(calls, workers=os.cpu_count() or 1))
        peak = tree_peak_mb(os.getpid())
    print(time.perf_counter() - started, peak)


if __name__ == "__main__":
    main()
