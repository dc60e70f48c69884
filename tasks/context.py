"""What every step task receives, and how its results are cached in the job directory.

A step's result is a small JSON manifest (``StepOutput``): the folder it wrote and the files in it
with their size and resource count. Results are persisted as JSON under the job directory with cache
keys derived from (job id, step position, step, input digest); a re-run of the flow with the same
job id gets every finished step, and every finished file inside a step, back from there instead of
redoing it (see ../shared/prefect-notes.md, "Resume and idempotency").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar
from collections.abc import Callable

from prefect import Task
from prefect.cache_policies import CacheKeyFnPolicy
from prefect.transactions import CommitMode, transaction

from config.settings import Settings
from tasks.layout import JobPaths, step_cache_key, step_folder
from tasks.ndjson import CompressionLevel

R = TypeVar("R")


class FileRecord(TypedDict):
    name: str
    size: int
    resources: int


class StepOutput(TypedDict, total=False):
    step: str
    position: int
    folder: str
    files: list[FileRecord]
    record: dict[str, Any]
    awaiting: bool


def digest(value: Any) -> str:
    """A short, stable digest of any JSON-serialisable value (for cache keys)."""
    encoded = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


@dataclass(frozen=True)
class StepContext:
    job_id: str
    job_dir: Path
    position: int
    step: str
    settings: Settings
    job_input: str | None

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.job_dir)

    @property
    def folder(self) -> Path:
        return self.job_dir / step_folder(self.step)

    @property
    def max_line_bytes(self) -> int:
        return self.settings.pipeline.max_ndjson_line_size_bytes

    @property
    def compression_level(self) -> CompressionLevel | None:
        compression = self.settings.compression
        return compression.level if compression.enabled else None

    def output(self, files: list[FileRecord], folder: Path | None = None, **record: Any) -> StepOutput:
        folder = folder or self.folder
        return StepOutput(
            step=self.step,
            position=self.position,
            folder=str(folder.relative_to(self.job_dir)),
            files=files,
            record=record,
        )

    def run_cached(self, task: Task[..., R], kind: str, key_input: Any, *args: Any, **kwargs: Any) -> R:
        """Run ``task`` with its result persisted under a key from this step and ``key_input``."""
        key = step_cache_key(self.job_id, self.position, self.step, kind, digest(key_input))
        # EAGER: a sub-task's result is committed when it finishes, not when the enclosing step's
        # transaction does; otherwise a kill mid-step would lose every finished file's record.
        with transaction(commit_mode=CommitMode.EAGER):
            return task.with_options(**self._cache_options(key))(*args, **kwargs)

    def _cache_options(self, key: str) -> dict[str, Any]:
        paths = self.paths
        # No Prefect lock manager: its lock files outlive a killed process and block the next run
        # forever. The job lock (flows.jobs.JobLock, held for the whole flow run) already keeps a
        # second process off the job.
        policy = CacheKeyFnPolicy(cache_key_fn=_constant(key)).configure(key_storage=paths.cache_keys)
        return dict(
            cache_policy=policy,
            persist_result=True,
            result_serializer="json",
            result_storage=paths.results,
        )


def _constant(key: str) -> Callable[..., str]:
    return lambda *_: key


def input_files(job_dir: Path, previous: StepOutput) -> list[Path]:
    """The data files the previous data-producing step wrote, ``core`` first (referential integrity)."""
    folder = job_dir / previous["folder"]
    names = [f["name"] for f in previous["files"]]
    return [folder / name for name in sorted(names, key=lambda n: (not n.startswith("core."), n))]
