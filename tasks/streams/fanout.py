"""Bounded, cancellable fan-out of blocking calls on threads.

``run_bounded`` serves downloads and uploads; ``ordered_map`` service requests, its results in
input order in bounded memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

CANCEL_GRACE_SECONDS = 1.0


class Cancelled(Exception):
    """Raised in a call whose fan-out is being cancelled: control flow, not a failure.

    Note: no ``DupflowError``; the interrupted caller raises the interrupt instead.
    """


class _Scope:
    """A fan-out's cancel flag, its lock and the scopes opened inside it.

    Note: the caller sets the flag under the lock and its calls create files under it; the inner
    scopes are cancelled with it (a job's whole run holds one: ``flows.job_stop``).
    """

    def __init__(self, outer: _Scope | None) -> None:
        self.cancelled, self.creating = threading.Event(), threading.Lock()
        self.stops: set[Callable[[], None]] = set()  # of the blocking calls running (``stopping``)
        # kept as long as a context holds them
        self.inner: weakref.WeakSet[_Scope] = weakref.WeakSet()
        if outer is not None:
            outer.inner.add(self)
            if outer.cancelled.is_set():
                self.cancel()

    def cancel(self) -> None:
        with self.creating:
            self.cancelled.set()
        for stop in list(self.stops):
            stop()
        for scope in list(self.inner):
            scope.cancel()


_cancelled: contextvars.ContextVar[_Scope] = contextvars.ContextVar("fanout_cancelled")
_OUTSIDE = _Scope(None)
"""The scope of calls outside every fan-out, never cancelled."""


def run_bounded(calls: list[Callable[[], R]], workers: int) -> list[R | Exception]:
    """Run ``calls`` on at most ``workers`` daemon threads; return each outcome.

    Note: an outcome is a result or an exception; the calls run in copies of the caller's context.
    A call's ``BaseException`` (Prefect's ``Pause``) is raised once all ended, none started after.
    Interrupted, no new call starts, running ones stop at their next ``raise_if_cancelled``, and
    after ``CANCEL_GRACE_SECONDS`` the caller goes on.
    Why: it waits in short joins, so a signal reaches it at once.
    """
    with cancel_scope() as cancel:
        context = contextvars.copy_context()
    cancelled = context[_cancelled].cancelled
    outcomes: list[Any] = [None] * len(calls)
    pending = deque(range(len(calls)))  # a deque's appends and pops are thread-safe
    signals: list[BaseException] = []

    def work() -> None:
        while not cancelled.is_set() and not signals:
            try:
                index = pending.popleft()
            except IndexError:
                return
            try:
                outcomes[index] = outcome_of(context.copy().run, calls[index])
            except BaseException as signal:  # Prefect's Pause at a task's end (a Suspend)
                signals.append(signal)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(calls)))]
    try:
        # an interrupt while they start cancels the calls already running too
        for thread in threads:
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
    if signals:  # raised here, as in the calling thread
        raise signals[0]
    return outcomes


def outcome_of(call: Callable[..., R], *args: Any) -> R | Exception:
    try:
        return call(*args)
    except Exception as exc:  # kept for the caller, which decides what to raise
        return exc


def results_or_raise(outcomes: list[R | Exception]) -> list[R]:
    """Return the results if every call succeeded, else raise the first failure.

    Note: raised after all calls ended.
    """
    if failure := next((outcome for outcome in outcomes if isinstance(outcome, Exception)), None):
        raise failure
    return cast(list[R], outcomes)


@contextlib.contextmanager
def cancel_scope() -> Iterator[Callable[[], None]]:
    """Give a ``cancel`` for ``raise_if_cancelled`` and ``unless_cancelled`` to answer.

    Note: in this block (and contexts copied from it), and for any scope around it too; another
    thread may call it (a file task on a Dask worker is stopped so, a job's run by a Cancel on the
    Prefect server).
    """
    scope = _Scope(_cancelled.get(_OUTSIDE))
    token = _cancelled.set(scope)
    try:
        yield scope.cancel
    finally:
        _cancelled.reset(token)


def raise_if_cancelled() -> None:
    """Stop a call of ``run_bounded`` whose fan-out is being cancelled (else a no-op)."""
    if _cancelled.get(_OUTSIDE).cancelled.is_set():
        raise Cancelled("the run was interrupted")


Sleep = Callable[[float], None]
"""A sleep of so many seconds: ``pause``, or a test's."""


def pause(seconds: float) -> None:
    """Sleep; a cancel of the fan-out ends the sleep at once with ``Cancelled``.

    Note: a poll's or a retry's wait.
    """
    _cancelled.get(_OUTSIDE).cancelled.wait(seconds)
    raise_if_cancelled()


@contextlib.contextmanager
def stopping(stop: Callable[[], None]) -> Iterator[None]:
    """In this block a cancel of the fan-out calls ``stop``.

    Why: ``stop`` ends a read blocked on a socket.
    """
    found = _cancelled.get(_OUTSIDE)
    found.stops.add(stop)
    try:
        if found.cancelled.is_set():
            stop()
        yield
    except Exception:
        raise_if_cancelled()  # the block failed as ``stop`` ended it: the cancel is the news
        raise
    finally:
        found.stops.discard(stop)


@contextlib.contextmanager
def unless_cancelled() -> Iterator[None]:
    """Run the block (making a temporary file) only while the fan-out is not cancelled.

    Why: under the lock the caller cancels under: a caller not waiting for a stalled call removes
    the temporary files, and none may come after.
    """
    with _cancelled.get(_OUTSIDE).creating:
        raise_if_cancelled()
        yield


def ordered_map(
    items: Iterable[T], call: Callable[[T], R], workers: int, window: int
) -> Iterator[tuple[T, R]]:
    """``(item, call(item))`` in input order, from calls on ``workers`` threads.

    Note: at most ``window`` calls are pending. The calls run in copies of the caller's context, in
    a cancel scope of their own: when the oldest failure propagates or the consumer stops, the
    calls not started are dropped and those running stop at their next ``pause`` or
    ``raise_if_cancelled``.
    """
    with cancel_scope() as cancel:
        context = contextvars.copy_context()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="ordered-map")
    pending: deque[tuple[T, Future[R]]] = deque()
    try:
        for item in items:
            pending.append((item, pool.submit(context.copy().run, call, item)))
            if len(pending) >= window:
                oldest, future = pending.popleft()
                yield oldest, future.result()
        while pending:
            oldest, future = pending.popleft()
            yield oldest, future.result()
    finally:
        cancel()
        pool.shutdown(wait=False, cancel_futures=True)
