"""Small files written whole (temporary name, synced, renamed: a half-written file is never taken for a finished
one; a failed write raises ``JobWriteError``), a large file's sync before its rename and an early start of its
writing to the disk, and an exclusive lock the kernel releases when its holder dies.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import uuid
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tasks.core.errors import DupflowError

SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the dirty pages out, do not wait


class JobWriteError(DupflowError, OSError):
    """A job's file could not be written (no space left, no permission); nothing half-written is left. An
    ``OSError`` too, so callers that tolerate a failed write still do."""


def write_error(exc: OSError, path: Path) -> JobWriteError:
    if exc.errno == errno.ENOSPC:
        return JobWriteError(
            f"no space left on {path.parent}: cannot write {path.name}; free space there (or set another jobs_dir) "
            "and try again"
        )
    return JobWriteError(f"cannot write {path}: {exc.strerror or exc}; check that the folder exists and is writable")


def write_file_atomically(path: Path, data: bytes, *, private: bool = False, shared: bool = False) -> None:
    """Write a small job file (job.json, the CRTDL copy) under a temporary name, synced, then renamed; when that
    fails the temporary file is removed and ``JobWriteError`` says why. ``private``: readable by its owner only.
    ``shared``: other processes may write ``path`` at the same time (an S3 manifest record), so the temporary name is
    this writer's own (with the fixed ``.<name>.part`` one writer's rename would take another's file away)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part" if shared else f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb", opener=lambda name, flags: os.open(name, flags, 0o600 if private else 0o666)) as out:
            out.write(data)
            close_synced(out)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise write_error(exc, path) from None
    except BaseException:  # Ctrl+C or SIGTERM between open and rename leaves no temporary file either
        temporary.unlink(missing_ok=True)
        raise


def close_synced(stream: IO) -> None:
    """Flush ``stream``, put its file's data on the disk, close it: a file about to be renamed into place as finished
    (a job file, an NDJSON file, a CSV, a Parquet file) must not come back from a power cut half-written."""
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()


def start_writeback(fd: int) -> bool:
    """Have the kernel start writing ``fd``'s dirty pages to the disk now, without waiting for it (Linux's
    ``sync_file_range``, as PostgreSQL's ``*_flush_after`` settings do), so that the disk writes while data still
    arrive and the ``fsync`` before a rename only waits for the last pages. Advice only: False where it is not taken
    (another system, a pipe)."""
    function = _sync_file_range()
    return function is not None and function(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    function = getattr(ctypes.CDLL(None), "sync_file_range", None) if sys.platform == "linux" else None
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) for the block; the kernel releases it if the
    holder dies, so a killed process never leaves it locked."""
    with open(path, "a", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
