"""Per-file fan-out, home-made against Prefect's own runner: ``python -m tests.benchmarks.bench_fanout``.

The same per-file work, the ``local_import`` step's ``import_file`` task (zstd ``fastest``, each result persisted
in the job directory), over 8 and over 64 seeded TORCH-shaped files of ``MB_PER_FILE`` each, in one flow run
against a temporary API (``prefect_test_harness``), at most one file per core at once:

- ``map_files``: the step modules' fan-out (``run_bounded``'s daemon threads, ``commit_each`` per file);
- ``submit``: ``import_file.submit`` on the flow's ``ThreadPoolTaskRunner(max_workers=cores)``, results collected
  in order;
- ``dask`` (8 files only): ``map_files`` while ``file_runner`` holds a local Dask cluster of one worker process
  per core (warm: the cluster's start and its workers' imports are not counted).

Each is timed ``RUNS`` times on fresh job directories (a new job id: nothing comes back Cached); the best run is
shown with its files per second.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.benchmarks.dataset import write_dataset

RUNS = 3
MB_PER_FILE = 0.5
FILE_COUNTS = (8, 64)


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUPFLOW_BENCH_DIR")) as tmp:
        root = Path(tmp)
        datasets = {
            count: write_dataset(root / f"in-{count}", round(MB_PER_FILE * count), count, seed=21)
            for count in FILE_COUNTS
        }
        with prefect_test_harness(server_startup_timeout=120):
            rows = [
                (count, way, measure(way, root, datasets[count], workers))
                for count in FILE_COUNTS
                for way in ("map_files", "submit")
            ]
            rows.append((FILE_COUNTS[0], "dask", measure_dask(root, datasets[FILE_COUNTS[0]], workers)))
    print(f"\n{workers} cores, {MB_PER_FILE} MB per file, zstd fastest, best of {RUNS}")
    print(f"{'files':>5}  {'fan-out':<44} {'seconds':>8} {'files/s':>8}")
    labels = {
        "map_files": "map_files (run_bounded threads)",
        "submit": f"submit (ThreadPoolTaskRunner({workers}))",
        "dask": f"map_files on Dask ({workers} worker processes, warm)",
    }
    for count, way, seconds in rows:
        label = labels[way]
        print(f"{count:>5}  {label:<44} {seconds:8.2f} {count / seconds:8.1f}")


def measure(way: str, root: Path, sources: list[Path], workers: int) -> float:
    """The best of ``RUNS`` flow runs that import ``sources`` the ``way`` named, each into a fresh job."""
    from prefect import flow
    from prefect.task_runners import ThreadPoolTaskRunner

    @flow(name=f"bench-fanout-{way}", task_runner=ThreadPoolTaskRunner(max_workers=workers))
    def import_all(job_dir: str) -> float:
        arguments = import_arguments(Path(job_dir), sources)
        started = time.perf_counter()
        if way == "map_files":
            from tasks.job.filework import map_files
            from tasks.local_import import import_file

            outcomes = map_files(import_file, arguments, workers)
        else:
            from tasks.local_import import import_file

            futures = [import_file.submit(*args) for args in arguments]
            outcomes = [future.result() for future in futures]
        seconds = time.perf_counter() - started
        assert len(outcomes) == len(sources) and not any(isinstance(o, Exception) for o in outcomes)
        return seconds

    return min(import_all(str(root / "jobs" / uuid.uuid4().hex[:12])) for _ in range(RUNS))


def measure_dask(root: Path, sources: list[Path], workers: int) -> float:
    """The best of ``RUNS`` imports of ``sources`` by ``map_files`` on one local Dask cluster, after a first
    (cold) import that is not counted."""
    from prefect import flow

    from config.settings import TaskRunnerSettings
    from tasks.job.filework import file_runner, map_files
    from tasks.local_import import import_file

    @flow(name="bench-fanout-dask")
    def import_all_on_dask() -> float:
        timings = []
        with file_runner(TaskRunnerSettings(kind="dask", dask_workers=workers), root / "dask-workers.log"):
            for _ in range(RUNS + 1):
                arguments = import_arguments(root / "jobs" / uuid.uuid4().hex[:12], sources)
                started = time.perf_counter()
                outcomes = map_files(import_file, arguments, workers)
                timings.append(time.perf_counter() - started)
                assert not any(isinstance(o, Exception) for o in outcomes)
        return min(timings[1:])

    return import_all_on_dask()


def import_arguments(job_dir: Path, sources: list[Path]) -> list[tuple]:
    """``import_file``'s arguments for every source, as the ``local_import`` step builds them."""
    from tasks.job.contract import StepInput
    from tasks.local_import import file_identity

    job_dir.mkdir(parents=True)
    step = StepInput(
        job_id=job_dir.name,
        job_dir=str(job_dir),
        position=0,
        step="local_import",
        overrides={"pipeline.enabled_steps": "local_import", "compression.level": "fastest"},
    )
    return [(step, str(path), f"{path.stem}.ndjson.zst", file_identity(path)) for path in sources]


if __name__ == "__main__":
    sys.exit(main())
