"""Bounded, cancellable fan-out: the one way a step works on several files or requests at once, as blocking calls
on threads (``run_bounded``: file downloads, uploads) or as coroutines yielded in input order (``ordered_map``:
service requests on one ``httpx.AsyncClient``, so output files keep the input order while memory stays bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

CANCEL_GRACE_SECONDS = 1.0


class Cancelled(Exception):
    """Raised inside a call (``raise_if_cancelled``) when its fan-out is being cancelled. Control flow, not a failure
    (hence no ``DupflowError``): it unwinds the calls of an interrupted caller, which raises the interrupt instead."""


_cancelled: contextvars.ContextVar[tuple[threading.Event, threading.Lock]] = contextvars.ContextVar("fanout_cancelled")
"""A fan-out's cancel flag, and the lock its caller sets the flag under and its calls create files under."""


def run_bounded(calls: list[Callable[[], R]], workers: int) -> list[R | Exception]:
    """Run ``calls`` on at most ``workers`` daemon threads, each in a copy of the caller's context; each outcome is a
    result or the exception raised. When the caller is interrupted no new call starts, running calls stop at their
    next ``raise_if_cancelled``, and after ``CANCEL_GRACE_SECONDS`` the caller goes on (a stalled call is not waited
    for). The caller's thread waits in short joins, so a signal reaches it at once."""
    with cancel_scope() as cancel:
        context = contextvars.copy_context()
    cancelled = context[_cancelled][0]
    outcomes: list = [None] * len(calls)
    pending = deque(range(len(calls)))  # a deque's appends and pops are thread-safe

    def work() -> None:
        while not cancelled.is_set():
            try:
                index = pending.popleft()
            except IndexError:
                return
            try:
                outcomes[index] = context.copy().run(calls[index])
            except Exception as exc:  # kept for the caller, which decides what to raise
                outcomes[index] = exc

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(calls)))]
    try:
        for thread in threads:  # an interrupt while they start cancels the calls already running too
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except BaseException:
        cancel()  # a call's file is now made before the flag, or not at all (``unless_cancelled``)
        grace_ends = time.monotonic() + CANCEL_GRACE_SECONDS
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join(max(0.0, grace_ends - time.monotonic()))
        raise
    return outcomes


def results_or_raise(outcomes: list[R | Exception]) -> list[R]:
    """The results when every call succeeded; else the first failure is raised (after all calls ended, so the
    caller has kept every file that finished)."""
    if failure := next((outcome for outcome in outcomes if isinstance(outcome, Exception)), None):
        raise failure
    return cast(list[R], outcomes)


@contextlib.contextmanager
def cancel_scope() -> Iterator[Callable[[], None]]:
    """``raise_if_cancelled`` and ``unless_cancelled`` in this block (and in the contexts copied from it) answer to
    the ``cancel`` it yields, which another thread may call: how work that no ``run_bounded`` runs (a file task on
    a Dask worker) is stopped from outside."""
    cancelled, creating = threading.Event(), threading.Lock()

    def cancel() -> None:
        with creating:
            cancelled.set()

    token = _cancelled.set((cancelled, creating))
    try:
        yield cancel
    finally:
        _cancelled.reset(token)


def raise_if_cancelled() -> None:
    """Stop a call of ``run_bounded`` whose fan-out is being cancelled (a no-op outside one)."""
    if (found := _cancelled.get(None)) is not None and found[0].is_set():
        raise Cancelled("the run was interrupted")


@contextlib.contextmanager
def unless_cancelled() -> Iterator[None]:
    """The block (a call making a temporary file) runs only while the call's fan-out is not cancelled, else
    ``Cancelled``; under the lock the caller cancels under. A call stalled past the grace is not waited for, so the
    caller removes its temporary files (``remove_partial_files``): each was made before the cancellation, and none
    is made after it, however late a stalled call gets to make one."""
    if (found := _cancelled.get(None)) is None:
        yield
        return
    _, creating = found
    with creating:
        raise_if_cancelled()
        yield


async def ordered_map(items: Iterable[T], call: Callable[[T], Awaitable[R]], window: int) -> AsyncIterator[tuple[T, R]]:
    """Start ``call(item)`` for each item with at most ``window`` pending; yield ``(item, result)`` in input order.
    The oldest failure propagates; the pending calls are cancelled then, and when the consumer stops or is cancelled."""
    pending: deque[tuple[T, asyncio.Task[R]]] = deque()
    try:
        for item in items:
            pending.append((item, asyncio.ensure_future(call(item))))
            if len(pending) >= window:
                oldest, task = pending.popleft()
                yield oldest, await task
        while pending:
            oldest, task = pending.popleft()
            yield oldest, await task
    finally:
        tasks = [task for _, task in pending]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
