"""Small files written whole (temporary name, synced, renamed: a half-written file is never taken for a finished
one; a failed write raises ``JobWriteError``), and an exclusive lock the kernel releases when its holder dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.core.errors import DupflowError


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


def write_file_atomically(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write a small job file (job.json, the CRTDL copy) under a temporary name, synced, then renamed; when that
    fails the temporary file is removed and ``JobWriteError`` says why. ``private``: readable by its owner only."""
    temporary = path.with_name(f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb", opener=lambda name, flags: os.open(name, flags, 0o600 if private else 0o666)) as out:
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
