"""Per-file work of a step: one ``file_task`` run per file (or batch), bounded, each committed as it finishes.

Every step fans its per-file work out through ``map_files``, so where that work runs is decided in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tasks.contract import commit_each
from tasks.fanout import run_bounded

R = TypeVar("R")


def map_files(file_task: Callable[..., R], arguments: Sequence[tuple[Any, ...]], workers: int) -> list[R | Exception]:
    """Run ``file_task(*args)`` for every tuple of ``arguments``, at most ``workers`` at once; each outcome (result
    or the exception raised) in the order of ``arguments``, so a caller keeps every file that finished."""
    calls = [lambda args=args: commit_each(file_task, *args) for args in arguments]
    return run_bounded(calls, workers)
