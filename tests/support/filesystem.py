"""Files as other users see them: a folder walked by an unprivileged user (in a child process), the files under a
folder."""

from __future__ import annotations

import multiprocessing
import os
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
