"""Progress of long file work: a terminal bar or log lines, and a Prefect artifact.

See docs/development.md#streams.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from uuid import UUID

from tasks.core.readable import counted, size_text

LOG_EVERY_SECONDS = 5.0
ARTIFACT_EVERY_SECONDS = 1.0
logger = logging.getLogger("dupflow.progress")


class Tracker:
    """A file's progress; this one shows nothing (the display ``none``)."""

    def advance(self, amount: int) -> None:
        pass

    def set_total(self, total: int) -> None:
        """The file's size, learned after it started (a download's Content-Length)."""


@dataclass
class _LogTracker(Tracker):
    label: str
    total: int | None
    unit: str
    counted: int = 0
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)  # the last log line's time

    def advance(self, amount: int) -> None:
        self.counted += amount
        if (now := time.monotonic()) - self.last >= LOG_EVERY_SECONDS:
            self.last = now
            logger.info("%s", self.describe())

    def set_total(self, total: int) -> None:
        self.total = total

    def describe(self, done: bool = False) -> str:
        """Describe the progress in one line.

        Note: ``label: 1.5 MB of 3.0 MB at 2.0 MB/s (50 %, ETA 1 s)``, or ``label: done, 3.0 MB in 2
        s at 1.5 MB/s``.
        """
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.counted / elapsed
        amount, speed = _human(self.counted, self.unit), f"{_human(rate, self.unit)}/s"
        if done:
            return f"{self.label}: done, {amount} in {elapsed:.0f} s at {speed}"
        if not self.total:
            return f"{self.label}: {amount} at {speed}"
        left = (self.total - self.counted) / rate if rate else float("inf")
        share = f"{100 * self.counted / self.total:.0f} %, ETA {left:.0f} s"
        return f"{self.label}: {amount} of {_human(self.total, self.unit)} at {speed} ({share})"


def _human(amount: float, unit: str) -> str:
    return size_text(amount) if unit == "B" else f"{amount:,.0f} {unit}"


Display = Literal["bar", "log", "none"]
_display: Display = "log"
_bars_lock = threading.Lock()
_bars: Any = None  # the rich Progress of the bars shown now


def use_display(display: Display) -> None:
    global _display
    _display = display


@contextmanager
def track(
    label: str, total: int | None = None, unit: str = "B", files: int = 1
) -> Iterator[Tracker]:
    """Track work on ``files`` of the step's files (a batch) against ``total``."""
    with _display_tracker(label, total, unit) as shown:
        if not (aggregate := _step_progress.get()):
            yield shown
            return
        with aggregate.file_work(FileWork(shown, aggregate, unit, total, files)) as work:
            yield work


def expect_files(count: int, noun: str = "files") -> None:
    """Set how many files (``noun``: flattening's "pieces") the step run works on.

    Note: for when its input does not say (downloads) or is cut; its artifact then shows those done
    of expected.
    """
    if aggregate := _step_progress.get():
        with aggregate.lock:
            aggregate.files_expected, aggregate.noun = count, noun


@contextmanager
def _display_tracker(label: str, total: int | None, unit: str) -> Iterator[Tracker]:
    """Nothing, log lines, or a bar: a task of this process's one rich ``Progress``.

    Note: the ``Progress`` lives from the first bar shown to the last.
    Why: rich draws one live display at a time, and a second ``Progress`` would nest in the first
    and vanish when that one ends.
    """
    global _bars
    if _display == "none":
        yield Tracker()
    elif _display == "bar":
        with _bars_lock:
            if _bars is None:
                _bars = _new_rich_progress()
                _bars.start()
            progress = _bars
            task_id = progress.add_task(label, total=total, unit=unit)
        try:
            yield _Bar(progress, task_id)
        finally:
            with _bars_lock:
                progress.refresh()  # the bar's last state is drawn once before it goes
                progress.remove_task(task_id)
                if not progress.tasks:
                    progress.stop()
                    _bars = None
    else:
        tracker = _LogTracker(label, total, unit)
        yield tracker
        logger.info("%s", tracker.describe(done=True))


@dataclass(frozen=True)
class StepWork:
    """What a step run is known to work on at its start: files, bytes, NDJSON lines."""

    files: int = 0
    size: int = 0
    lines: int = 0


@dataclass(eq=False)
class FileWork(Tracker):
    """The tracker of a file (or a batch of ``files``), feeding its bar and the step's."""

    shown: Tracker
    aggregate: StepProgress
    unit: str
    total: int | None
    files: int
    done: int = 0

    def advance(self, amount: int) -> None:
        self.shown.advance(amount)
        self.aggregate.advance(self, amount)

    def set_total(self, total: int) -> None:
        self.shown.set_total(total)
        self.aggregate.set_total(self, total)


_step_progress: contextvars.ContextVar[StepProgress | None] = contextvars.ContextVar(
    "step_progress", default=None
)


