"""Job identity and the job directory: ids, folders, the lock, and reading a job back fast.

A job is one job directory ``<jobs_dir>/<job id>/`` and one or more Prefect flow runs (one per
``start`` / ``continue``), all named after the job id and tagged ``job-<id>``. Prefect keeps the
record: every step's result is persisted as JSON under ``.prefect/results/`` with a cache key
derived from (job id, step position, step, input digest), which is what makes ``continue`` skip
finished work. ``job.json`` holds only what is needed to start the flow again (the configuration's
location, the input and non-secret overrides) and the last state the flow reported, so that
``status`` and ``list`` answer without starting Prefect's embedded API (9-11 s).

This module must stay import-light (no Prefect): ``status`` and ``list`` use it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path

from tasks.layout import JobPaths, write_file_atomically

LOCK_FILE = ".lock"
# Job states as the CLI shows them; Prefect's own state names where they exist.
RUNNING, COMPLETED, PAUSED, FAILED, INTERRUPTED = "Running", "Completed", "Paused", "Failed", "Interrupted"


def new_job_id() -> str:
    return str(uuid.uuid4())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class JobFile:
    """What ``continue`` needs to start the flow again, and the last state the flow reported."""

    job_id: str
    config_path: str | None
    job_input: str | None
    overrides: dict[str, str]
    enabled_steps: list[str]
    created_at: str = field(default_factory=now_iso)
    state: str = RUNNING
    state_message: str = ""
    updated_at: str = field(default_factory=now_iso)
    awaiting_wait_position: int | None = None
    flow_run_ids: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, paths: JobPaths) -> JobFile:
        data = json.loads(paths.job_file.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def write(self, paths: JobPaths) -> None:
        self.updated_at = now_iso()
        write_file_atomically(paths.job_file, (json.dumps(self.__dict__, indent=2) + "\n").encode())


def update_job_state(paths: JobPaths, state: str, message: str = "", awaiting: int | None = None) -> None:
    job = JobFile.read(paths)
    job.state, job.state_message, job.awaiting_wait_position = state, message, awaiting
    job.write(paths)


class JobLockedError(Exception):
    pass


class JobLock:
    """An exclusive lock on a job directory for the lifetime of one process working on it.

    The kernel releases it when the process dies, so a killed run never leaves a stale lock.
    """

    def __init__(self, paths: JobPaths):
        self._path = paths.job_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> JobLock:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise JobLockedError(
                    f"job {self._path.parent.name} is being worked on by another process; "
                    "wait for it to end (or stop it) before running continue"
                ) from exc
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JobLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_locked(paths: JobPaths) -> bool:
    """True while some process holds the job's lock (that is, the job is really running)."""
    lock_path = paths.job_dir / LOCK_FILE
    if not lock_path.exists():
        return False
    fd = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def effective_state(paths: JobPaths, job: JobFile) -> str:
    """The recorded state, corrected to Crashed when it says Running but no process holds the job."""
    if job.state == RUNNING and not is_locked(paths):
        return "Crashed"
    return job.state


def find_job_dir(job: str, jobs_dir: Path) -> Path:
    """``job`` may be a job id (looked up in jobs_dir) or the path of a job directory."""
    as_path = Path(job)
    if JobPaths(as_path).job_file.is_file():
        return as_path.resolve()
    candidate = jobs_dir / job
    if JobPaths(candidate).job_file.is_file():
        return candidate.resolve()
    raise FileNotFoundError(f"no job {job!r} in {jobs_dir} (give a job id or the path of a job directory)")


def list_job_dirs(jobs_dir: Path) -> list[Path]:
    """Job directories, newest first."""
    if not jobs_dir.is_dir():
        return []
    jobs = []
    for job_dir in jobs_dir.iterdir():
        paths = JobPaths(job_dir)
        if paths.job_file.is_file():
            jobs.append((JobFile.read(paths).created_at, job_dir))
    return [job_dir for _, job_dir in sorted(jobs, reverse=True)]
