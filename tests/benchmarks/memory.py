"""Memory and CPU of a process and the processes under it, from /proc (Linux), without importing the project."""

from __future__ import annotations

import os
from pathlib import Path


def tree_peak_mb(pid: int) -> float:
    """The peak RSS (VmHWM) of ``pid`` and its live descendants, summed (pages they share count more than once)."""
    return sum(vm_hwm_mb(member) for member in descendants(pid))


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process under it, but a child not yet past its exec: forked (``vfork`` shares the very
    address space) to start another program, it holds its parent's pages, which would count twice for that instant."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += [child for child in children.get(current, []) if _cmdline(child) != _cmdline(current)]
    return found


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def vm_hwm_mb(pid: int) -> float:
    """The peak RSS of ``pid`` so far in MB; 0 for a process that is gone."""
    return _status_mb(pid, "VmHWM:")


def vm_rss_mb(pid: int) -> float:
    """The RSS of ``pid`` now in MB; 0 for a process that is gone."""
    return _status_mb(pid, "VmRSS:")


def pss_mb(pid: int) -> float:
    """The proportional set size of ``pid`` now in MB (each page shared by N processes counts 1/N to each, so the PSS
    of processes adds up to what they hold together); 0 for a process that is gone."""
    return _status_mb(pid, "Pss:", "smaps_rollup")


def _status_mb(pid: int, field: str, name: str = "status") -> float:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of ``pid`` and its live descendants so far, with what they
    reaped."""
    ticks = 0
    for member in descendants(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_pss_mb(pid: int) -> float:
    """The PSS of ``pid`` and its live descendants now, summed (``pss_mb``: shared pages counted once)."""
    return sum(pss_mb(member) for member in descendants(pid))
