"""Small files written whole, an early writeback start, and a job lock.

See docs/development.md#streams.
"""

import ctypes
import errno
import fcntl
import functools
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tasks.core.errors import DupflowError

SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writing the dirty pages out, do not wait


class JobWriteError(DupflowError, OSError):
    """A job's file could not be written; nothing half-written is left.

    Note: an ``OSError`` too, for callers that tolerate one.
    """


def write_error(exc: OSError, path: Path) -> JobWriteError:
    if exc.errno == errno.ENOSPC:
        return JobWriteError(
            f"no space left on {path.parent}: cannot write {path.name}; free space there (or set "
            "another jobs_dir) and try again"
        )
    return JobWriteError(
        f"cannot write {path}: {exc.strerror or exc}; check that the folder exists and is writable"
    )


def write_file_atomically(
    path: Path, data: bytes, *, private: bool = False, shared: bool = False
) -> None:
    """Write a small job file under a temporary name, synced, renamed.

    Note: a failure removes it and raises ``JobWriteError``. ``private``: for its owner only.
    Note: ``shared``: others may write ``path`` at once (an S3 manifest record), so the temporary
    name is this writer's own (one writer's rename would take another's file away).
    """
    with renamed_when_done(path, shared=shared) as temporary:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(
            temporary,
            "wb",
            opener=lambda name, flags: os.open(name, flags, 0o600 if private else 0o666),
        ) as out:
            out.write(data)
            close_synced(out)


@contextmanager
def renamed_when_done(path: Path, *, shared: bool = False) -> Iterator[Path]:
    """A temporary name beside ``path``, renamed to it if the block ends without error.

    Note: a failure removes it; an ``OSError`` raises ``JobWriteError``. ``shared``: see
    ``write_file_atomically``.
    """
    temporary = path.with_name(
        f".{path.name}.{uuid.uuid4().hex}.part" if shared else f".{path.name}.part"
    )
    try:
        yield temporary
        os.replace(temporary, path)
    # Ctrl+C or SIGTERM between open and rename leaves no temporary file either
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(exc, path) from None
        raise


def close_synced(stream: IO[Any]) -> None:
    """Flush, sync and close ``stream``.

    Why: a file renamed into place must not come back half-written from a power cut.
    """
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()


def start_writeback(fd: int) -> bool:
    """Start writing ``fd``'s dirty pages to disk without waiting; False if not taken.

    Why: the ``fsync`` before a rename then waits only for the last pages (``sync_file_range``,
    as PostgreSQL's ``*_flush_after``).
    """
    function = _sync_file_range()
    return function is not None and function(fd, 0, 0, SYNC_FILE_RANGE_WRITE) == 0


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    function = getattr(ctypes.CDLL(None), "sync_file_range", None)  # Linux's alone
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing) for the block.

    Why: the kernel releases it when the holder dies, so a killed holder never leaves it locked.
    """
    with open(
        path, "a", opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666)
    ) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
