"""Progress of long file work: a bar on a terminal, throttled log lines elsewhere, or nothing.

Steps call ``track(label, total)`` and ``advance(n)`` without knowing where progress goes; the command
line chooses the display once per process with ``use_display``. The default (deployments, tests) is
log lines at most once every ``LOG_EVERY_SECONDS`` per file, so Prefect's log store stays small.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Literal, Protocol
from collections.abc import Iterator

LOG_EVERY_SECONDS = 5.0
logger = logging.getLogger("dupflow.progress")


class Tracker(Protocol):
    def advance(self, amount: int) -> None: ...


class _Silent:
    def advance(self, amount: int) -> None:
        pass


class _LogTracker:
    def __init__(self, label: str, total: int | None, unit: str):
        self._label, self._total, self._unit = label, total, unit
        self._done = 0
        self._started = self._last = time.monotonic()

    def advance(self, amount: int) -> None:
        self._done += amount
        now = time.monotonic()
        if now - self._last >= LOG_EVERY_SECONDS:
            self._last = now
            logger.info("%s", self.describe(now))

    def describe(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = self._done / elapsed
        text = f"{self._label}: {_human(self._done, self._unit)} at {_human(rate, self._unit)}/s"
        if self._total:
            left = (self._total - self._done) / rate if rate else float("inf")
            text += f" ({100 * self._done / self._total:.0f} %, ETA {left:.0f} s)"
        return text


def _human(amount: float, unit: str) -> str:
    if unit != "B":
        return f"{amount:,.0f} {unit}"
    for prefix in ("B", "KB", "MB", "GB"):
        if amount < 1024 or prefix == "GB":
            return f"{amount:.1f} {prefix}"
        amount /= 1024
    raise AssertionError("unreachable")


Display = Literal["bar", "log", "none"]
_display: Display = "log"


def use_display(display: Display) -> None:
    global _display
    _display = display


@contextmanager
def track(label: str, total: int | None = None, unit: str = "B") -> Iterator[Tracker]:
    if _display == "none":
        yield _Silent()
    elif _display == "bar":
        with _rich_bar(label, total, unit) as tracker:
            yield tracker
    else:
        tracker = _LogTracker(label, total, unit)
        yield tracker


@contextmanager
def _rich_bar(label: str, total: int | None, unit: str) -> Iterator[Tracker]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed or 0:>8,.0f} {unit}/s")

    amount_column = DownloadColumn() if unit == "B" else MofNCompleteColumn()
    speed_column = TransferSpeedColumn() if unit == "B" else RateColumn()
    columns = (TextColumn("{task.description}"), BarColumn(), amount_column, speed_column, TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task_id = bar.add_task(label, total=total)

        class _Bar:
            def advance(self, amount: int) -> None:
                bar.advance(task_id, amount)

        yield _Bar()
