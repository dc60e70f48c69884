"""How the benchmarks take a measurement: in a fresh child process of ``compare``, best of N, on an emptied folder
and memory the host backs, and what the machine was doing meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.memory import tree_peak_mb

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    step: str
    ours: str
    ours_rate: float
    anchor: str
    anchor_rate: float
    unit: str
    peak_mb: float | None = None
    lower_is_better: bool = False

    @property
    def ratio(self) -> float:
        if self.lower_is_better:
            return self.anchor_rate / self.ours_rate
        return self.ours_rate / self.anchor_rate


def in_child(name: str, **arguments) -> dict:
    """Run ``CHILDREN[name](**arguments)`` in a fresh interpreter; its JSON answer plus its peak RSS."""
    command = [sys.executable, "-m", "tests.benchmarks.compare", "--child", name]
    done = subprocess.run(
        command, cwd=REPO_ROOT, input=json.dumps(arguments), capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_seconds(work: Callable[[], object], runs: int, before: Callable[[], object] = lambda: None) -> float:
    seconds = []
    for _ in range(runs):
        before()
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def peak_rss_mb() -> float:
    """This process's peak RSS plus its live children's (the worker processes a large plain file is checked in)."""
    return tree_peak_mb(os.getpid())


def run_command(command: list[str]) -> None:
    """Run a command quietly (curl --parallel draws its progress meter even with -s); fail on its failure."""
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fresh(folder: Path) -> Callable[[], None]:
    def clear() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    return clear


def settled(folder: Path, data: list[Path]) -> Path:
    """``folder`` emptied, and nothing left for the disk to write: what one measurement wrote is neither deleted nor
    written back while the next is timed (the copy of a round's first measurement paid for the last round's files).
    Then twice the size of ``data`` (the measured files: the page cache a measurement fills, and its processes'
    memory) is written and freed (``back_memory``), so that the next measurement does not pay for memory the host took
    back."""
    fresh(folder)()
    os.sync()
    back_memory(2 * sum(path.stat().st_size for path in data))
    return folder


def back_memory(size: int) -> None:
    """Have ``size`` bytes of fresh memory written and freed (by ``dd``, whose buffer is its memory: in this process the
    peak would pass to every child's ``ru_maxrss``). On a virtual machine whose balloon driver reports free pages to
    the host (virtio_balloon's free page reporting, as here), memory left free for about two seconds goes back to the
    host, and the next measurement to fill it pays the host's faults: here a 1 GiB ``cp`` took 1.7 s after 3 s idle,
    0.25 s right after another, and 0.26 s after 3 GiB were written and freed. Whichever measurement came first after
    a pause paid it (the first ``cp`` of every ``bench_local_import`` round: 2.0 s, then 0.3 s with this). At most half
    the memory free now is written: a large ``--mb`` must not make ``dd`` fail."""
    size = min(size, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    run_command(["dd", "if=/dev/zero", "of=/dev/null", f"bs={size}", "count=1", "iflag=fullblock", "status=none"])


def load() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` shows them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())
