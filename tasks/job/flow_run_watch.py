"""Stop a file task on a Dask worker when the flow run that submitted it ended.

See docs/development.md#file-tasks-on-dask.
"""

import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar
from uuid import UUID

from tasks.core.errors import DupflowError
from tasks.core.readable import plain_text
from tasks.streams.fanout import Cancelled, cancel_scope

R = TypeVar("R")

WATCH_EVERY_SECONDS = 2.0
log = logging.getLogger("dupflow.dask")


def stopped_when_flow_run_ends(function: Callable[..., R]) -> Callable[..., R]:
    """Watch ``function`` (a file task's body) on a Dask worker; elsewhere leave it."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> R:
        flow_run_id = flow_run_on_a_worker()
        with nullcontext() if flow_run_id is None else watching(flow_run_id):
            return function(*args, **kwargs)

    return call


def flow_run_on_a_worker() -> UUID | None:
    """The flow run of this thread's task when it runs on a Dask worker, else None."""
    if "distributed" not in sys.modules:  # a worker has imported it; the flow process need not
        return None
    from distributed import get_worker
    from prefect.context import TaskRunContext

    try:
        get_worker()
    except ValueError:  # not a worker's task thread
        return None
    context = TaskRunContext.get()
    return context.task_run.flow_run_id if context is not None else None


@contextmanager
def watching(flow_run_id: UUID) -> Iterator[None]:
    """Cancel the block's work once the flow run is over.

    Note: its ``Cancelled`` leaves as ``DupflowError``.
    """
    finish, ended = threading.Event(), list[str]()
    with cancel_scope() as cancel:
        threading.Thread(
            target=watch,
            args=(flow_run_id, cancel, finish, ended),
            name=f"watch flow run {flow_run_id}",
            daemon=True,
        ).start()
        try:
            yield
        except Cancelled:
            if not ended:
                raise
            raise DupflowError(
                f"stopped: flow run {flow_run_id} ended ({ended[0]}) while this file task ran "
                "on a Dask worker; its output was not written, and continuing the job does this "
                "file again"
            ) from None
        finally:
            finish.set()


def watch(
    flow_run_id: UUID, cancel: Callable[[], None], finish: threading.Event, ended: list[str]
) -> None:
    """Poll the run's state to ``finish``; when over, put how in ``ended``, ``cancel``."""
    from prefect.client.orchestration import get_client

    attempt: int | None = None  # the run's run count when the watch began

    def over(client: Any) -> str | None:
        """The run's state as ``name: message`` once over or retried, else None."""
        nonlocal attempt
        try:
            run = client.read_flow_run(flow_run_id)
        except Exception:  # noqa: BLE001 - a server that does not answer stops nothing
            return None
        attempt = run.run_count if attempt is None else attempt
        state = run.state
        if run.run_count != attempt or (state is not None and state.is_pending()):
            return "a later attempt of the flow run began: the job was continued"
        if state is None or not (state.is_final() or state.is_cancelling()):
            return None
        return plain_text(f"{state.name}: {state.message}" if state.message else state.name)

    with get_client(sync_client=True) as client:
        # at once too: the attempt the task belongs to
        while (found := over(client)) is None:
            if finish.wait(WATCH_EVERY_SECONDS):
                return
        ended.append(found)
        log.warning("flow run %s ended (%s): stopping this file task", flow_run_id, found)
        cancel()
