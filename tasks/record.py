"""The job record the project writes itself: step manifests and job facts, as small JSON files.

- ``steps/<NN>-<step>.json``: a finished step's result (``StepResult`` as JSON), written by the flow when the
  step returns (also when Prefect answered it from the cache), so ``status`` shows files and counts.
- ``facts.json``: what the job has learned that later steps and people need (the effective CRTDL path, the
  extraction status URL and job id, …), merged key by key as steps learn them, mid-step included: the
  extraction handle is recorded the moment the server answers the submission.

Every write is atomic (temporary name, fsync, rename). Import-light on purpose: ``status`` and ``list`` use it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tasks.layout import write_file_atomically

FACTS_FILE = "facts.json"
STEPS_DIR = "steps"

_facts_lock = threading.Lock()


def step_manifest_path(job_dir: Path, position: int, step: str) -> Path:
    return job_dir / STEPS_DIR / f"{position:02d}-{step}.json"


def write_step_manifest(job_dir: Path, position: int, step: str, result: dict[str, Any]) -> None:
    write_json(step_manifest_path(job_dir, position, step), result)


def read_step_manifest(job_dir: Path, position: int, step: str) -> dict[str, Any] | None:
    return read_json(step_manifest_path(job_dir, position, step))


def remove_step_manifests(job_dir: Path, from_position: int) -> None:
    """Forget the manifests of a step and every later one (the step runs again)."""
    folder = job_dir / STEPS_DIR
    if folder.is_dir():
        for path in folder.glob("*.json"):
            if int(path.name[:2]) >= from_position:
                path.unlink(missing_ok=True)


def read_facts(job_dir: Path) -> dict[str, Any]:
    return read_json(job_dir / FACTS_FILE) or {}


def record_facts(job_dir: Path, **facts: Any) -> dict[str, Any]:
    """Merge ``facts`` into the job's facts (a value of None removes the key); returns the merged facts."""
    with _facts_lock:
        merged = read_facts(job_dir)
        for key, value in facts.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        write_json(job_dir / FACTS_FILE, merged)
        return merged


def write_json(path: Path, data: Any) -> None:
    write_file_atomically(path, (json.dumps(data, indent=2, default=str) + "\n").encode())


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
