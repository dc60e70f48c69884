"""A job's lock, state (its flow run's), finished steps and gates; finding jobs.

Import-light: the Prefect server is asked over its REST API, without importing Prefect.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path


from config.runtime import CLI, job_on_command_line, prefect_api_url
from flows.prefect_api import api_json, filter_rows
from tasks.clients.errors import ServiceError
from tasks.core.errors import JobError
from tasks.core.json_shapes import JSON, as_object, JsonObject
from tasks.core.readable import plain_text
from tasks.job.layout import (
    JobPaths,
    directory_tag,
    is_directory_run,
    is_job_id,
    job_of_tag,
    job_tag,
    result_name,
    step_artifact_key,
)
from tasks.job.record import UNKNOWN, JobRecord, RecordError, StepRecord, read_record
from tasks.job.result_records import read_result_record

LOCK_FILE = ".lock"
# a suspended run resumed in the UI, waiting to be run
SCHEDULED_NAMES = ("Resuming", "Scheduled", "Late")
# a tags filter is one SQL function call, and SQLite takes at most 127 arguments (a 500 else)
TAGS_PER_REQUEST = 100
# the pause key of a wait step's own suspension (``gate_pause_key``); any other is a UI Suspend
GATE_PAUSE_KEY = re.compile(r"wait-(\d+)(?:-\d+)?")  # then the run count (none: an earlier version)


def gate_pause_key(position: int, run_count: int) -> str:
    """The pause key of the wait step at ``position``, as ``GATE_PAUSE_KEY`` reads it.

    Why: a suspension that ended unanswered (timed out, cancelled) fired its key for good; a
    Retry (a new ``run_count``; a Resume keeps it) suspends under a new one.
    """
    return f"wait-{position:02d}-{run_count}"


class JobLockedError(JobError):
    pass


@contextmanager
def job_lock(paths: JobPaths) -> Iterator[None]:
    """Hold an exclusive lock on a job directory while the block runs.

    Note: the kernel drops it when the process dies. The lock file holds its holder's process id, so
    a second taking in the same process (``continue``, then its flow) owns nothing.
    """
    directory, path = paths.job_dir, paths.job_dir / LOCK_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # every record write makes a file beside job.json
        tempfile.TemporaryFile(dir=directory).close()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # never written through: its target could be any file
            raise JobError(
                f"job {directory.name}: its lock file {path} is a symbolic "
                "link; remove it and run continue"
            ) from None
        raise JobError(
            f"job {directory.name}: cannot write in its directory {directory} "
            f"({exc.strerror}); make it writable, or copy the job to a writable place, and "
            "run continue there"
        ) from None
    if not took_lock(fd, directory):
        yield
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    try:
        yield
    finally:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def took_lock(fd: int, directory: Path) -> bool:
    """Lock the open lock file ``fd``; False (``fd`` closed) if this process holds it.

    Note: another holder's lock is a ``JobLockedError``.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0)
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        if holder == str(os.getpid()).encode():
            return False
        raise JobLockedError(
            f"job {directory.name} is being worked on by another process; wait for it "
            "to end (or stop it) and run continue"
        ) from exc
    return True


def current_states(jobs: list[JobPaths]) -> dict[JobPaths, str]:
    """Each job's state: its newest flow run's, as the UI shows it.

    Note: ``Unknown`` without one on this server.
    """
    runs = latest_runs(jobs)
    return {paths: run_state(runs.get(paths.job_id)) for paths in jobs}


def resume_hint(job_dir: Path) -> str:
    """How a suspended job goes on: Resume in the UI, or ``continue``.

    Note: after a Resume a worker or the home's runner runs it.
    """
    return f"Resume in the Prefect UI, or run: {CLI} continue {job_on_command_line(job_dir)}"


def suspended_message(pause_key: str | None, expires: datetime | None, job_dir: Path) -> str:
    """Say what a suspended run waits for, until when, and how to go on.

    Note: the inspection at a wait step (``pause_key`` ``wait-NN``), or a Resume after a Suspend in
    the UI; after the time given Prefect refuses the resume and fails the run.
    """
    until = f" until {expires.astimezone(UTC):%Y-%m-%d %H:%M} UTC" if expires else ""
    if found := GATE_PAUSE_KEY.fullmatch(pause_key or ""):
        waits = (
            f"awaiting inspection at step {int(found[1]) + 1} (wait){until} (pipeline.wait_timeout)"
        )
    else:
        waits = f"suspended on the Prefect server{until}"
    return f"{waits}; to go on: {resume_hint(job_dir)}"


def latest_runs(jobs: list[JobPaths]) -> dict[str, JsonObject]:
    """The newest flow run per job, by job id.

    Note: a copy's run, tagged another, does not count; jobs the server does not know (or whose
    request failed) are left out.
    """
    directories = {paths.job_id: directory_tag(paths.job_dir) for paths in jobs}
    job_ids, newest = list(directories), dict[str, JsonObject]()
    for start in range(0, len(job_ids) if prefect_api_url() is not None else 0, TAGS_PER_REQUEST):
        page = job_ids[start : start + TAGS_PER_REQUEST]
        # Newest first: the first run naming a job is its newest (a job may have more: a copy's,
        # earlier ones).
        for run in newest_rows(
            "/flow_runs/filter", flow_runs={"tags": {"any_": [job_tag(job_id) for job_id in page]}}
        ):
            tags = [str(tag) for tag in run.get("tags") or []]
            for job_id in map(job_of_tag, tags):
                if (
                    job_id in page
                    and job_id not in newest
                    and is_directory_run(tags, directories[job_id])
                ):
                    newest[job_id] = run
    return newest


