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
    with cancel_scope() as cancel:
        watch = _Watch(flow_run_id, cancel)
        watch.start()
        try:
            yield
        except Cancelled:
            if watch.ended is None:
                raise
            raise DupflowError(
                f"stopped: flow run {flow_run_id} ended ({watch.ended}) while this file task ran "
                "on a Dask worker; its output was not written, and continuing the job does this "
                "file again"
            ) from None
        finally:
            watch.finish.set()


class _Watch(threading.Thread):
    def __init__(self, flow_run_id: UUID, cancel: Callable[[], None]):
        super().__init__(name=f"watch flow run {flow_run_id}", daemon=True)
        self.flow_run_id, self.cancel = flow_run_id, cancel
        self.finish = threading.Event()
        self.ended: str | None = None
        self.attempt: int | None = None  # the run's run count when the watch began

    def run(self) -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            # at once too: the attempt the task belongs to
            while (ended := self.over(client)) is None:
                if self.finish.wait(WATCH_EVERY_SECONDS):
                    return
            self.ended = ended
            log.warning("flow run %s ended (%s): stopping this file task", self.flow_run_id, ended)
            self.cancel()

    def over(self, client: Any) -> str | None:
        """The run's state as ``name: message`` once over or retried, else None."""
        try:
            run = client.read_flow_run(self.flow_run_id)
        except Exception:  # noqa: BLE001 - a server that does not answer stops nothing
            return None
        self.attempt = run.run_count if self.attempt is None else self.attempt
        state = run.state
        if run.run_count != self.attempt or (state is not None and state.is_pending()):
            return "a later attempt of the flow run began: the job was continued"
        if state is None or not (state.is_final() or state.is_cancelling()):
            return None
        return plain_text(f"{state.name}: {state.message}" if state.message else state.name)
