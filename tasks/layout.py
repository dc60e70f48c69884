"""Where things live inside a job directory. Import-light on purpose: ``status`` and ``list`` use it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PREFECT_DIR = ".prefect"
IMPORT_STEPS = ("extractor", "local_import", "http_import")


def step_folder(step: str) -> str:
    """The folder a step writes: ``import`` for every import step, else the step's name."""
    return "import" if step in IMPORT_STEPS else step


def step_cache_key(job_id: str, position: int, step: str, kind: str, digest: str) -> str:
    """A cache key for a step (kind ``step``) or one file within it (kind ``file``).

    Dashes only: a ``/`` breaks Prefect's file lock manager.
    """
    return f"{job_id}-{position:02d}-{step}-{kind}-{digest}"


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

    @property
    def cache_keys(self) -> Path:
        return self.job_dir / PREFECT_DIR / "keys"

    def wait_release_marker(self, position: int) -> Path:
        return self.job_dir / PREFECT_DIR / f"wait-{position:02d}.released"


def read_newest_result(paths: JobPaths, position: int, step: str, kind: str = "step") -> dict | None:
    """The newest persisted result of one kind for a step, read straight from Prefect's result file.

    Kinds: ``step`` (the finished step's output), ``record`` (facts a step persists while it runs,
    such as the extraction status URL, which ``status`` shows before the step has finished).
    With a separate key storage, Prefect writes the bare JSON-serialised result to the result file.
    """
    prefix = step_cache_key(paths.job_id, position, step, kind, "")
    candidates = [p for p in paths.results.glob(prefix + "*") if p.is_file()] if paths.results.is_dir() else []
    if not candidates:
        return None
    newest = max(candidates, key=lambda p: p.stat().st_mtime_ns)
    try:
        return json.loads(newest.read_text())
    except (OSError, ValueError):
        return None


def artifact_key(job_id: str, *parts: str) -> str:
    """A Prefect artifact key for a job: lowercase letters, digits and dashes only."""
    return "-".join(("job", job_id, *parts)).lower().replace("_", "-")


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write a small job file (job.json, the CRTDL copy) under a temporary name, synced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.part")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
