"""Prefect servers started by tests in PREFECT_HOMEs of their own: finding, waiting for and killing their processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from flows.server_process import process_is_server, process_stopped

SERVER_TIMEOUT = 240.0


def kill_servers_of(home: Path) -> None:
    for pid in servers_of(home):
        os.killpg(pid, signal.SIGKILL)


def servers_of(home: Path) -> list[int]:
    """Live ``prefect server start`` processes whose PREFECT_HOME is ``home`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not process_is_server(int(entry.name)):
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if f"PREFECT_HOME={home.resolve()}".encode() in environment:
            found.append(int(entry.name))
    return found


def wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while process_is_server(pid):
        assert time.monotonic() < deadline, f"server {pid} still running"
        time.sleep(0.05)


def wait_until_stopped(pid: int, timeout: float = 30.0) -> None:
    """Wait for a SIGSTOP to land: the kernel delivers it when the process is next scheduled (later when busy)."""
    deadline = time.monotonic() + timeout
    while not process_stopped(pid):
        assert time.monotonic() < deadline, f"server {pid} not stopped"
        time.sleep(0.05)
