"""A step's per-file work (``map_files``): a bounded ``file_task`` run per file.

See docs/development.md#per-file-work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from config.runtime import prefect_api_url
from config.settings import TaskRunnerSettings
from tasks.job.contract import (
    DataFile,
    StepInput,
    commit_each,
    data_files,
    files_gone,
    settings_of,
    stored_in_job,
)
from tasks.core.errors import DupflowError
from tasks.streams.fanout import outcome_of, results_or_raise, run_bounded

if TYPE_CHECKING:
    from prefect_dask.task_runners import DaskTaskRunner

R = TypeVar("R")

DASK_CONNECT_TIMEOUT = "10s"


def map_files(
    file_task: Callable[..., R], arguments: Sequence[tuple[Any, ...]], workers: int
) -> list[R | Exception]:
    """Call ``file_task(*args)`` for every tuple of ``arguments``; list the outcomes.

    Note: each tuple starts with the ``StepInput`` (``for_file_tasks``); an outcome is a result or
    an exception. On the Dask runner ``file_runner`` entered, else at most ``workers`` at once
    in-process.
    """
    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    context = FlowRunContext.get()
    on_dask = context is not None and not isinstance(context.task_runner, ThreadPoolTaskRunner)
    dask_task: Any = file_task  # a Task there
    if on_dask and workers > 1:  # every file submitted at once; Dask runs one per worker thread
        futures = [stored_in_job(dask_task, args[0]).submit(*args) for args in arguments]
        return [
            outcome_of(kept_result, future, file_task, args)
            for future, args in zip(futures, arguments, strict=True)
        ]
    failures: list[Exception] = []

    def call(args: tuple[Any, ...]) -> R:
        if failures:  # no file starts after one failed
            raise failures[0]
        try:
            if on_dask:
                kept: R = kept_result(
                    stored_in_job(dask_task, args[0]).submit(*args), file_task, args
                )
                return kept
            return commit_each(file_task, *args)
        except Exception as exc:
            failures.append(exc)
            raise

    # in the calling thread, so Ctrl+C or SIGTERM stops it where it is (a daemon thread would go on)
    if workers <= 1:
        return [outcome_of(call, args) for args in arguments]
    return run_bounded([functools.partial(call, args) for args in arguments], workers)


class FileToDo(NamedTuple):
    """A file of a step's batches: name, size, the call's arguments, its input file.

    Note: a size of None is unknown: a batch of its own. ``file``, the step's input file it reads,
    is in its batch's cache key.
    """

    name: str
    size: int | None
    args: tuple[Any, ...]
    file: DataFile | None = None


def map_batches(
    batch_task: Callable[..., list[R]], step: StepInput, files: Sequence[FileToDo]
) -> list[R]:
    """Each file's result of the step's ``batch_task`` over batches of ``files``.

    Note: in order; or, once every batch has ended (each finished one kept), the first failure
    raised.
    Why: one batch at a time, on Dask too: a step sending its files through a service keeps it
    busy with a file's own requests (``max_concurrent_requests`` is the step's).
    """
    return [
        result
        for batch in results_or_raise(run_batches(batch_task, step, files, 1))
        for result in batch
    ]


def run_batches(
    batch_task: Callable[..., R],
    step: StepInput,
    files: Sequence[FileToDo],
    workers: int,
    *shared: Any,
) -> list[R | Exception]:
    """Each batch's outcome of ``batch_task(step, label, [args per file], *shared)``.

    Note: over ``files`` cut by ``pipeline.file_batches``, through ``map_files``: at most
    ``workers`` batches at once, each cached as a whole: keyed by its own files
    (``FileToDo.file``), so a changed file redoes its batch alone.
    """
    limits = settings_of(step).pipeline.file_batches
    batches = file_batches([file.size for file in files], limits.max_files, limits.max_bytes)
    arguments = [
        (
            step.for_file_tasks([f.file for f in batch if f.file]),
            batch_label([f.name for f in batch]),
            [f.args for f in batch],
            *shared,
        )
        for batch in ([files[i] for i in cut] for cut in batches)
    ]
    return map_files(batch_task, arguments, workers)


def file_batches(sizes: Sequence[int | None], max_files: int, max_bytes: int) -> list[range]:
    """Cut consecutive files into batches of at most ``max_files`` and ``max_bytes``.

    Note: a file of ``max_bytes`` or more, or of an unknown size, goes alone. The same sizes give
    the same batches (and so the same cache keys).
    """
    batches: list[range] = []
    start, total, closed = 0, 0, False
    for index, size in enumerate(sizes):
        alone = size is None or size >= max_bytes
        if index > start and (
            closed or alone or index - start >= max_files or total + (size or 0) > max_bytes
        ):
            batches.append(range(start, index))
            start, total = index, 0
        total, closed = total + (size or 0), alone
    if start < len(sizes):
        batches.append(range(start, len(sizes)))
    return batches


def batch_label(names: Sequence[str]) -> str:
    """``a.ndjson`` for one file, ``a.ndjson … f.ndjson (6 files)`` for several.

    Note: the run name of their batch.
    """
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)} files)"


def kept_result(future: Any, file_task: Any, args: tuple[Any, ...]) -> Any:
    """A submitted file task's result, made again if cached with its files gone.

    Note: its files must be where this process sees them: a worker not sharing the jobs directory at
    the same path wrote them elsewhere.
    """
    future.wait()
    if files_gone(future.state, args[0].output_dir):
        future = stored_in_job(file_task, args[0], refresh=True).submit(*args)
    result = future.result()
    if missing := [f.name for f in data_files(result) if not f.on_disk_in(args[0].output_dir)]:
        raise DupflowError(
            f"a Dask worker wrote {', '.join(missing)} where this process does not find it "
            f"({args[0].output_dir}): every worker must see the jobs directory at the same path "
            "(a shared file system mounted there); fix the workers' mounts, or set "
            "pipeline.task_runner.kind: in_process, then continue the job"
        )
    return result


@contextmanager
def file_runner(settings: TaskRunnerSettings, log_file: Path) -> Iterator[None]:
    """The task runner of the job's per-file work during one flow run.

    Note: for ``dask``, a ``DaskTaskRunner`` connected at once (a wrong address fails before any
    step) to ``dask_address`` or a local cluster of one-thread workers (their records to
    ``log_file``), entered as the flow run's task runner in a copy of its context, as Prefect's
    engine makes one per run; closed when the block ends, also on failure or interruption.
    """
    if settings.kind != "dask":
        yield
        return
    from prefect.context import FlowRunContext

    flow_run = FlowRunContext.get()
    assert flow_run is not None, "file_runner is entered by a flow run"
    with dask_runner(settings) as runner:
        try:
            runner.client  # noqa: B018 - the property connects (or starts the local cluster)
        except (OSError, TimeoutError) as exc:
            if settings.dask_address:
                raise DupflowError(
                    "pipeline.task_runner.dask_address: no Dask scheduler answers at "
                    f"{settings.dask_address} ({exc}); start it (dask scheduler) or fix the address"
                ) from None
            raise DupflowError(
                "pipeline.task_runner: the local Dask cluster of "
                f"{settings.local_workers} worker(s) did not start ({exc}); lower "
                "pipeline.task_runner.dask_workers or use kind: in_process"
            ) from exc
        if not settings.dask_address:
            from tasks.job.dask_worker_log import WorkerLogToJobLog

            runner.client.register_plugin(WorkerLogToJobLog(str(log_file)))
        with flow_run.model_copy(update={"task_runner": runner}):
            yield


def dask_runner(settings: TaskRunnerSettings) -> DaskTaskRunner:
    from prefect.settings import get_current_settings
    from prefect_dask.task_runners import DaskTaskRunner

    client_kwargs = {"timeout": DASK_CONNECT_TIMEOUT}
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address, client_kwargs=client_kwargs)
    # the local workers report their task runs to it
    api_url = get_current_settings().api.url or prefect_api_url()
    cluster_kwargs = {
        "n_workers": settings.local_workers,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": None,
        "env": {"PREFECT_API_URL": str(api_url)} if api_url else {},
    }
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs, client_kwargs=client_kwargs)
