"""Where things live inside a job directory. Import-light on purpose: ``status`` and ``list`` use it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PREFECT_DIR = ".prefect"
IMPORT_STEPS = ("extractor", "local_import", "http_import")


def step_folder(step: str) -> str:
    """The folder a step writes: ``import`` for every import step, else the step's name."""
    return "import" if step in IMPORT_STEPS else step


def is_crtdl_file(job_input: str | None) -> bool:
    """A job input that is a CRTDL: an existing ``.json`` file (a directory or a URL is data, not a CRTDL)."""
    return bool(job_input) and "://" not in job_input and job_input.endswith(".json") and Path(job_input).is_file()


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

    def wait_release_marker(self, position: int) -> Path:
        return self.job_dir / PREFECT_DIR / f"wait-{position:02d}.released"

    def wait_pause_marker(self, position: int) -> Path:
        """Set when the gate at ``position`` first paused the job (its instructions are published once)."""
        return self.job_dir / PREFECT_DIR / f"wait-{position:02d}.paused"


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
