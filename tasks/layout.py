"""Where things live inside a job directory. Import-light on purpose: ``status`` and ``list`` use it."""

from __future__ import annotations

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
