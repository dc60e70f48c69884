"""Where things live in a job directory; its Prefect tags' and artifacts' names.

No Prefect import: ``status`` and ``list`` use it.
"""

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from config.settings import IMPORT_STEPS

JOB_TAG_PREFIX = "job-"
DIRECTORY_TAG_PREFIX = "dir-"


def step_folder(step: str) -> str:
    return "import" if step in IMPORT_STEPS else step


def is_result_url(job_input: str | None) -> TypeGuard[str]:
    """Whether a job input is an extraction's status URL (followed, never submitted)."""
    return job_input is not None and job_input.lower().startswith(("http://", "https://"))


def is_crtdl_file(job_input: str | None) -> bool:
    """Whether a job input is a ``.json`` path that is no directory.

    Note: a missing one counts too, so that preparing the job says it is not found.
    """
    return bool(
        job_input
        and "://" not in job_input
        and job_input.endswith(".json")
        and not Path(job_input).is_dir()
    )


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
    def log_file(self) -> Path:
        return self.job_dir / "job.log"

    @property
    def results(self) -> Path:
        return self.job_dir / ".prefect" / "results"

    def finished(self, steps: list[str], step: str) -> bool:
        """Whether ``step`` is among ``steps`` and its task left its result record."""
        return step in steps and any(
            self.results.glob(result_name(self.job_id, steps.index(step), step, step, "*"))
        )


def result_name(job_id: str, position: int, step: str, task: str, suffix: str) -> str:
    """Name a task's result record ``<job>-NN-<step>-<task>-<suffix>``.

    Note: NN is the 0-based position; the task's name has dashes only (a ``/`` breaks lock
    managers); the suffix is its input's digest or a gate's outcome.
    """
    return f"{job_id}-{position:02d}-{step}-{task.replace('_', '-')}-{suffix}"


def job_tag(job_id: str) -> str:
    """The tag every flow run of the job carries (the UI filters by it).

    Note: also its artifact keys' prefix.
    """
    return JOB_TAG_PREFIX + job_id


def directory_tag(job_dir: Path) -> str:
    """The tag tying a flow run to its job directory: a digest of its real path.

    Why: a copy of the directory has the job id but never this tag, so ``prune`` of the copy leaves
    the original's flow runs and artifacts alone.
    """
    return (
        DIRECTORY_TAG_PREFIX + hashlib.sha256(os.path.realpath(job_dir).encode()).hexdigest()[:16]
    )


def is_directory_run(tags: list[str], directory: str) -> bool:
    """Whether a job's flow run, by its ``tags``, is of the tagged ``directory``.

    Note: only if every directory tag it carries is the directory's; a run from before directories
    were tagged carries none and counts for every directory of its job.
    Why: the tag, not the path: ``directory_tag`` resolves the path on disk.
    """
    return all(tag == directory for tag in tags if tag.startswith(DIRECTORY_TAG_PREFIX))


def job_of_tag(tag: str) -> str | None:
    return tag.removeprefix(JOB_TAG_PREFIX) if tag.startswith(JOB_TAG_PREFIX) else None


def artifact_key(job_id: str, *parts: str) -> str:
    """A Prefect artifact key for a job: lowercase letters, digits and dashes only."""
    return "-".join(("job", job_id, *parts)).lower().replace("_", "-")


def step_artifact_key(job_id: str, position: int, step: str, *parts: str) -> str:
    """A step's artifact key, ``job-<id>-NN-<step>[-<part>]``, NN its 1-based number."""
    return artifact_key(job_id, f"{position + 1:02d}", step, *parts)


def is_job_id(name: str) -> bool:
    """Whether ``name`` is a UUID in canonical form, as ``prepare_job`` makes job ids."""
    try:
        return str(uuid.UUID(name)) == name
    except ValueError:
        return False
