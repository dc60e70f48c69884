"""Dask scale-out, one core standing in for one machine: ``python -m tests.benchmarks.bench_dask_scaling
[MB] [files] [rounds]``.

Two external Dask clusters (``dask scheduler`` plus ``dask worker`` processes, 1 thread each, started under
``taskset -c N``), used as a job uses one: ``pipeline.task_runner: {kind: dask, dask_address: ...}``. Cluster A
has 1 worker pinned to the first core, cluster B 2 workers each pinned to its own core; each worker's affinity is
read on the worker (``client.run``) and printed. The ``local_import`` step task (zstd ``best``) over ``files``
(default 8) seeded, varied TORCH-shaped files of ``MB`` (default 512) in all runs in one Prefect run against a
temporary API (``prefect_test_harness``): once on each cluster to warm the workers (untimed), then ``rounds``
(default 3) interleaved rounds A, B, A, B, ... on new job directories. Every run's imported files must be the same
bytes (sha256). In each round too, what the hardware gives: ``zstd -12 -T1`` over every file one after the other
on one core, against the two halves in parallel, each half on its own core.

The figure is dupflow's speed-up (A's seconds over B's) over the hardware's (zstd on 1 core over
2), best over best and median over median. The hardware's own speed-up tells whether the two cores
were the benchmark's: where either is under ``MIN_HARDWARE_SPEED_UP`` (1.5x; about 1.85x on a quiet
machine) they were shared with other work, and the benchmark prints its timings but refuses the
ratio (exit status 1). The load average is printed at the start and at the end.

The scheduler, the flow process and the Prefect server are not pinned: with 2 workers they share the workers'
cores, with 1 worker they have the second core to themselves (the comparison leans against B, not for it). The
step's own cost in the flow process (its task run, progress artifact, result) is the same for A and B; the default
size keeps it small next to the files' work, which is what spreads.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks.bench_dask import ZSTD_LEVEL, import_input, prefect_api_url, timed_import
from tests.benchmarks.dataset import MB, write_dataset
from tests.benchmarks.runs import fresh, load
from tests.support.dask_cluster import CLUSTER_START_SECONDS, external_cluster

CLUSTERS = {"A": 1, "B": 2}  # label: workers, each pinned to its own core
MIN_HARDWARE_SPEED_UP = 1.5  # under it, the cores were shared: no ratio is reported
ONE_CORE, TWO_CORES = "zstd 1 core", "zstd 2 cores"
LABELS = {
    "A": "A: Dask, 1 worker on 1 core",
    "B": "B: Dask, 2 workers, 1 core each",
    ONE_CORE: f"zstd -{ZSTD_LEVEL} -T1, all files, 1 core",
    TWO_CORES: f"zstd -{ZSTD_LEVEL} -T1, 2 halves, 2 cores",
}


@dataclass(frozen=True)
class PinnedCluster:
    """A running external cluster: its scheduler address and, per worker name, the cores it may run on."""

    label: str
    address: str
    affinities: dict[str, list[int]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("megabytes", type=int, nargs="?", default=512, metavar="MB", help="data in all (512)")
    parser.add_argument("files", type=int, nargs="?", default=8, help="files it is split into (8)")
    parser.add_argument("rounds", type=int, nargs="?", default=3, help="interleaved rounds (3)")
    args = parser.parse_args()
    megabytes, files, rounds = args.megabytes, args.files, args.rounds
    cores = usable_cores()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory(dir=os.environ.get("DUPFLOW_BENCH_DIR")) as tmp:
        root = Path(tmp)
        sources = write_dataset(root / "in", megabytes, files, seed=12)
        write_dataset(root / "warm", files, files, seed=13)
        total = sum(p.stat().st_size for p in sources) / MB
        print(f"{len(sources)} files, {total:.0f} MB, zstd best, cores {cores}, {rounds} interleaved rounds")
        print(f"load average at the start: {load()}")
        with prefect_test_harness(server_startup_timeout=CLUSTER_START_SECONDS):
            os.environ["PREFECT_API_URL"] = prefect_api_url()
            with ExitStack() as stack:
                clusters = [
                    stack.enter_context(pinned_cluster(root / label, label, cores[:workers]))
                    for label, workers in CLUSTERS.items()
                ]
                show_affinities(clusters)
                timings = measure(str(root), [str(p) for p in sources], str(root / "warm"), clusters, cores, rounds)
    print(f"load average at the end: {load()}")
    show_timings(timings, total)
    show_ratio(timings["seconds"])


def usable_cores() -> list[int]:
    """The first two cores this process may run on (a container's cpuset need not start at 0)."""
    if shutil.which("taskset") is None:
        raise SystemExit("taskset (util-linux) is needed to pin the workers")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit(f"this process may run on cores {cores} only; the comparison needs two")
    return cores[:2]


# --- the clusters -----------------------------------------------------------------------------------------------


@contextmanager
def pinned_cluster(folder: Path, label: str, cores: list[int]) -> Iterator[PinnedCluster]:
    """A ``dask scheduler`` and one ``dask worker`` (1 process, 1 thread) under ``taskset -c <core>`` per core,
    as the README starts workers on other machines; each process in a session of its own, ended at exit."""
    with external_cluster(folder, [["taskset", "-c", str(core)] for core in cores]) as scheduler_file:
        address, affinities = worker_affinities(scheduler_file, len(cores))
        yield PinnedCluster(label, address, affinities)


def worker_affinities(scheduler_file: Path, workers: int) -> tuple[str, dict[str, list[int]]]:
    """Wait for the scheduler's workers; the scheduler's address and each worker's cores, read on it."""
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout=CLUSTER_START_SECONDS) as client:
        client.wait_for_workers(workers, timeout=CLUSTER_START_SECONDS)
        found = client.run(worker_cores)
        address = client.scheduler.address
    return address, dict(found.values())


