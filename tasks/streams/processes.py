"""Worker processes for CPU-bound per-file work (JSON parsing, FHIRPath): the one pool a step sends such work to.

Threads do not help there (the GIL), so ``run_in_process(function, *args)`` runs a plain, picklable function in
one of at most ``pool_size()`` worker processes and blocks the calling thread until it is done. The pool is created
on first use (a job that never needs it pays nothing) from a fork server that has imported only ``WORKER_MODULES``
(plain ones: no Prefect), so a worker starts with a fork, not a fresh interpreter, and stays lean. A pool that a
dead worker broke while idle is replaced on the next call.

Shutdown: a cancelled call (its caller's ``stop_if_cancelled`` raised), an interrupt in the waiting thread, or the
interpreter exiting terminates every worker; a worker whose parent dies (kill -9) exits by itself.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import select
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, suppress
from multiprocessing.context import ForkServerContext, ForkServerProcess
from typing import Any, TypeVar

R = TypeVar("R")

MAX_PROCESSES = 8
# What the workers run, imported once in the fork server. One list for every caller: a process has one fork server,
# and it takes its preload list only when it first starts.
WORKER_MODULES = ("tasks.streams.ndjson", "tasks.sof.flatten")
POLL_SECONDS = 0.2
COUNT_WRITE_SECONDS = 0.5

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_main_lock = threading.Lock()


def never_cancelled() -> None:
    """The cancellation check of a call nothing cancels (a worker process: its parent terminates it instead)."""


def uncounted(amount: int) -> None:
    """The progress callback of work nobody follows."""


class SharedCount:
    """A count that work in a worker process adds to (``add``, e.g. lines done) and its caller reads while it runs
    (``read``), through a small file at ``path``: progress that crosses the process boundary without a manager
    process. The worker writes the count (8 bytes, in place) at most every ``COUNT_WRITE_SECONDS``: one monotonic
    comparison per ``add``. Picklable: only the path travels."""

    def __init__(self, path: str):
        self.path = path
        self._count = 0
        self._next_write = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])

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
        """Delete the file (the caller, once the work is over)."""
        with suppress(FileNotFoundError):
            os.unlink(self.path)


def pool_size() -> int:
    """Worker processes: one per core, at most ``MAX_PROCESSES`` (each holds its own interpreter in memory)."""
    return max(1, min(os.cpu_count() or 1, MAX_PROCESSES))


def processes_allowed() -> bool:
    """Worker processes can help: there is more than one core, and this is no daemonic process (a Dask worker,
    which may not have children)."""
    return pool_size() > 1 and not multiprocessing.current_process().daemon


def run_in_process(
    function: Callable[..., R], *args: Any, stop_if_cancelled: Callable[[], None] = never_cancelled
) -> R:
    """``function(*args)`` in a worker process; its result, or the exception it raised.

    The calling thread waits in short slices, calling ``stop_if_cancelled`` after each, so a cancelled caller
    (it raises) or an interrupt stops the wait at once: the pool is then terminated (a running worker cannot be
    stopped any other way).
    """
    pool, future = _submit(function, args)
    try:
        while True:
            try:
                return future.result(timeout=POLL_SECONDS)
            except FutureTimeout:
                stop_if_cancelled()
    except BrokenProcessPool:
        shutdown_pool(pool)
        raise
    except BaseException:
        if not future.done():
            shutdown_pool(pool)
        raise


def start_workers() -> None:
    """Start every worker process in the background: their start-up (the fork server importing the engine, then a
    fork per worker; a submit waits for it) overlaps the caller's own preparation of the work."""

    def spawn() -> None:
        with suppress(Exception):  # best effort: a pool that cannot start says so when the work is submitted
            for _ in range(pool_size()):
                _submit(never_cancelled, ())

    threading.Thread(target=spawn, name="dupflow-start-workers", daemon=True).start()


def shutdown_pool(only: ProcessPoolExecutor | None = None) -> None:
    """Terminate every worker process now (running calls fail with ``BrokenProcessPool``); a later call starts
    a new pool. With ``only``, nothing happens unless that pool is still the current one (a call that saw its
    pool break must not stop the pool another thread has started since)."""
    global _pool
    with _lock:
        if only is not None and _pool is not only:
            return
        pool, _pool = _pool, None
    if pool is None:
        return
    # ProcessPoolExecutor has no public way to stop a running worker before Python 3.14 (terminate_workers).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)


def worker_pids() -> list[int]:
    """The pids of the live worker processes (for tests and benchmarks that measure them)."""
    with _lock:
        pool = _pool
    processes = (getattr(pool, "_processes", None) or {}).values() if pool else ()
    return [process.pid for process in processes if process.pid is not None and process.is_alive()]


def _submit(function: Callable[..., R], args: tuple) -> tuple[ProcessPoolExecutor, Future[R]]:
    pool = _current_pool()
    try:
        return pool, pool.submit(function, *args)
    except BrokenProcessPool:  # a worker died while the pool was idle (the OOM killer, a kill): a new pool
        shutdown_pool(only=pool)
        pool = _current_pool()
        return pool, pool.submit(function, *args)


def _current_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            context = _LeanForkServerContext()
            context.set_forkserver_preload([__name__, *WORKER_MODULES])
            _pool = ProcessPoolExecutor(
                pool_size(), mp_context=context, initializer=_exit_with_parent, initargs=(os.getpid(),)
            )
        return _pool


atexit.register(shutdown_pool)


# --- lean workers -------------------------------------------------------------------------------------------------


class _LeanProcess(ForkServerProcess):
    """A worker that does not import the parent's ``__main__``.

    multiprocessing re-imports the parent's main module in every child so that functions defined there can be
    unpickled; ours (``flows.run``, a benchmark, a Prefect worker) would pull in Prefect and the whole command line.
    The functions run here live in importable modules, so the main module is hidden while a worker is launched.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Daemonic: a parent that is itself a multiprocessing child (a benchmark's worker, say) terminates the pool
        # on exit; it would otherwise wait for workers that wait for work. Workers never start children.
        self.daemon = True

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - the multiprocessing hook's name
        with _main_hidden():
            return ForkServerProcess._Popen(process_obj)


class _LeanForkServerContext(ForkServerContext):
    Process = _LeanProcess


@contextmanager
def _main_hidden() -> Iterator[None]:
    with _main_lock:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


def _exit_with_parent(parent: int) -> None:
    """In a worker: a daemon thread that ends the process as soon as the process that made the pool is gone."""
    threading.Thread(target=_wait_for_exit, args=(parent,), daemon=True, name="exit-with-parent").start()


def _wait_for_exit(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)
    except OSError:  # already gone
        os._exit(1)
    except AttributeError:  # no pidfd (not Linux): poll
        while _alive(pid):
            time.sleep(0.5)
    else:
        select.select([handle], [], [])
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
