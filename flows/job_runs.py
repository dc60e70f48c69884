"""The job's one flow run: a run of the deployment ``dupflow/command-line`` (no work pool) that this process executes,
as ``prefect flow-run execute`` does, suspended at a wait step like a worker's run. ``continue`` goes on in that same
run (resumed, or set back to Pending as ``prefect flow-run retry`` does), so its state history shows each attempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import Pause
from prefect.states import Pending, State

from flows.gates import COMMAND_LINE_DEPLOYMENT
from flows.pipeline import pipeline
from tasks.core.errors import JobError
from tasks.core.readable import plain_text
from tasks.job.layout import JobPaths, directory_tag, job_tag

CONTINUING = ("note", "attach", "resubmit")  # a continue's own parameters: each continue gives them anew
RETRIED = "AwaitingRetry"  # Prefect's name for a run set back to go again (``prefect flow-run retry``)
DESCRIPTION = (
    "Jobs started on the command line (python -m flows.run start): the command line runs them, no worker does. A run "
    "suspended at a wait step, or resumed here, goes on with: python -m flows.run continue JOB_ID"
)


@dataclass(frozen=True)
class JobRun:
    """The flow run to execute, and what became of the job's earlier run to get it (said on the terminal)."""

    flow_run: FlowRun
    said: str


def new_job_run(job_id: str, paths: JobPaths, parameters: dict[str, Any], said: str = "") -> JobRun:
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(  # an upsert: the same deployment every time
            flow_id=client.create_flow(pipeline),
            name=COMMAND_LINE_DEPLOYMENT,
            entrypoint="flows/pipeline.py:pipeline",
            description=DESCRIPTION,
        )
        tags = [job_tag(job_id), directory_tag(paths.job_dir)]
        run = client.create_flow_run_from_deployment(deployment_id, parameters=parameters, name=job_id, tags=tags)
    return JobRun(run, said)


def continued_job_run(job_id: str, paths: JobPaths, parameters: dict[str, Any], note: str) -> JobRun:
    """The job's run, made ready to go on in this process; a new run when this server has none of the job's."""
    with get_client(sync_client=True) as client:
        tags = FlowRunFilterTags(all_=[job_tag(paths.job_id), directory_tag(paths.job_dir)])  # a copy has its own
        sort = FlowRunSort.EXPECTED_START_TIME_DESC
        found = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=tags), sort=sort, limit=1)
        run = found[0] if found else None
        if run is None or run.deployment_id is None:  # a lost database, another home, a copy, or a job from before
            said = "its flow run is not on this Prefect server (or is from before jobs had one run): a new run takes"
            return new_job_run(job_id, paths, parameters, f"{said} every finished step from the job folder")
        reset = reset_parameters(client, run, parameters)
        if run.state is not None and run.state.is_paused():  # resumed with the form's answers, as the UI's Resume
            resume_confirmed(client, run.id, note)
            said = "resumed its suspended flow run, confirmed with the note"
            return JobRun(client.read_flow_run(run.id), f"{reset}{said}")
        if run.state is None or not run.state.is_scheduled():  # scheduled: resumed in the UI, this goes on with it
            again: State[Any] = Pending(name=RETRIED, message="continued from the command line")
            client.set_flow_run_state(run.id, again, force=True)  # this process holds the job's lock: none runs it
        return JobRun(client.read_flow_run(run.id), f"{reset}going on in its flow run {run.id}")


def reset_parameters(client: SyncPrefectClient, run: FlowRun, parameters: dict[str, Any]) -> str:
    """Set the run's parameters to the job's own (``job.json``); what differed on the server, said.

    Why: the server's copy may have been changed by anyone with access; the job's inputs are the operator's.
    """
    client.update_flow_run(run.id, parameters=parameters)
    server, own = flat_inputs(run.parameters), flat_inputs(parameters)
    if not (differing := sorted(key for key in server.keys() | own.keys() if server.get(key) != own.get(key))):
        return ""
    shown = plain_text(", ".join(differing))
    return f"its flow run's parameters on the server differed from its job.json in {shown}: reset; "


def flat_inputs(parameters: dict[str, Any]) -> dict[str, Any]:
    """A run's job inputs by name, each override as ``overrides.KEY`` (a continue's own left out)."""
    flat = {key: value for key, value in parameters.items() if key not in (*CONTINUING, "overrides")}
    overrides = parameters.get("overrides")
    return flat | {f"overrides.{key}": value for key, value in dict(overrides or {}).items()}


def resume_confirmed(client: SyncPrefectClient, run_id: UUID, note: str) -> None:
    """Resume a suspended run with the inspection form's answers; a refusal is a one-line ``JobError``."""
    answer = client.resume_flow_run(run_id, run_input={"confirmed": True, "note": note})
    if answer.status.value != "ACCEPT":
        reason = getattr(answer.details, "reason", None) or answer.status.value
        raise JobError(f"the Prefect server did not resume flow run {run_id}: {reason}")


def execute(run: FlowRun, parameters: dict[str, Any]) -> Any:
    """Run the flow run in this process with the job's ``parameters``, never the server's copy (``prefect
    flow-run execute``); its final state, or Suspended at a gate."""
    from prefect.flow_engine import run_flow

    try:
        return run_flow(pipeline, flow_run=run, parameters=parameters, return_type="state")
    except Pause as paused:
        return paused.state
