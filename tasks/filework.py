"""Per-file work of a step: one ``file_task`` run per file (or batch), bounded, each committed as it finishes.

Every step fans its per-file work out through ``map_files``, so where that work runs is decided in one place:
threads of the flow's process (the default), or, while ``file_runner`` holds a Dask runner for the job
(``pipeline.task_runner.kind: dask``), one task run per file on the Dask cluster's worker processes. There each
file task is a top-level transaction of its own, so its result is committed in the job directory when it
finishes, as ``commit_each`` does in-process: a killed run keeps every finished file either way.

No file starts after one has failed (in-process): the first failure is every unstarted file's outcome, so a
caller keeps every file that finished and raises the first failure with ``tasks.fanout.results_or_raise`` (a
service that is down is not retried once per file). On Dask every submitted file runs to its end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from config.runtime import prefect_api_url
from config.settings import TaskRunnerSettings
from tasks.contract import StepInput, commit_each
from tasks.errors import DupflowError
from tasks.fanout import run_bounded

if TYPE_CHECKING:
    from prefect_dask import DaskTaskRunner

R = TypeVar("R")

DASK_CONNECT_TIMEOUT = "10s"

_runners: dict[str, DaskTaskRunner] = {}
_runners_lock = threading.Lock()


class TaskRunnerError(DupflowError):
    """The configured Dask cluster cannot be used (no scheduler at the address, a local cluster that fails)."""


def map_files(file_task: Callable[..., R], arguments: Sequence[tuple[Any, ...]], workers: int) -> list[R | Exception]:
    """Run ``file_task(*args)`` for every tuple of ``arguments`` (the first element of each is the ``StepInput``),
    at most ``workers`` at once in-process, or on the job's Dask cluster; each outcome (result or the exception
    raised) in the order of ``arguments``, so a caller keeps every file that finished."""
    runner = runner_for(arguments)
    if runner is not None:
        return map_on_dask(runner, file_task, arguments)
    return map_in_process(file_task, arguments, workers)


def map_in_process(file_task: Callable[..., R], arguments: Sequence[tuple[Any, ...]], workers: int) -> list:
    """One file at a time runs in the calling thread, so Ctrl+C or SIGTERM stops it where it is (a daemon thread
    would go on sending until the process exits); more at once run on ``run_bounded``'s threads."""
    failures: list[Exception] = []

    def call(args: tuple[Any, ...]) -> R:
        if failures:
            raise failures[0]
        try:
            return commit_each(file_task, *args)
        except Exception as exc:
            failures.append(exc)
            raise

    if workers <= 1:
        return [outcome_of(call, args) for args in arguments]
    return run_bounded([lambda args=args: call(args) for args in arguments], workers)


def outcome_of(call: Callable[[tuple[Any, ...]], R], args: tuple[Any, ...]) -> R | Exception:
    try:
        return call(args)
    except Exception as exc:  # kept for the caller, which decides what to raise
        return exc


def map_on_dask(runner: DaskTaskRunner, file_task: Any, arguments: Sequence[tuple[Any, ...]]) -> list:
    """Submit every file task to the cluster at once (Dask runs one per worker thread), then collect in order."""
    from prefect.utilities.callables import get_call_parameters

    futures = [runner.submit(file_task, get_call_parameters(file_task.fn, args, {})) for args in arguments]
    outcomes: list = []
    for future in futures:
        try:
            outcomes.append(future.result())
        except Exception as exc:  # kept for the caller, which decides what to raise
            outcomes.append(exc)
    return outcomes


def runner_for(arguments: Sequence[tuple[Any, ...]]) -> DaskTaskRunner | None:
    if not arguments or not isinstance(arguments[0][0], StepInput):
        return None
    with _runners_lock:
        return _runners.get(arguments[0][0].job_dir)


# --- the runner of one flow run -------------------------------------------------------------------------------


@contextmanager
def file_runner(settings: TaskRunnerSettings, job_dir: Path) -> Iterator[None]:
    """Where ``map_files`` runs the job's per-file work during one flow run (``pipeline.task_runner``).

    ``in_process``: nothing to set up. ``dask``: a ``DaskTaskRunner`` connected at once (a wrong address fails
    the run before any step) to the scheduler at ``dask_address``, or to a local cluster of ``dask_workers``
    worker processes with one thread each; the cluster and its processes are closed when the block ends, also on
    failure or interruption.
    """
    if settings.kind != "dask":
        yield
        return
    runner = dask_runner(settings)
    with runner:
        connect(runner, settings)
        key = str(job_dir)
        with _runners_lock:
            _runners[key] = runner
        try:
            yield
        finally:
            with _runners_lock:
                _runners.pop(key, None)


def dask_runner(settings: TaskRunnerSettings) -> DaskTaskRunner:
    from prefect_dask import DaskTaskRunner

    client_kwargs = {"timeout": DASK_CONNECT_TIMEOUT}
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address, client_kwargs=client_kwargs)
    cluster_kwargs = {
        "n_workers": settings.local_workers,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": None,
        "env": worker_environment(),
    }
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs, client_kwargs=client_kwargs)


def worker_environment() -> dict[str, str]:
    """The Prefect API of this run for the local workers (they report their task runs to it)."""
    from prefect.settings import get_current_settings

    api_url = get_current_settings().api.url or prefect_api_url()
    return {"PREFECT_API_URL": str(api_url)} if api_url else {}


def connect(runner: DaskTaskRunner, settings: TaskRunnerSettings) -> None:
    try:
        runner.client  # noqa: B018 - the property connects (or starts the local cluster)
    except (OSError, TimeoutError) as exc:
        if settings.dask_address:
            raise TaskRunnerError(
                f"pipeline.task_runner.dask_address: no Dask scheduler answers at {settings.dask_address} ({exc}); "
                "start it (dask scheduler) or fix the address"
            ) from None
        raise TaskRunnerError(
            f"pipeline.task_runner: the local Dask cluster of {settings.local_workers} worker(s) did not start "
            f"({exc}); lower pipeline.task_runner.dask_workers or use kind: in_process"
        ) from exc
