"""Build a step's input for tests that drive a step's plain functions or ``task.fn`` without a Prefect run."""

from __future__ import annotations

from pathlib import Path

from tasks.job.contract import DataFile, StepInput


def step_input(
    job_dir: Path,
    step: str,
    *,
    job_input: str | None = None,
    folder: str | None = None,
    files: list[DataFile] | None = None,
    facts: dict | None = None,
    position: int = 0,
    **settings: str,
) -> StepInput:
    """A ``StepInput`` for ``job_dir`` whose settings are the built-in defaults plus ``settings`` (dotted keys with
    ``__`` for ``.``), handed down as the step's overrides, as the flow does."""
    overrides = {"pipeline.enabled_steps": step, **{key.replace("__", "."): value for key, value in settings.items()}}
    job_dir.mkdir(parents=True, exist_ok=True)
    return StepInput(
        job_id=job_dir.name,
        job_dir=str(job_dir),
        position=position,
        step=step,
        job_input=job_input,
        folder=folder,
        files=files or [],
        facts=facts or {},
        overrides=overrides,
    )
