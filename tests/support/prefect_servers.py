"""Prefect servers started by tests in PREFECT_HOMEs of their own: finding, waiting for and killing their processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from flows.prefect_server import SERVER_COMMAND, runner_of
from flows.server_process import process_runs, process_stopped, terminate

SERVER_TIMEOUT = 240.0


def kill_servers_of(home: Path) -> None:
    for pid in servers_of(home):
        os.killpg(pid, signal.SIGKILL)


def stop_runner_of(home: Path) -> None:
    """Stop the home's runner (``ensure_runner``), where one runs; its server goes on.

    A command run on the shared server's home with ``PREFECT_API_URL`` unset starts it, and it then takes up every
    Scheduled run of the command line's jobs on that server, for the rest of the session."""
    if (runner := runner_of(home)) is not None:
        terminate(runner)


def servers_of(home: Path) -> list[int]:
    """Live ``prefect server start`` processes whose PREFECT_HOME is ``home`` (read from /proc)."""
    return [pid for pid, server_home in servers() if server_home == home.resolve()]


def servers_under(folder: Path) -> list[int]:
    """Live ``prefect server start`` processes whose PREFECT_HOME is ``folder`` or inside it."""
    return [pid for pid, server_home in servers() if server_home.is_relative_to(folder.resolve())]


def servers() -> list[tuple[int, Path]]:
    """Every live ``prefect server start`` process with its PREFECT_HOME (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        homes = [name.removeprefix(b"PREFECT_HOME=") for name in environment if name.startswith(b"PREFECT_HOME=")]
        # The environment first: a kernel thread's command line reads empty, which process_runs reads again
        # and again (tens of ms each, seconds per scan).
        if homes and process_runs(int(entry.name), SERVER_COMMAND):
            found.append((int(entry.name), Path(homes[0].decode(errors="replace"))))
    return found


def wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while process_runs(pid, SERVER_COMMAND):
        assert time.monotonic() < deadline, f"server {pid} still running"
        time.sleep(0.05)


def wait_until_stopped(pid: int, timeout: float = 30.0) -> None:
    """Wait for a SIGSTOP to land: the kernel delivers it when the process is next scheduled (later when busy)."""
    deadline = time.monotonic() + timeout
    while not process_stopped(pid):
        assert time.monotonic() < deadline, f"server {pid} not stopped"
        time.sleep(0.05)
