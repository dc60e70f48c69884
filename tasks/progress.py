"""Progress of long file work: a bar on a terminal, throttled log lines elsewhere, or nothing; and per step run
one Prefect progress artifact.

Steps call ``track(label, total)`` and ``advance(n)`` without knowing where progress goes; the command
line chooses the display once per process with ``use_display``. The default (deployments, tests) is
log lines at most once every ``LOG_EVERY_SECONDS`` per file, so Prefect's log store stays small.

Independently of the display, the step task wrapper (``tasks.contract.step_task``) opens ``step_progress`` for
its run: every ``track`` of the step (its file tasks' threads included: they run in a copy of its context) feeds
one ``StepProgress``, which creates the step's progress artifact when the first file of known size starts, updates
it at most once every ``ARTIFACT_EVERY_SECONDS`` (one monotonic comparison per ``advance``) and sets 100 at the
end. Outside a Prefect task run (plain-function tests, a worker process without the step's context) it does
nothing.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol
from uuid import UUID

from tasks.readable import size_text

LOG_EVERY_SECONDS = 5.0
ARTIFACT_EVERY_SECONDS = 1.0
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
    return size_text(amount) if unit == "B" else f"{amount:,.0f} {unit}"


Display = Literal["bar", "log", "none"]
_display: Display = "log"


def use_display(display: Display) -> None:
    global _display
    _display = display


@contextmanager
def track(label: str, total: int | None = None, unit: str = "B") -> Iterator[Tracker]:
    with _display_tracker(label, total, unit) as shown:
        aggregate = _step_progress.get()
        if aggregate is None:
            yield shown
            return
        aggregate.file_started(total, unit)
        try:
            yield _Fed(shown, aggregate, unit)
        finally:
            aggregate.file_finished()


@contextmanager
def _display_tracker(label: str, total: int | None, unit: str) -> Iterator[Tracker]:
    if _display == "none":
        yield _Silent()
    elif _display == "bar":
        with _rich_bar(label, total, unit) as tracker:
            yield tracker
    else:
        yield _LogTracker(label, total, unit)


class _Fed:
    """A file's tracker that also feeds its step's aggregate."""

    def __init__(self, shown: Tracker, aggregate: StepProgress, unit: str):
        self._shown, self._aggregate, self._unit = shown, aggregate, unit

    def advance(self, amount: int) -> None:
        self._shown.advance(amount)
        self._aggregate.advance(amount, self._unit)


# --- one progress artifact per step run ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepWork:
    """What a step run is known to work on before it starts: its input files, their bytes and resources (none
    for an import step, whose files are learned as they start)."""

    files: int = 0
    size: int = 0
    resources: int = 0

    def total(self, unit: str) -> int:
        return self.resources if unit == "resources" else self.size if unit == "B" else 0


_step_progress: contextvars.ContextVar[StepProgress | None] = contextvars.ContextVar("step_progress", default=None)


@contextmanager
def step_progress(key: str, step: str, work: StepWork) -> Iterator[StepProgress | None]:
    """The aggregate progress of one step run, published as the progress artifact ``key``; None (and nothing
    published) outside a Prefect task run."""
    from prefect.context import TaskRunContext

    context = TaskRunContext.get()
    if context is None:
        yield None
        return
    aggregate = StepProgress(key, step, work, context.task_run.id, context.task_run.flow_run_id)
    token = _step_progress.set(aggregate)
    try:
        yield aggregate
    except BaseException:
        aggregate.publish(stopped=True)
        raise
    else:
        aggregate.publish(finished=True)
    finally:
        _step_progress.reset(token)


class StepProgress:
    """Counts a step run's file work (from every thread of the step) and publishes it as one progress artifact.

    Percent: against the step's known input (bytes or resources, in the unit its files are tracked in); for an
    import step, against the files started so far (never going back). Publishing is throttled to once every
    ``ARTIFACT_EVERY_SECONDS``: ``advance`` adds under a lock and compares one monotonic time, and a thread that
    finds another one publishing goes on with its work.
    """

    def __init__(self, key: str, step: str, work: StepWork, task_run_id: UUID, flow_run_id: UUID | None):
        self._key, self._step, self._work = key, step, work
        self._task_run_id, self._flow_run_id = task_run_id, flow_run_id
        self._lock = threading.Lock()
        self._publishing = threading.Lock()
        self._started = time.monotonic()
        self._next_publish = float("-inf")
        self._artifact: UUID | None = None
        self._files_started = self._files_finished = 0
        self._totals: dict[str, int] = {}  # per unit: the totals of the files started so far (import steps)
        self._done: dict[str, int] = {}
        self._percent = 0.0

    def file_started(self, total: int | None, unit: str) -> None:
        with self._lock:
            self._files_started += 1
            if total:
                self._totals[unit] = self._totals.get(unit, 0) + total
        self.publish()

    def file_finished(self) -> None:
        with self._lock:
            self._files_finished += 1
        self.publish()

    def advance(self, amount: int, unit: str) -> None:
        with self._lock:
            self._done[unit] = self._done.get(unit, 0) + amount
        if time.monotonic() >= self._next_publish:
            self.publish()

    def publish(self, *, finished: bool = False, stopped: bool = False) -> None:
        """Create or update the artifact: throttled, or now when the step run ended (``finished``: 100)."""
        final = finished or stopped
        if not self._publishing.acquire(blocking=final):
            return
        try:
            now = time.monotonic()
            if not final and now < self._next_publish:
                return
            with self._lock:
                if not self._has_known_work() or (stopped and self._artifact is None):
                    return
                percent, description = self._measure(now, finished, stopped)
            self._next_publish = now + ARTIFACT_EVERY_SECONDS
            self._write(percent, description)
        finally:
            self._publishing.release()

    def _has_known_work(self) -> bool:
        return self._files_started > 0 and bool(self._work.files or self._totals)

    def _measure(self, now: float, finished: bool, stopped: bool) -> tuple[float, str]:
        unit = "resources" if "resources" in self._done else "B"
        done = self._done.get(unit, 0)
        total = self._work.total(unit) or self._totals.get(unit, 0)
        if finished:
            self._percent = 100.0
        elif total:
            self._percent = max(self._percent, min(99.9, 100.0 * done / total))
        files = f"{self._files_finished} / {self._work.files}" if self._work.files else f"{self._files_finished}"
        amounts = ", ".join(_human(amount, name) for name, amount in sorted(self._done.items())) or "nothing yet"
        rate = _human(done / max(now - self._started, 1e-9), unit)
        state = "done" if finished else "stopped" if stopped else "working"
        return self._percent, f"{self._step} {state}: {files} files, {amounts}, at {rate}/s"

    def _write(self, percent: float, description: str) -> None:
        """One request; a failure is logged and ends this artifact's updates, never the step's work."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        try:
            with get_client(sync_client=True) as client:
                if self._artifact is None:
                    self._artifact = client.create_artifact(
                        ArtifactCreate(
                            key=self._key,
                            type="progress",
                            data=percent,
                            description=description,
                            task_run_id=self._task_run_id,
                            flow_run_id=self._flow_run_id,
                        )
                    ).id
                else:
                    client.update_artifact(self._artifact, ArtifactUpdate(data=percent, description=description))
        except Exception as exc:
            self._next_publish = float("inf")
            logger.warning("progress artifact %s not updated any more: %s", self._key, exc)


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
