"""The Dask runner against the default one on a CPU-bound step: ``python -m tests.benchmarks.bench_dask [MB] [files]``.

The ``local_import`` step task (zstd ``best``) over ``files`` (default 8) seeded, varied TORCH-shaped files of
``MB`` (default 128) in all, in one Prefect run against a temporary API (``prefect_test_harness``): with the
default in-process runner (one thread per core), then with a local Dask cluster of 2 worker processes. Each is
timed twice on fresh job directories; the Dask cluster's start and its workers' first task (imports) are shown
apart. Next to them, the physical anchor on the same bytes: the ``zstd`` command at the same level, one core
(``-T1``, the files one after the other) and every core (``-T0``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.benchmarks.dataset import MB, write_dataset
from tests.benchmarks.runs import best_seconds, fresh, run_command

if TYPE_CHECKING:
    from tasks.job.contract import StepInput

RUNS = 2
DASK_WORKERS = 2


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory(dir=os.environ.get("DUPFLOW_BENCH_DIR")) as tmp:
        root = Path(tmp)
        sources = write_dataset(root / "in", megabytes, files, seed=12)
        total = sum(p.stat().st_size for p in sources) / MB
        print(f"{len(sources)} files, {total:.0f} MB, zstd best, {os.cpu_count()} cores")
        anchors = zstd_anchors(sources, root / "anchor")
        with prefect_test_harness(server_startup_timeout=120):
            os.environ["PREFECT_API_URL"] = prefect_api_url()
            timings = measure(str(root), str(root / "in"))
    default, dask = timings["in_process"], timings["dask"]
    print()
    print(f"{'runner':<56} {'seconds':>8} {'MB/s':>7}")
    rows = [
        (f"in-process ({os.cpu_count()} threads), best of {RUNS}", min(default)),
        (f"Dask, {DASK_WORKERS} worker processes, warm, best of {RUNS - 1}", min(dask[1:])),
        (f"Dask, {DASK_WORKERS} worker processes, first step (cold workers)", dask[0]),
        (f"zstd -{ZSTD_LEVEL} -T1 (one core)", anchors["T1"]),
        (f"zstd -{ZSTD_LEVEL} -T0 (every core)", anchors["T0"]),
    ]
    for label, seconds in rows:
        print(f"{label:<56} {seconds:8.2f} {total / seconds:7.1f}")
    print(f"{'Dask cluster start (not in the step)':<56} {timings['cluster_start']:8.2f}")
    print(f"speed-up of Dask (warm) over the default runner: {min(default) / min(dask[1:]):.2f}x")


# --- the runs ------------------------------------------------------------------------------------------------

ZSTD_LEVEL = 12  # tasks.streams.ndjson.ZSTD_LEVELS["best"]


def prefect_api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _measure(root: str, source: str) -> dict:
    """Inside one flow run: the step with the default runner, then on a 2-process local cluster."""
    from config.settings import TaskRunnerSettings
    from tasks.job.filework import file_runner

    timings: dict = {"in_process": [], "dask": []}
    for run in range(RUNS):
        timings["in_process"].append(timed_import(import_input(Path(root) / f"default-{run}", source)))
    started = time.perf_counter()
    with file_runner(TaskRunnerSettings(kind="dask", dask_workers=DASK_WORKERS), Path(root) / "dask-workers.log"):
        timings["cluster_start"] = time.perf_counter() - started
        for run in range(RUNS):
            timings["dask"].append(timed_import(import_input(Path(root) / f"dask-{run}", source)))
    return timings


IMPORT_OVERRIDES = {"pipeline.enabled_steps": "local_import", "compression.level": "best"}


def import_input(job_dir: Path, source: str, overrides: dict[str, str] | None = None) -> StepInput:
    """The local_import step of a new job in ``job_dir`` on ``source`` (a new job directory: a new cache key, so
    nothing comes Cached). The step's overrides (zstd ``best``, plus ``overrides``) carry its settings to the Dask
    workers, as for a real job."""
    from tasks.job.contract import StepInput

    job_dir.mkdir(parents=True)
    return StepInput(
        job_id=job_dir.name,
        job_dir=str(job_dir),
        position=0,
        step="local_import",
        job_input=source,
        overrides={**IMPORT_OVERRIDES, **(overrides or {})},
    )


def timed_import(step: StepInput) -> float:
    """Run the local_import step task: seconds."""
    from tasks.local_import import local_import

    started = time.perf_counter()
    local_import(step)
    return time.perf_counter() - started


def zstd_anchors(sources: list[Path], out: Path) -> dict[str, float]:
    anchors = {}
    for threads in ("T1", "T0"):
        command = ["zstd", "-q", "-f", f"-{ZSTD_LEVEL}", f"-{threads}", "--output-dir-flat", str(out)]
        command += map(str, sources)
        anchors[threads] = best_seconds(lambda command=command: run_command(command), RUNS, fresh(out))
    shutil.rmtree(out, ignore_errors=True)
    return anchors


def _flow():
    from prefect import flow

    return flow(_measure, name="bench-dask", persist_result=False)


if __name__ == "__main__":
    measure = _flow()
    main()
