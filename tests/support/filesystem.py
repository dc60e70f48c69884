"""Files as other users see them: a folder walked by an unprivileged user (in a child process), a folder that
refuses new entries (root included), the files under a folder, a full disk."""

from __future__ import annotations

import array
import fcntl
import multiprocessing
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tasks.local_import import LocalImportError, find_ndjson_files


def walk_as_nobody(folder: str, queue: multiprocessing.Queue) -> None:
    os.setgid(65534)
    os.setuid(65534)
    try:
        find_ndjson_files(Path(folder), recursive=True, jobs_dir=Path(folder, "jobs"))
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


@contextmanager
def small_tmpfs(mount_point: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``mount_point`` (made if missing); the test is skipped where mounting is not
    allowed. Unmounted at the end."""
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(folder: Path) -> Path:
    """A file in ``folder`` that takes its file system's last free byte; its path (remove it to free the space)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 512):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler
