"""The worker processes of ``tasks.streams.processes``' pool, as tests and benchmarks measure them."""

from __future__ import annotations

import multiprocessing


def worker_pids() -> list[int]:
    """The pids of this process's live worker processes."""
    return [child.pid for child in multiprocessing.active_children() if child.pid is not None]
