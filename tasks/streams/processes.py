"""Worker processes for CPU-bound per-file work (the GIL).

See docs/development.md#streams.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

    from loky import ProcessPoolExecutor

R = TypeVar("R")

MAX_PROCESSES = 8
TRACKER_WARNING = "ignore:resource_tracker:UserWarning"
"""For loky's resource tracker, which takes ``sys.warnoptions`` as its -W flags: a job process ended
at once leaves the pool's semaphores to it, which warns of "leaked semlock objects" in two lines of
400 characters."""
POLL_SECONDS = 0.2
COUNT_WRITE_SECONDS = 0.5

_current: ContextVar[WorkerPool | None] = ContextVar("dupflow_worker_pool", default=None)


def never_cancelled() -> None:
    """Do nothing: the cancellation check of a call nothing cancels.

    Note: in a worker process, its parent terminates it instead.
    """


CancelCheck = Callable[[], None]
"""Raises when the work is to stop (a cancelled run); ``never_cancelled`` never does."""

CountCallback = Callable[[int], None]
"""Told each amount of work as it is done (bytes, resources): a progress count's callback."""


def uncounted(amount: int) -> None:
    """The progress callback of work nobody follows."""


@dataclass
class SharedCount:
    """A count a worker process adds to and its caller reads, through a small file.

    Why: no manager process. Written at most every ``COUNT_WRITE_SECONDS``.
    """

    path: str
    _count: int = 0
    _next_write: float = 0.0

    def add(self, amount: int) -> None:
        self._count += amount
        if (now := time.monotonic()) >= self._next_write:
            self._next_write = now + COUNT_WRITE_SECONDS
            handle = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(handle, self._count.to_bytes(8, "little"), 0)
            finally:
                os.close(handle)

    def read(self) -> int:
        """The count last written (0 before the first write)."""
        try:
            with open(self.path, "rb") as written:
                return int.from_bytes(written.read(8), "little")
        except FileNotFoundError:
            return 0

    def remove(self) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path)


def pool_size() -> int:
    """Return the pool size: one worker per core, at most ``MAX_PROCESSES``.

    Why: each worker holds its own interpreter in memory.
    """
    return min(os.cpu_count() or 1, MAX_PROCESSES)


def processes_allowed() -> bool:
    """Tell whether worker processes may run: several cores, and no daemon process.

    Why: a daemonic process (a Dask worker) may not have children.
    """
    return pool_size() > 1 and not multiprocessing.current_process().daemon


class WorkerPool:
    """loky's executor, made by the first ``submit``.

    Why: a step that runs nothing in a worker never imports loky nor starts its resource tracker
    (about 50 ms and a process).
    """

    def __init__(self, size: int, preload: tuple[str, ...]):
        self.size, self.preload = size, preload
        self.executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._killed = False

    def submit(self, function: Callable[..., R], *args: Any) -> Future[R]:
        with self._lock:
            if self.executor is None:
                if self._closed:
                    raise RuntimeError("the worker pool is closed: its step has ended")
                from loky import ProcessPoolExecutor

                if TRACKER_WARNING not in sys.warnoptions:  # before loky starts its tracker
                    sys.warnoptions.append(TRACKER_WARNING)
                initargs = (os.getpid(), self.preload)
                self.executor = ProcessPoolExecutor(
                    self.size, initializer=_start_worker, initargs=initargs
                )
        future: Future[R] = self.executor.submit(function, *args)
        return future

    def shutdown(self, wait: bool, kill_workers: bool = False) -> None:
        """Close the pool; ``kill_workers``: stop running work at once.

        Why: once killed it stays so: loky takes each call's word, and the graceful close at the
        block's end, made before loky acted on a kill, took the kill back.
        """
        with self._lock:
            self._closed = True
            self._killed = kill_workers = self._killed or kill_workers
            executor = self.executor
        if executor is not None:
            executor.shutdown(wait=wait, kill_workers=kill_workers)


@contextmanager
def worker_pool(*preload: str, size: int | None = None) -> Iterator[WorkerPool]:
    """Give a pool of ``size`` workers, current for the block.

    Note: started by its first work, or at once to import ``preload``; the workers end with the
    block, killed at once when it ends by an exception.
    """
    pool = WorkerPool(size or pool_size(), preload)
    token = _current.set(pool)
    try:
        if preload:
            pool.submit(never_cancelled)  # loky starts every worker on the first submit
        yield pool
    except BaseException:
        pool.shutdown(wait=True, kill_workers=True)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        _current.reset(token)


def start_workers(*modules: str) -> None:
    """Start the open pool's workers now, importing ``modules``.

    Why: work is on its way, and they take half a second.
    """
    if (pool := _current.get()) and pool.executor is None:
        with suppress(RuntimeError):  # closed: nothing to start
            pool.submit(_import_modules, modules)


def run_in_process(
    function: Callable[..., R], *args: Any, stop_if_cancelled: CancelCheck = never_cancelled
) -> R:
    """Run ``function(*args)`` in a worker of the current pool (else of its own)."""
    calls = ProcessCalls(function)
    calls.start(*args)
    return calls.results(stop_if_cancelled)[0]


class ProcessCalls(Generic[R]):
    """Calls of ``function``, each started in the current pool once its arguments come.

    Note: without a pool, ``results`` runs them in one of their own. ``results`` gives their results
    in order or the first exception (``BrokenProcessPool``: a worker died).
    Why: ``results`` waits in short slices calling ``stop_if_cancelled``, so a cancellation stops
    the wait at once and kills the workers (a running worker cannot be stopped any other way).
    """

    def __init__(self, function: Callable[..., R]):
        self._function = function
        self._pool = _current.get()
        self._waiting: list[tuple[object, ...]] = []  # arguments, without a pool
        self._futures: list[Future[R]] = []

    def start(self, *args: Any) -> None:
        if self._pool is None:
            self._waiting.append(args)
        else:
            self._futures.append(self._pool.submit(self._function, *args))

    def results(self, stop_if_cancelled: CancelCheck) -> list[R]:
        if self._pool is None:
            with worker_pool(size=min(len(self._waiting), pool_size())):
                calls = ProcessCalls(self._function)
                for args in self._waiting:
                    calls.start(*args)
                return calls.results(stop_if_cancelled)
        try:
            while running := [future for future in self._futures if not future.done()]:
                wait(running, timeout=POLL_SECONDS)
                stop_if_cancelled()
        except BaseException:
            if not all(future.done() for future in self._futures):
                self._pool.shutdown(wait=False, kill_workers=True)
            raise
        return [future.result() for future in self._futures]

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()


def _start_worker(parent: int, preload: tuple[str, ...]) -> None:
    """In a worker: start a thread that ends the process with the pool's parent.

    Why: loky's worker would wait for work forever.
    """
    threading.Thread(
        target=_wait_for_exit, args=(parent,), daemon=True, name="exit-with-parent"
    ).start()
    _import_modules(preload)


def _import_modules(modules: tuple[str, ...]) -> None:
    for module in modules:
        importlib.import_module(module)


def _wait_for_exit(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)
    except OSError:  # already gone: exit below
        pass
    except AttributeError:  # no pidfd (not Linux): poll
        with suppress(ProcessLookupError):
            while True:
                os.kill(pid, 0)
                time.sleep(0.5)
    else:
        select.select([handle], [], [])
    os._exit(1)
