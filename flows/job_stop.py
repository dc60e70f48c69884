"""What stops a job's run mid-step: a Cancel or Suspend on the server, a signal.

See docs/operations.md (Prefect's controls) for what each one leaves behind.
"""

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect._internal.observers import FlowRunCancellingObserver
from prefect._flow_run_suspension import FlowRunSuspensionRequest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.context import FlowRunContext
from prefect.exceptions import Abort, TerminationSignal
from prefect.client.schemas.objects import State
from prefect.states import Cancelled

from flows.job_state import GATE_PAUSE_KEY
from tasks.streams.fanout import cancel_scope

log = logging.getLogger("dupflow.stop")
SUSPEND_CHECK_SECONDS = 0.5
CANCEL_POLL_SECONDS = 5.0  # while the server's event stream is out of reach
CANCELLED_ON_SERVER = "cancelled on the Prefect server"
INTERRUPTED = "interrupted (Ctrl+C or SIGTERM)"


@dataclass
class JobStop:
    """Why the run's work was stopped (None: not), and the Suspended state to end in."""

    cancel: Any
    reason: str | None = None
    suspended: State[Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def stop(self, reason: str, suspended: State[Any] | None = None) -> None:
        if self.reason is None:
            self.reason, self.suspended = reason, suspended
            log.warning("stopping the job's work: %s", reason)
        self.cancel()

    def ended(self, exc: BaseException) -> State[Any] | None:
        """The state the run ends in where a stop ended its work with ``exc``; else None.

        Note: the server's Suspended state (the flow raises ``Pause`` with it), or ``Cancelled``,
        never Crashed.
        """
        if isinstance(exc, KeyboardInterrupt | TerminationSignal):
            self.stop(INTERRUPTED)
        # the server refused a task: a cancel came first
        elif isinstance(exc, Abort) and self.reason is None:
            self.stop(CANCELLED_ON_SERVER)
        if self.suspended is not None:
            return self.suspended
        return Cancelled(message=self.reason) if self.reason else None


@contextmanager
def stop_watch(flow_run_id: UUID) -> Iterator[JobStop]:
    """Put the run's work (fan-outs, waits) in a scope a Cancel or Suspend ends.

    Why: Prefect's engine stops a run only at a task's boundary, and a step's task may send for an
    hour; nothing carries out a Cancel of a run no runner supervises.
    Note: Prefect's own observers tell both.
    """
    suspension = FlowRunContext.get()
    with cancel_scope() as cancel:
        stop = JobStop(cancel)
        watch = threading.Thread(
            target=watch_run, args=(flow_run_id, stop, suspension), daemon=True
        )
        watch.start()
        try:
            yield stop
        finally:
            stop.done.set()


def watch_run(flow_run_id: UUID, stop: JobStop, context: FlowRunContext | None) -> None:
    """Watch the run for a Cancel or a suspension request until it ends.

    Note: a Cancel as ``FlowRunCancellingObserver`` tells it.
    """
    request = context.flow_run_suspension_request if context is not None else None

    async def observe() -> None:
        checks: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)
        async with get_client() as client:

            def on_cancelling(flow_run_id: UUID) -> None:  # the watched run's id
                cancelling.remove_in_flight_flow_run_id(flow_run_id)  # armed again for the next
                cancelling.add_in_flight_flow_run_id(flow_run_id)
                check = asyncio.ensure_future(stop_if_cancelling(client, flow_run_id, stop))
                checks.add(check)
                check.add_done_callback(checks.discard)

            cancelling = FlowRunCancellingObserver(
                on_cancelling=on_cancelling, polling_interval=CANCEL_POLL_SECONDS
            )
            async with cancelling:
                cancelling.add_in_flight_flow_run_id(flow_run_id)
                # a Cancel before the stream was up: its event may be in neither the live stream
                # nor (not yet stored) the replay, so the run's state is read once
                await stop_if_cancelling(client, flow_run_id, stop, told=False)
                while not stop.done.is_set() and stop.reason is None:
                    if suspended := suspension_from_the_ui(request):
                        stop.stop("suspended on the Prefect server", suspended)
                    await asyncio.sleep(SUSPEND_CHECK_SECONDS)

    try:
        asyncio.run(observe())
    # a server out of reach stops nothing: the run goes on as without a watch
    except Exception:  # noqa: BLE001
        return


async def stop_if_cancelling(
    client: PrefectClient, run_id: UUID, stop: JobStop, told: bool = True
) -> None:
    """Stop the job if its run is being cancelled now.

    Why: the events stream replays its last minute to a new subscriber, so a Retry or a
    ``continue`` right after a Cancel was told that Cancel again and ended at once.
    Note: ``told``: an event told a Cancel; the run's state unread, the event is taken at its word.
    """
    try:
        state = (await client.read_flow_run(run_id)).state
    except Exception:  # noqa: BLE001 - unread: as ``told`` says
        state = None
    if told if state is None else state.is_cancelling() or state.is_cancelled():
        stop.stop(CANCELLED_ON_SERVER)


def suspension_from_the_ui(request: FlowRunSuspensionRequest | None) -> State[Any] | None:
    """The Suspended state a Suspend in the UI requested, if any.

    Why: Prefect's observer also tells the run's own suspension at a wait step, which the step
    raises itself; taken for a Suspend, it lost the step's "awaiting inspection".
    """
    suspended = request.get_state() if request is not None else None
    if suspended is None or GATE_PAUSE_KEY.fullmatch(suspended.state_details.pause_key or ""):
        return None
    return suspended
