"""The worker process pool: results and errors come back, workers stay lean, and none outlives its block or its
parent."""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from loky.process_executor import ShutdownExecutorError

from tasks.streams import processes
from tests.support.processes import worker_pids
from tasks.core.errors import StepError
from tests.conftest import wait_until

pytestmark = pytest.mark.slow  # worker processes

REPO = Path(__file__).resolve().parents[1]
DEADLINE_SECONDS = 30

PARENT_SCRIPT = """
import contextvars, sys, threading, time
from tasks.streams import processes
from tests.support.processes import worker_pids
with processes.worker_pool():
    threading.Thread(target=contextvars.copy_context().run, args=(processes.run_in_process, time.sleep, 600)).start()
    while not worker_pids():
        time.sleep(0.05)
    print(" ".join(map(str, worker_pids())), flush=True)
    time.sleep(600)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet (it runs no code)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def test_a_function_runs_in_another_process_and_its_result_comes_back():
    assert processes.run_in_process(os.getpid) != os.getpid()
    assert processes.run_in_process(sorted, [3, 1, 2]) == [1, 2, 3]


def test_an_error_in_the_worker_is_raised_in_the_caller():
    with pytest.raises(StepError, match="no such thing"):
        processes.run_in_process(raise_step_error, "no such thing")


def raise_step_error(message: str) -> None:
    raise StepError(message)


def test_a_block_that_runs_nothing_in_a_worker_imports_no_loky_and_starts_no_process():
    script = (
        "import multiprocessing, sys\n"
        "from tasks.streams import processes\n"
        "with processes.worker_pool():\n"
        "    pass\n"
        "print('loky' in sys.modules, len(multiprocessing.active_children()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, env=plain_environment(), timeout=60
    )
    assert result.stdout.split() == ["False", "0"], result.stderr


def test_threads_that_call_a_new_pool_at_once_share_its_workers():
    callers = 4 * processes.pool_size()
    start = threading.Barrier(callers)
    pids: list[int] = []

    def call() -> None:
        start.wait(DEADLINE_SECONDS)
        pids.append(processes.run_in_process(os.getpid))

    with processes.worker_pool() as pool:
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(call,)) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE_SECONDS)
        executor = pool.executor
        workers = set(worker_pids())
    assert len(pids) == callers and set(pids) <= workers and len(workers) <= pool.size
    assert executor is not None and pool.executor is executor


def test_a_closed_pool_that_never_ran_anything_refuses_work():
    with processes.worker_pool() as pool:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(abs, -1)
    assert pool.executor is None


def test_workers_do_not_import_the_parents_main_module_nor_prefect():
    modules = processes.run_in_process(eval, "sorted(__import__('sys').modules)")  # the main module here: pytest's
    assert "prefect" not in modules
    assert "pytest" not in modules and "_pytest" not in modules


def test_leaving_the_block_by_an_exception_stops_a_running_worker():
    failure: list[BaseException] = []

    def call() -> None:
        try:
            processes.run_in_process(time.sleep, 600)
        except BaseException as exc:
            failure.append(exc)

    with pytest.raises(KeyboardInterrupt), processes.worker_pool():
        thread = threading.Thread(target=contextvars.copy_context().run, args=(call,), daemon=True)
        thread.start()
        wait_until(worker_pids, "the workers started", DEADLINE_SECONDS)
        pids = worker_pids()
        raise KeyboardInterrupt

    thread.join(DEADLINE_SECONDS)
    assert failure and isinstance(failure[0], ShutdownExecutorError)
    wait_until(lambda: all(gone(pid) for pid in pids), "the workers exited", DEADLINE_SECONDS)


def test_a_kill_is_not_taken_back_by_the_graceful_close_at_the_end_of_the_block():
    """A cancelled wait kills the pool (without waiting) and the block goes on to its graceful close: loky took each
    close's word as the new one, so when its manager thread had not acted on the kill yet (a loaded machine: 1 in 10
    stress runs of test_ndjson's interrupted fan-out) the workers ran their calls to the end."""
    with processes.worker_pool() as pool:
        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(sleep_in_a_worker_or_be_stopped,), daemon=True
        )
        thread.start()
        wait_until(worker_pids, "the workers started", DEADLINE_SECONDS)
        pids = worker_pids()
        pool.shutdown(wait=False, kill_workers=True)  # as ProcessCalls.results does when its wait is cancelled
    wait_until(lambda: all(gone(pid) for pid in pids), "the killed workers exited", DEADLINE_SECONDS)


def sleep_in_a_worker_or_be_stopped() -> None:
    with contextlib.suppress(BrokenProcessPool, ShutdownExecutorError):
        processes.run_in_process(time.sleep, 600)


def test_the_workers_end_with_their_block():
    with processes.worker_pool():
        assert processes.run_in_process(abs, -3) == 3
        pids = worker_pids()
        assert pids
    assert all(gone(pid) for pid in pids) and not worker_pids()


def test_workers_exit_by_themselves_when_their_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT], cwd=REPO, stdout=subprocess.PIPE, text=True, env=plain_environment()
    )
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert workers
        helpers = children_of(parent.pid)  # loky's resource tracker
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    wait_until(
        lambda: all(gone(pid) for pid in workers + helpers), "every worker and helper process exited", DEADLINE_SECONDS
    )


def plain_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("APP_")}


CHILD_SCRIPT = """
import multiprocessing, os, sys
from tasks.streams import processes
def use_the_pool():
    sys.exit(0 if processes.run_in_process(os.getpid) != os.getpid() else 3)

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=use_the_pool)
    child.start()
    child.join()
    print(child.exitcode, flush=True)
"""


def test_a_multiprocessing_child_that_used_the_pool_still_exits():
    """A parent that is itself a multiprocessing child exits once its call is done: the pool ends with the call,
    nothing waits for workers that wait for work (this hung a benchmark)."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=plain_environment(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_a_worker_killed_under_a_call_breaks_it():
    with pytest.raises(BrokenProcessPool), processes.worker_pool():
        threading.Thread(target=kill_workers_once_started, daemon=True).start()
        processes.run_in_process(time.sleep, 600)


def kill_workers_once_started() -> None:
    wait_until(worker_pids, "the workers started", DEADLINE_SECONDS)
    for pid in worker_pids():
        os.kill(pid, signal.SIGKILL)


def test_a_process_ended_at_once_leaves_no_warning_of_its_pools_semaphores_on_the_terminal():
    """A job whose server is lost ends its process at once (``os._exit``); loky's resource tracker then removes the
    pool's semaphores and warned of "leaked semlock objects" in two lines of 400 characters under the job's last
    words. The tracker still cleans up (it exits when done, closing the terminal's stream); it says nothing."""
    script = (
        "import os, time\n"
        "from tasks.streams import processes\n"
        "with processes.worker_pool():\n"
        "    processes.run_in_process(time.sleep, 0)\n"
        "    print('ending at once', flush=True)\n"
        "    os._exit(1)\n"
    )
    result = subprocess.run(  # its output ends when the tracker, the last holder of the stream, has exited
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, env=plain_environment(), timeout=120
    )
    assert result.stdout == "ending at once\n" and result.returncode == 1, result.stderr
    assert result.stderr == ""