def worker_cores(dask_worker) -> tuple[str, list[int]]:
    """Run on a worker by ``client.run``: its name and the cores its process may run on."""
    return dask_worker.name, sorted(os.sched_getaffinity(0))


def show_affinities(clusters: list[PinnedCluster]) -> None:
    for cluster in clusters:
        print(f"cluster {cluster.label} at {cluster.address}:")
        for name, cores in sorted(cluster.affinities.items()):
            print(f"  worker {name}: sched_getaffinity = {cores}")
        pinned = sorted(core for cores in cluster.affinities.values() for core in cores)
        if any(len(cores) != 1 for cores in cluster.affinities.values()) or len(set(pinned)) != len(pinned):
            raise SystemExit(f"cluster {cluster.label}: the workers are not pinned to one core each")


# --- the runs ---------------------------------------------------------------------------------------------------


def _measure(
    root: str, sources: list[str], warm: str, clusters: list[PinnedCluster], cores: list[int], rounds: int
) -> dict:
    """Inside one flow run: the step once per cluster on a small input (the workers' first task imports dupflow),
    then ``rounds`` rounds, each the step on every cluster in turn and the zstd anchor; each run's seconds (by
    ``LABELS``) and the digests of its files."""
    timings: dict = {"seconds": {label: [] for label in LABELS}, "digests": {}}
    source = str(Path(sources[0]).parent)
    for cluster in clusters:
        import_on(cluster, Path(root) / f"warm-{cluster.label}", warm)
    for run in range(rounds):
        for cluster in clusters:
            job_dir = Path(root) / f"{cluster.label}-{run}"
            timings["seconds"][cluster.label].append(import_on(cluster, job_dir, source))
            timings["digests"][job_dir.name] = imported_digests(job_dir)
        for label, seconds in zstd_anchor([Path(p) for p in sources], Path(root) / "anchor", cores).items():
            timings["seconds"][label].append(seconds)
    return timings


def import_on(cluster: PinnedCluster, job_dir: Path, source: str) -> float:
    """The local_import step of a new job on ``cluster``, chosen the way a job chooses it (the step's
    ``pipeline.task_runner`` settings, entered by ``file_runner`` as the flow does): seconds of the step alone."""
    from tasks.job.contract import settings_of
    from tasks.job.filework import file_runner

    runner = {"pipeline.task_runner.kind": "dask", "pipeline.task_runner.dask_address": cluster.address}
    step = import_input(job_dir, source, runner)
    with file_runner(settings_of(step).pipeline.task_runner, job_dir / "job.log"):
        return timed_import(step)


def imported_digests(job_dir: Path) -> dict[str, str]:
    """sha256 of every file the step wrote into ``import/``, by name."""
    found = sorted((job_dir / "import").iterdir())
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in found}


