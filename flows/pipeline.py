"""The ``dupflow`` flow: run the steps named by ``pipeline.enabled_steps``, in order, for one job.

Parameters carry no secret: the configuration's location, the job input and non-secret overrides.
The configuration (with its secrets) is loaded inside the run. Each step is a Prefect task from
``STEP_TASKS``; its result is cached in the job directory (see ``tasks.context``), so running the
flow again with the same ``job_id`` skips every finished step and file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.states import Completed

from config.loader import load_settings
from config.settings import Settings
from flows.jobs import COMPLETED, FAILED, INTERRUPTED, PAUSED, RUNNING, JobFile, JobLock, new_job_id, update_job_state
from tasks.context import StepContext, StepOutput
from tasks.extractor import extractor
from tasks.http_import import http_import
from tasks.layout import JobPaths, artifact_key
from tasks.local_import import local_import
from tasks.pseudonymizer import pseudonymizer
from tasks.wait import wait

# Steps whose issue has landed. ``start`` refuses the others; ``config check`` still validates them.
STEP_TASKS = {
    "extractor": extractor,
    "http_import": http_import,
    "local_import": local_import,
    "pseudonymizer": pseudonymizer,
    "wait": wait,
}

AWAITING_INSPECTION = "AwaitingInspection"


def unavailable_steps_problem(steps: list[str]) -> str | None:
    """What to tell a user whose pipeline names a step this version does not have, if it does."""
    missing = [step for step in steps if step not in STEP_TASKS]
    if not missing:
        return None
    return (
        f"step {', '.join(missing)} is not available in this version (pipeline.enabled_steps); "
        "remove it from the pipeline"
    )


def flow_run_name() -> str:
    """The job id; a scheduled run without one gets its job id inside the run, so it is named for its kind."""
    return runtime.flow_run.parameters.get("job_id") or "scheduled-job"


@flow(name="dupflow", flow_run_name=flow_run_name, log_prints=False, persist_result=False)
def pipeline(
    job_id: str | None = None,
    config_path: str | None = None,
    job_input: str | None = None,
    overrides: dict[str, str] | None = None,
) -> Any:
    """Run (or resume) one job. Without ``job_id`` a new job is created (scheduled deployments)."""
    settings = load_settings(config_path, overrides=overrides or {}).settings
    if problem := unavailable_steps_problem(list(settings.pipeline.enabled_steps)):
        raise ValueError(problem)
    job_id = job_id or new_job_id()
    paths = JobPaths(Path(settings.jobs_dir).resolve() / job_id)
    with JobLock(paths):
        ensure_job_file(paths, config_path, job_input, overrides or {}, settings)
        record_flow_run(paths)
        try:
            outputs = run_steps(paths, settings, job_input)
        except Exception as exc:
            update_job_state(paths, FAILED, str(exc))
            raise
        except BaseException:
            update_job_state(paths, INTERRUPTED, "interrupted; run continue to resume")
            raise
        publish_summary(paths, settings, outputs)
        last = outputs[-1]
        if last.get("awaiting"):
            message = f"paused for inspection at step {last['position'] + 1} (wait); continue with: continue {job_id}"
            update_job_state(paths, PAUSED, message, awaiting=last["position"])
            return Completed(name=AWAITING_INSPECTION, message=message, data=job_summary(paths, outputs))
        update_job_state(paths, COMPLETED, f"outputs in {paths.job_dir / last['folder']}")
        return job_summary(paths, outputs)


def run_steps(paths: JobPaths, settings: Settings, job_input: str | None) -> list[StepOutput]:
    logger = get_run_logger()
    outputs: list[StepOutput] = []
    previous: StepOutput | None = None
    for position, step in enumerate(settings.pipeline.enabled_steps):
        ctx = StepContext(paths.job_id, paths.job_dir, position, step, settings, job_input)
        task = STEP_TASKS[step]
        if step == "wait":
            output = task(ctx, previous)
        else:
            output = ctx.run_cached(task, "step", step_input(previous, job_input), ctx, previous)
        outputs.append(output)
        if output.get("awaiting"):
            break
        publish_step_table(paths, output)
        logger.info("step %d %s: %d file(s) in %s", position + 1, step, len(output["files"]), output["folder"])
        previous = output
    return outputs


def step_input(previous: StepOutput | None, job_input: str | None) -> Any:
    """What a step's cache key depends on: the previous step's files, or the job input for an import."""
    if previous is None:
        return {"input": job_input}
    return {"folder": previous["folder"], "files": previous["files"]}


def ensure_job_file(
    paths: JobPaths, config_path: str | None, job_input: str | None, overrides: dict[str, str], settings: Settings
) -> None:
    if paths.job_file.exists():
        return
    JobFile(
        job_id=paths.job_id,
        config_path=config_path,
        job_input=job_input,
        overrides=overrides,
        enabled_steps=list(settings.pipeline.enabled_steps),
    ).write(paths)


def record_flow_run(paths: JobPaths) -> None:
    job = JobFile.read(paths)
    job.flow_run_ids.append(str(runtime.flow_run.id))
    job.state, job.state_message = RUNNING, ""
    job.write(paths)


def job_summary(paths: JobPaths, outputs: list[StepOutput]) -> dict[str, Any]:
    finished = [o for o in outputs if not o.get("awaiting")]
    return {
        "job_id": paths.job_id,
        "job_dir": str(paths.job_dir),
        "output_dir": str(paths.job_dir / finished[-1]["folder"]) if finished else None,
        "steps": [
            {"step": o["step"], "folder": o["folder"], "files": len(o["files"]), "awaiting": bool(o.get("awaiting"))}
            for o in outputs
        ],
    }


def publish_step_table(paths: JobPaths, output: StepOutput) -> None:
    rows = [{"name": f["name"], "size": f["size"], "resources": f["resources"]} for f in output["files"]]
    create_table_artifact(
        key=artifact_key(paths.job_id, f"{output['position']:02d}", output["step"]),
        table=rows or [{"name": "(no files)", "size": 0, "resources": 0}],
        description=f"Step {output['position'] + 1} `{output['step']}`: files in `{output['folder']}`",
    )


def publish_summary(paths: JobPaths, settings: Settings, outputs: list[StepOutput]) -> None:
    lines = [f"# dupflow job `{paths.job_id}`", "", f"Job directory: `{paths.job_dir}`", ""]
    lines += ["| # | step | folder | files | resources | bytes |", "|---|---|---|---|---|---|"]
    for output in outputs:
        if output.get("awaiting"):
            lines.append(f"| {output['position'] + 1} | {output['step']} | paused for inspection | | | |")
            continue
        files = output["files"]
        lines.append(
            f"| {output['position'] + 1} | {output['step']} | `{output['folder']}` | {len(files)} "
            f"| {sum(f['resources'] for f in files)} | {sum(f['size'] for f in files)} |"
        )
    pending = settings.pipeline.enabled_steps[len(outputs) :]
    lines += [f"| {len(outputs) + i + 1} | {step} | not run yet | | | |" for i, step in enumerate(pending)]
    create_markdown_artifact(
        key=artifact_key(paths.job_id, "summary"), markdown="\n".join(lines), description="Job summary"
    )
