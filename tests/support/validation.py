"""Validation inputs and outputs: the shared validation data, generated patients written as NDJSON, a report line's
chunk marks, and the validation step run as the pipeline runs it (also in a child process, to be killed)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from prefect import flow

from tasks.clients.validator import CHUNK_EXTENSION, MB, RESOURCE_EXTENSION
from tasks.job.contract import DataFile, StepInput, StepResult, stored_in_job
from tests.support.ndjson import count_resources
from tasks.validation import validation
from tests.conftest import TESTDATA

VALIDATION_DATA = TESTDATA / "validation"


def shared_data(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (VALIDATION_DATA / name).read_text().splitlines() if line.strip()]


def marks(outcome: dict[str, Any]) -> tuple[int, list[str]]:
    """(chunk number, resources held) of one report line."""
    extensions = outcome["extension"]
    (number,) = [e["valueInteger"] for e in extensions if e["url"] == CHUNK_EXTENSION]
    return number, [e["valueString"] for e in extensions if e["url"] == RESOURCE_EXTENSION]


def varied_patients(count: int, seed: int = 7, max_pad: int = 400) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    genders = ["male", "female", "other", "unknown"]
    return [
        {
            "resourceType": "Patient",
            "id": f"p{i}",
            "gender": rng.choice(genders),
            "birthDate": f"{rng.randint(1920, 2020)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            "name": [{"family": f"{rng.getrandbits(4 * max_pad):x}"[: rng.randint(1, max_pad)]}],
        }
        for i in range(count)
    ]


@flow(name="validation-test", persist_result=False)
def validation_flow(step: StepInput) -> StepResult:
    return stored_in_job(validation, step)(step)


def step_input(job_dir: Path, overrides: dict[str, str]) -> StepInput:
    folder = job_dir / "import"
    files = [DataFile(name=p.name, size=p.stat().st_size, resources=count_resources(p, MB)) for p in folder.iterdir()]
    return StepInput(
        job_id=job_dir.name,
        job_dir=str(job_dir),
        position=1,
        step="validation",
        folder="import",
        files=files,
        overrides=overrides,
    )


def validation_overrides(
    url: str, fail_on_error: bool, chunk_mb: int = 1, concurrency: int = 4, batch_files: int = 5000
) -> dict[str, str]:
    """``batch_files``: files per task run (``pipeline.file_batches.max_files``)."""
    return {
        "pipeline.file_batches.max_files": str(batch_files),
        "pipeline.enabled_steps": "[local_import, validation]",
        "services.validation.url": url,
        "services.validation.fail_on_error": str(fail_on_error).lower(),
        "services.validation.bundle_chunk_size_mb": str(chunk_mb),
        "services.validation.max_concurrent_requests": str(concurrency),
        "retry.initial_backoff_ms": "1",
        "retry.max_backoff_ms": "5",
        "compression.level": "fastest",
    }


def run_step(job_dir: Path, url: str, fail_on_error: bool, **options: Any) -> StepResult:
    return validation_flow(step_input(job_dir, validation_overrides(url, fail_on_error, **options)))


def run_in_this_process(job_dir: str, url: str) -> None:
    """Entry point of the killed subprocess: the same step, settings and flow as the tests use, a task run per file."""
    run_step(Path(job_dir), url, fail_on_error=False, concurrency=2, batch_files=1)