def zstd_anchor(sources: list[Path], out: Path, cores: list[int]) -> dict[str, float]:
    """``zstd -T1`` over every file on one core, then the two halves at once, each on its own core: seconds."""
    halves = [sources[0::2], sources[1::2]]
    clear = fresh(out)
    clear()
    anchor = {ONE_CORE: pinned_zstd([(cores[0], sources)], out)}
    clear()
    anchor[TWO_CORES] = pinned_zstd(list(zip(cores, halves, strict=True)), out)
    shutil.rmtree(out)
    return anchor


def pinned_zstd(work: list[tuple[int, list[Path]]], out: Path) -> float:
    """One ``taskset -c <core> zstd -T1`` per (core, files), all started at once: seconds until the last ends."""
    started = time.perf_counter()
    running = [
        subprocess.Popen(
            ["taskset", "-c", str(core), "zstd", "-q", "-f", f"-{ZSTD_LEVEL}", "-T1", "--output-dir-flat", str(out)]
            + [str(path) for path in files]
        )
        for core, files in work
    ]
    if any(command.wait() != 0 for command in running):
        raise SystemExit("zstd failed")
    return time.perf_counter() - started


# --- the report -------------------------------------------------------------------------------------------------


def show_timings(timings: dict, total: float) -> None:
    digests = list(timings["digests"].values())
    if any(found != digests[0] for found in digests):
        raise SystemExit(f"the imported files differ between runs: {timings['digests']}")
    print(f"imported files identical in all {len(digests)} timed runs ({len(digests[0])} files, sha256)")
    seconds = timings["seconds"]
    print()
    print(f"{'round':<6}" + "".join(f"{label + ' (s)':>18}" for label in LABELS) + f"{'A/B':>7}{'zstd':>7}")
    for run, row in enumerate(zip(*seconds.values(), strict=True)):
        figures = dict(zip(LABELS, row, strict=True))
        ratios = figures["A"] / figures["B"], figures[ONE_CORE] / figures[TWO_CORES]
        print(f"{run + 1:<6}" + "".join(f"{figure:18.2f}" for figure in row) + "".join(f"{r:6.2f}x" for r in ratios))
    print()
    print(f"{'seconds':<34} {'best':>7} {'median':>7} {'MB/s':>7}")
    for label, runs in seconds.items():
        print(f"{LABELS[label]:<34} {min(runs):7.2f} {statistics.median(runs):7.2f} {total / min(runs):7.1f}")
    print()
    print(f"speed-up of 2 workers over 1: {shown(speed_up(seconds['A'], seconds['B']))}")
    hardware = shown(hardware_speed_up(seconds))
    print(f"speed-up the hardware gives (zstd, 2 cores over 1): {hardware}")


def show_ratio(seconds: dict[str, list[float]]) -> None:
    """dupflow's speed-up over the hardware's, best over best and median over median; none where
    the hardware's own speed-up shows that the cores were shared (exit status 1)."""
    hardware = hardware_speed_up(seconds)
    if min(hardware) < MIN_HARDWARE_SPEED_UP:
        raise SystemExit(
            f"no ratio: the hardware's own speed-up was {shown(hardware)}, under "
            f"{MIN_HARDWARE_SPEED_UP}x, so the cores were shared with other work; run it again "
            "on a quiet machine"
        )
    ours = speed_up(seconds["A"], seconds["B"])
    best, median = (mine / theirs for mine, theirs in zip(ours, hardware, strict=True))
    print(f"2 workers over 1 against the hardware's speed-up: {best:.2f} best, {median:.2f} median")


def hardware_speed_up(seconds: dict[str, list[float]]) -> tuple[float, float]:
    return speed_up(seconds[ONE_CORE], seconds[TWO_CORES])


def speed_up(before: list[float], after: list[float]) -> tuple[float, float]:
    """``before`` over ``after``: best over best, median over median."""
    return min(before) / min(after), statistics.median(before) / statistics.median(after)


def shown(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.2f}x best, {pair[1]:.2f}x median"


def _flow():
    from prefect import flow

    return flow(_measure, name="bench-dask-scaling", persist_result=False)


if __name__ == "__main__":
    measure = _flow()
    main()
