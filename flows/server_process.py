"""The process side of the local server (``flows.prefect_server``), from /proc.

Note: where there is a /proc.
"""

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

STOP_GRACE = 10.0
CMDLINE_READS = 5  # an exiting process's stays empty
# a start or stop waits for the server by this much at most; a refused connection costs ~0.1 ms
POLL_INTERVAL = 0.05


def process_runs(pid: int, words: tuple[str, ...]) -> bool:
    """Whether ``pid`` is alive and its command line holds ``words``, not recycled."""
    if not process_exists(pid):
        return False
    try:
        # a live process's command line was seen to read empty now and then
        for _ in range(CMDLINE_READS):
            if (arguments := Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")) != [b""]:
                break
            time.sleep(0.01)
    except ProcessLookupError:  # it ended between the open and the read of its command line
        return False
    except FileNotFoundError:
        # no /proc (macOS): the pid check above is all there is
        return not Path("/proc/self").exists()
    return all(word.encode() in arguments for word in words)


def process_exists(pid: int) -> bool:
    """Whether ``pid`` exists (an exiting one still holds its port).

    Note: an exited child is reaped first.
    """
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def terminate(pid: int) -> None:
    """SIGTERM the server's process group, SIGKILL after ``STOP_GRACE``; await its end."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + STOP_GRACE
        while process_exists(pid) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        if not process_exists(pid):
            return


def process_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, Ctrl+Z, a debugger; without /proc: False)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
