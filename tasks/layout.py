"""Where things live inside a job directory. No Prefect: ``status`` and ``list`` use it.

``write_file_atomically`` writes a job's small files under a temporary name and renames them; a write that fails
(a full disk) removes the temporary file and raises ``JobWriteError`` ("no space left on <folder>: ...").
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from config.settings import IMPORT_STEPS
from tasks.errors import DupflowError

PREFECT_DIR = ".prefect"


def step_folder(step: str) -> str:
    """The folder a step writes: ``import`` for every import step, else the step's name."""
    return "import" if step in IMPORT_STEPS else step


def is_crtdl_file(job_input: str | None) -> bool:
    """A job input that is a CRTDL: a ``.json`` path that is no directory (a directory or a URL is data, not a
    CRTDL); a missing one too, so that preparing the job says the CRTDL is not found."""
    return bool(job_input) and "://" not in job_input and job_input.endswith(".json") and not Path(job_input).is_dir()


@dataclass(frozen=True)
class JobPaths:
    job_dir: Path

    @property
    def job_id(self) -> str:
        return self.job_dir.name

    @property
    def job_file(self) -> Path:
        return self.job_dir / "job.json"

    @property
    def results(self) -> Path:
        return self.job_dir / PREFECT_DIR / "results"


JOB_TAG_PREFIX = "job-"


def job_tag(job_id: str) -> str:
    """The tag every flow run of the job carries (the UI filters by it); also its artifact keys' prefix."""
    return JOB_TAG_PREFIX + job_id


def job_of_tag(tag: str) -> str | None:
    """The job id a flow-run tag names, if it is a job tag."""
    return tag.removeprefix(JOB_TAG_PREFIX) if tag.startswith(JOB_TAG_PREFIX) else None


def artifact_key(job_id: str, *parts: str) -> str:
    """A Prefect artifact key for a job: lowercase letters, digits and dashes only."""
    return "-".join(("job", job_id, *parts)).lower().replace("_", "-")


def step_artifact_key(job_id: str, position: int, step: str, *parts: str) -> str:
    """A step's artifact key, ``job-<id>-NN-<step>[-<part>]``, NN the step's number as people read it (1-based, as in
    task run names, log lines and ``status``)."""
    return artifact_key(job_id, f"{position + 1:02d}", step, *parts)


class JobWriteError(DupflowError, OSError):
    """A job's file could not be written (no space left, no permission); nothing half-written is left. An
    ``OSError`` too, so callers that tolerate a failed write still do."""


def write_error(exc: OSError, path: Path) -> JobWriteError:
    """The user's words for a failed write of ``path``: where, why and what to do."""
    if exc.errno == errno.ENOSPC:
        return JobWriteError(
            f"no space left on {path.parent}: cannot write {path.name}; free space there (or set another jobs_dir) "
            "and try again"
        )
    return JobWriteError(f"cannot write {path}: {exc.strerror or exc}; check that the folder exists and is writable")


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write a small job file (job.json, the CRTDL copy) under a temporary name, synced, then renamed; when that
    fails the temporary file is removed and ``JobWriteError`` says why."""
    temporary = path.with_name(f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise write_error(exc, path) from None


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) for the block; the kernel releases it if the
    holder dies, so a killed process never leaves it locked."""
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
