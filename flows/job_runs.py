"""The job's one flow run, executed by the command line or the home's runner.

See docs/development.md#the-jobs-flow-run and docs/operations.md.
"""

import argparse
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType, State
from prefect.exceptions import ObjectNotFound, Pause
from prefect.states import Cancelled, Crashed, Pending

from config.runtime import apply_process_defaults
from flows.gates import COMMAND_LINE_DEPLOYMENT
from flows.job_stop import CANCELLED_ON_SERVER
from flows.jobs import flat_inputs
from flows.pipeline import newest_job_run, pipeline
from tasks.core.json_shapes import JsonObject
from tasks.core.readable import plain_text
from tasks.job.layout import JobPaths, directory_tag, job_tag

# Prefect's name for a run set back to go again (``prefect flow-run retry``)
RETRIED = "AwaitingRetry"
DESCRIPTION = (
    "Jobs started on the command line (python -m flows.run start): the command line runs them; a "
    "Resume or Retry here, the home's runner beside its local server (or: python -m flows.run "
    "continue JOB_ID)"
)


def new_job_run(job_id: str, paths: JobPaths, parameters: JsonObject) -> FlowRun:
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(  # an upsert: the same deployment every time
            flow_id=client.create_flow(pipeline),
            name=COMMAND_LINE_DEPLOYMENT,
            entrypoint="flows/pipeline.py:pipeline",
            description=DESCRIPTION,
        )
        tags = [job_tag(job_id), directory_tag(paths.job_dir)]
        # Pending: no runner takes a run this process executes
        return client.create_flow_run_from_deployment(
            deployment_id, parameters=parameters, name=job_id, tags=tags, state=Pending()
        )


def continued_job_run(job_id: str, paths: JobPaths, parameters: JsonObject) -> FlowRun:
    """Make the job's run ready to go on in this process; say what became of it.

    Note: a new run when this server has none of the job's.
    """
    with get_client(sync_client=True) as client:
        run = newest_job_run(client, paths)
        # a lost database, another home, a copy, or a job from before
        if run is None or run.deployment_id is None:
            print(
                f"job {job_id}: its flow run is not on this Prefect server (or is from before jobs "
                "had one run): a new run takes every finished step from the job folder"
            )
            return new_job_run(job_id, paths, parameters)
        reset = reset_parameters(client, run, parameters)
        end_attempt(client, run.id, datetime.now(UTC))
        # this process holds the job's lock: none runs it
        client.set_flow_run_state(
            run.id, Pending(name=RETRIED, message="continued from the command line"), force=True
        )
        print(f"job {job_id}: {reset}going on in its flow run {run.id}")
        return client.read_flow_run(run.id)


def end_attempt(client: SyncPrefectClient, run_id: UUID, before: datetime) -> None:
    """Crash the task runs an earlier attempt left unfinished (last state ``before``).

    Why: nothing else ends them; the UI showed them Running for good, also after the job completed.
    Note: the server records task runs from their events, late under load: a continued run
    sweeps again when it ends (``execute``).
    """
    unfinished = TaskRunFilterStateType(
        any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED]
    )
    of_run = FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
    left = TaskRunFilter(state=TaskRunFilterState(type=unfinished))
    ended: State[Any] = Crashed(
        message="its process ended before the task did; the job was continued"
    )
    for task_run in client.read_task_runs(flow_run_filter=of_run, task_run_filter=left):
        if task_run.state is not None and task_run.state.timestamp < before:
            client.set_task_run_state(task_run.id, ended, force=True)


def reset_parameters(client: SyncPrefectClient, run: FlowRun, parameters: JsonObject) -> str:
    """Set the run's parameters to the job's own (``job.json``); say what differed.

    Why: the server's copy may have been changed by anyone with access; the job's inputs are the
    operator's.
    """
    client.update_flow_run(run.id, parameters=parameters)
    server, own = flat_inputs(run.parameters), flat_inputs(parameters)
    if not (
        differing := sorted(
            key for key in server.keys() | own.keys() if server.get(key) != own.get(key)
        )
    ):
        return ""
    shown = plain_text(", ".join(differing))
    return f"its flow run's parameters on the server differed from its job.json in {shown}: reset; "


def execute(run: FlowRun, parameters: JsonObject) -> Any:
    """Run the flow run here with the job's ``parameters``, never the server's copy.

    Note: as ``prefect flow-run execute``; gives its final state, Suspended at a gate, or None if
    the run was deleted.
    """
    from prefect.flow_engine import run_flow

    began, continued = datetime.now(UTC), run.state is not None and run.state.name == RETRIED
    try:
        ended = run_flow(pipeline, flow_run=run, parameters=parameters, return_type="state")
        assert isinstance(ended, State), "a sync flow's run gives its state"
        ended = cancelled_if_asked(run.id, ended)
    except Pause as paused:
        ended = paused.state
    except ObjectNotFound:  # deleted on the server while it ran (the UI's Delete): no state to give
        return None
    if continued:
        with get_client(sync_client=True) as client:
            end_attempt(client, run.id, began)
    return ended


def cancelled_if_asked(run_id: UUID, ended: State[Any]) -> State[Any]:
    """``ended``, or ``Cancelled`` if the run was to be cancelled as it ended.

    Why: set as a runner sets it once the run's process is gone; else the run would stay Cancelling
    for good.
    """
    with get_client(sync_client=True) as client:
        if not ((now := client.read_flow_run(run_id).state) is not None and now.is_cancelling()):
            return ended
        cancelled: State[Any] = Cancelled(message=CANCELLED_ON_SERVER)
        client.set_flow_run_state(run_id, cancelled, force=True)
    return cancelled


def serve() -> None:
    """The home's runner: Prefect's ``serve`` of the command-line deployment.

    Why: a Resume or Retry in the UI sets a run Scheduled, which only a runner or worker takes up;
    so the UI's buttons run a job the command line started, with no terminal.
    Note: it runs beside the home's server.
    """
    apply_process_defaults()
    pipeline.serve(
        name=COMMAND_LINE_DEPLOYMENT, description=DESCRIPTION, print_starting_message=False
    )


if __name__ == "__main__":
    # --help
    argparse.ArgumentParser(description="the home's runner of the command line's jobs").parse_args()
    serve()