def run_state(run: JsonObject | None) -> str:
    """A run's state name, made plain; Unknown for no run.

    Why: any API client may name a state.
    """
    name = (run or {}).get("state_name")  # the server's copy of its state's name
    return plain_text(name) if name else UNKNOWN


def find_job_dir(job: str, jobs_dir: Path) -> Path:
    """``job`` may be a job id (looked up in jobs_dir) or the path of a job directory."""
    candidates = (Path(job), jobs_dir / job)
    for candidate in candidates:
        if JobPaths(candidate).job_file.is_file():
            return candidate.resolve()
    for candidate in candidates:
        if is_job_id(candidate.name) and candidate.is_dir():
            raise JobError(
                f"{candidate.resolve()} holds no job.json: its start was stopped before the job "
                "was recorded, and nothing ran; start the job again, and remove that directory"
            )
    raise JobError(
        f"no job {job} in {jobs_dir.resolve()}; pass --jobs-dir (or give the job's directory)"
    )


def list_jobs(jobs_dir: Path) -> list[tuple[JobPaths, JobRecord | RecordError]]:
    """The jobs, newest first, each with its record or why it is unreadable (last).

    Note: only directories named by a job id count (a ``.pruning-<id>`` one is half removed).
    """
    readable: list[tuple[JobPaths, JobRecord]] = []
    unreadable: list[tuple[JobPaths, RecordError]] = []
    for job_dir in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
        paths = JobPaths(job_dir)
        if is_job_id(job_dir.name) and paths.job_file.is_file():
            try:
                readable.append((paths, read_record(job_dir)))
            except RecordError as exc:
                unreadable.append((paths, exc))
    return [*sorted(readable, key=lambda job: job[1].created_at, reverse=True), *unreadable]


def newest_run(paths: JobPaths) -> JsonObject | None:
    """The job directory's newest flow run, found by its name; None if none is known."""
    return latest_runs([paths]).get(paths.job_id)


def finished_steps(
    paths: JobPaths, steps: list[str], run: JsonObject
) -> dict[int, StepRecord | str]:
    """The steps the run's latest attempt finished, by position.

    Note: a gate's is awaiting or released.
    Note: each is read from the result record its task run names; for a record not this step's or
    unreadable, why (not finished).
    """
    names = {f"{step}[{position + 1}]": position for position, step in enumerate(steps)}
    done: dict[int, StepRecord | str] = {}
    # Newest first: the first is the latest.
    for task_run in newest_rows(
        "/task_runs/filter",
        flow_runs={"id": {"any_": [run.get("id")]}},
        task_runs={"name": {"any_": list(names)}},
    ):
        position = names.get(str(task_run.get("name")))
        if (
            position is None
            or position in done
            or task_run.get("flow_run_run_count") != run.get("run_count")
        ):
            continue
        state = task_run.get("state") or {}
        if state.get("type") == "COMPLETED" and (
            record := step_record(paths, steps[position], position, state)
        ):
            done[position] = record
    return done


def step_record(
    paths: JobPaths, step: str, position: int, state: JsonObject
) -> StepRecord | str | None:
    """The record the state names, looked up by name in the job folder (it may move).

    Note: why not where the record is not this step's; None where the state names no record of it.
    """
    name = str((state.get("data") or {}).get("storage_key") or "").rsplit("/", 1)[-1]
    # a gate's outcome (tasks.wait), or a digest
    suffix = "(paused|released)" if step == "wait" else "[0-9a-f]{20}"
    if not re.fullmatch(
        re.escape(result_name(paths.job_id, position, step, step, "")) + suffix, name
    ):
        return None
    try:
        _, document = read_result_record(paths.results / name)
        record = StepRecord.model_validate(json.loads(document["result"])["data"])
    except RecordError as exc:
        return str(exc)
    except (ValueError, KeyError, TypeError):  # pydantic's ValidationError is a ValueError
        return f"the result record {name} holds no step's result"
    if (record.step, record.position) != (step, position):
        return (
            f"the result record {name} holds the result of step {record.position + 1} "
            f"({record.step})"
        )
    return record.model_copy(update={"cached": state.get("name") == "Cached"})


def newest_rows(path: str, **filters: JSON) -> list[JsonObject]:
    """Return every row of a ``…/filter`` endpoint, newest first; none if unread.

    Note:
    - The commands take that as no run (``Unknown``).
    """
    try:
        return filter_rows(path, sort="EXPECTED_START_TIME_DESC", **filters)
    except ServiceError:
        return []


def step_at_work(job_id: str, run_id: str, position: int, step: str) -> str | None:
    """A running step's progress with its percent, from its artifact.

    Note: None where this run published none.
    """
    key = step_artifact_key(job_id, position, step, "progress")
    try:
        artifact = as_object(api_json("GET", f"/artifacts/{key}/latest"))
    except ServiceError:
        return None
    if str(artifact.get("flow_run_id")) != run_id:
        return None  # none, or an earlier run's
    said = plain_text(artifact.get("description") or "").removeprefix(f"{step} ")
    percent = artifact.get("data")
    return f"{said} ({percent:.0f} %)" if isinstance(percent, int | float) else said