@contextmanager
def step_progress(key: str, step: str, work: StepWork) -> Iterator[StepProgress | None]:
    """Publish one step run's aggregate progress as artifact ``key``.

    Note: gives None outside a Prefect task run.
    """
    if (artifact := ProgressArtifact(key)).run is None:
        yield None
        return
    aggregate = StepProgress(artifact, step, work)
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
    """Count a step run's file work (from every thread) and publish it as one artifact.

    Note: percent (never going back) against the known input; else files done of files expected, a
    file in work by its share done; else against the files started so far.
    Note: at most every ``ARTIFACT_EVERY_SECONDS``; a thread finding another publishing goes on with
    its work.
    """

    def __init__(self, artifact: ProgressArtifact, step: str, work: StepWork):
        self._artifact, self._step, self._work = artifact, step, work
        self.lock, self._publishing = threading.Lock(), threading.Lock()
        self._started = time.monotonic()
        self._files_started = self._files_finished = self.files_expected = 0
        # what is counted: "pieces" of the input's files when the step cuts them
        self.noun = "files"
        self._in_work: set[FileWork] = set()
        # per unit: the totals of the files started so far (import steps)
        self._totals: Counter[str] = Counter()
        self._done: Counter[str] = Counter()
        self._percent = 0.0

    @contextmanager
    def file_work(self, work: FileWork) -> Iterator[FileWork]:
        """Count ``work`` as started for the block, then as finished."""
        with self.lock:
            self._files_started += work.files
            self._in_work.add(work)
            if work.total:
                self._totals[work.unit] += work.total
        self.publish()
        try:
            yield work
        finally:
            with self.lock:
                self._files_finished += work.files
                self._in_work.discard(work)
            self.publish()

    def set_total(self, work: FileWork, total: int) -> None:
        with self.lock:
            self._totals[work.unit] += total - (work.total or 0)
            work.total = total

    def advance(self, work: FileWork, amount: int) -> None:
        with self.lock:
            work.done += amount
            self._done[work.unit] += amount
        if self._artifact.due():
            self.publish()

    def publish(self, *, finished: bool = False, stopped: bool = False) -> None:
        """Create or update the artifact: throttled, or now when the step run ended.

        Note: ``finished`` publishes 100.
        """
        final = finished or stopped
        if not self._publishing.acquire(blocking=final):
            return
        try:
            if not final and not self._artifact.due():
                return
            with self.lock:
                known_work = self._files_started > 0 and bool(self._files_known() or self._totals)
                if not known_work or (stopped and self._artifact.id is None):
                    return
                description = self._measure(finished, stopped)
            # _measure's percent: only the thread that publishes changes it
            self._artifact.write(self._percent, description)
        finally:
            self._publishing.release()

    def _files_known(self) -> int:
        return self.files_expected or self._work.files

    def _measure(self, finished: bool, stopped: bool) -> str:
        """Update the percent done; describe the work."""
        unit = "lines" if "lines" in self._done else "B"
        done = self._done[unit]
        known = self._files_known()
        if finished:
            self._percent = 100.0
            # a resumed step's cached pieces never started here
            self._files_finished = max(self._files_finished, known)
        elif (fraction := self._fraction_done(unit, done)) is not None:
            self._percent = max(self._percent, min(99.9, 100.0 * fraction))
        files = (
            f"{min(self._files_finished, known)} / {known}" if known else f"{self._files_finished}"
        )
        files += f" {self.noun}" + (
            f" of {counted(self._work.files, 'file')}" if self.noun != "files" else ""
        )
        amounts = (
            ", ".join(_human(amount, name) for name, amount in sorted(self._done.items()))
            or "nothing yet"
        )
        rate = _human(done / max(time.monotonic() - self._started, 1e-9), unit)
        state = "done" if finished else "stopped" if stopped else "working"
        return f"{self._step} {state}: {files}, {amounts}, at {rate}/s"

    def _fraction_done(self, unit: str, done: int) -> float | None:
        if total := (self._work.lines if unit == "lines" else self._work.size):
            return done / total
        if self.files_expected:
            in_work = sum(
                work.files * min(1.0, work.done / work.total)
                for work in self._in_work
                if work.total
            )
            return (self._files_finished + in_work) / self.files_expected
        if total := self._totals[unit]:
            return done / total
        return None


class ProgressArtifact:
    """The progress artifact ``key`` of the task run it is made in, made then updated."""

    def __init__(self, key: str):
        from prefect.context import TaskRunContext

        self.key, self.run = key, TaskRunContext.get()
        self.id: UUID | None = None
        self._next_write = float("-inf")
        self._made_in = contextvars.copy_context()

    def due(self) -> bool:
        return time.monotonic() >= self._next_write

    def write(self, percent: float, description: str) -> None:
        """Send one request; a failure ends this artifact's updates, never the step's work.

        Note: Prefect's functions run in a copy of the context the artifact was made in, so the
        artifact is of that task run (not of the file's task run a thread works for) and they run
        sync, as that task does.
        """
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        if self.run is None:
            return
        self._next_write = time.monotonic() + ARTIFACT_EVERY_SECONDS
        run = self._made_in.copy().run
        try:
            if self.id is None:
                self.id = cast(UUID, run(create_progress_artifact, percent, self.key, description))
            else:
                run(update_progress_artifact, self.id, percent, description)
        except Exception as exc:
            self._next_write = float("inf")
            logger.warning("progress artifact %s not updated any more: %s", self.key, exc)


@dataclass
class _Bar(Tracker):
    progress: Any
    task_id: Any

    def advance(self, amount: int) -> None:
        self.progress.advance(self.task_id, amount)

    def set_total(self, total: int) -> None:
        self.progress.update(self.task_id, total=total)


def _new_rich_progress() -> Any:
    """Make rich's columns by a task's unit: sizes and speed for bytes, else counts.

    Note: rich's ETA shows only with a total.
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    class AmountColumn(ProgressColumn):
        sizes, counts = DownloadColumn(), MofNCompleteColumn()

        def render(self, task: Task) -> Text:
            return (self.sizes if task.fields["unit"] == "B" else self.counts).render(task)

    class RateColumn(ProgressColumn):
        transfer = TransferSpeedColumn()

        def render(self, task: Task) -> Text:
            unit = task.fields["unit"]
            return (
                self.transfer.render(task)
                if unit == "B"
                else Text(f"{task.speed or 0:>8,.0f} {unit}/s")
            )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        AmountColumn(),
        RateColumn(),
        TimeRemainingColumn(),
    )
    return Progress(*columns, transient=True)
