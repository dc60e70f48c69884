"""The ``wait`` step: pause the job so a person can inspect (and correct) the data so far.

The gate is a marker file in the job directory, checked by an uncached task, so it survives any
process: a local run ends with the job paused and ``continue`` sets the marker and re-runs the flow
(finished steps come back from their cached results); a deployment run pauses the flow run in
Prefect and the UI's Resume sets the marker and carries on.

Corrected files go into ``<previous folder>_wait/``. If that folder holds any data file when the job
continues, the next step reads that folder instead of the previous step's output.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from prefect import runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.flow_runs import pause_flow_run

from tasks.context import FileRecord, StepContext, StepOutput
from tasks.ndjson import count_resources, is_data_file

# How long a deployment run stays paused in the UI before Prefect fails it; ``continue`` still works after.
DEPLOYMENT_PAUSE_TIMEOUT = timedelta(days=7)

logger = logging.getLogger("dupflow.wait")


@task(name="wait", cache_policy=NO_CACHE, persist_result=False)
def wait(ctx: StepContext, previous: StepOutput) -> StepOutput:
    marker = ctx.paths.wait_release_marker(ctx.position)
    wait_dir = ctx.job_dir / f"{previous['folder']}_wait"
    if not marker.exists():
        wait_dir.mkdir(parents=True, exist_ok=True)
        logger.warning("%s", inspection_instructions(ctx, previous, wait_dir))
        if runtime.deployment.id is None:
            return StepOutput(step=ctx.step, position=ctx.position, folder=previous["folder"], awaiting=True, files=[])
        pause_flow_run(timeout=int(DEPLOYMENT_PAUSE_TIMEOUT.total_seconds()), key=f"wait-{ctx.position:02d}")
        marker.touch()
    return released_output(ctx, previous, wait_dir)


def inspection_instructions(ctx: StepContext, previous: StepOutput, wait_dir: Path) -> str:
    how_to_continue = (
        "press Resume on this flow run in the Prefect UI"
        if runtime.deployment.id is not None
        else f"run: python -m flows.run continue {ctx.job_id}"
    )
    return (
        f"Job {ctx.job_id} is paused for inspection.\n"
        f"  Data to inspect: {ctx.job_dir / previous['folder']}\n"
        f"  To change it, put the corrected .ndjson/.ndjson.zst files in {wait_dir}\n"
        f"  (when that folder holds any file, the next step reads only that folder).\n"
        f"  To continue, {how_to_continue}"
    )


def released_output(ctx: StepContext, previous: StepOutput, wait_dir: Path) -> StepOutput:
    replaced = sorted(p for p in wait_dir.iterdir() if is_data_file(p)) if wait_dir.is_dir() else []
    if not replaced:
        return StepOutput(step=ctx.step, position=ctx.position, folder=previous["folder"], files=previous["files"])
    records = [
        FileRecord(name=p.name, size=p.stat().st_size, resources=count_resources(p, ctx.max_line_bytes))
        for p in replaced
    ]
    logger.info("continuing with %d corrected file(s) from %s", len(records), wait_dir)
    return ctx.output(records, folder=wait_dir)
