"""Files as other users see them: a folder walked by an unprivileged user (in a child process), a folder that
refuses new entries (root included), the files under a folder."""

from __future__ import annotations

import array
import fcntl
import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.local_import import LocalImportError, find_ndjson_files


def walk_as_nobody(folder: str, queue: multiprocessing.Queue) -> None:
    os.setgid(65534)
    os.setuid(65534)
    try:
        find_ndjson_files(Path(folder), recursive=True)
        queue.put("no error")
    except LocalImportError as exc:
        queue.put(str(exc))


def files_under(root: Path):
    return (p for p in root.rglob("*") if p.is_file())


@contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """``directory`` refuses new entries, for root too: the immutable flag (chattr +i) as root, else mode 0555."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield
        directory.chmod(0o755)
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags)
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, array.array("l", [flags[0] | FS_IMMUTABLE_FL]))
        try:
            yield
        finally:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10
