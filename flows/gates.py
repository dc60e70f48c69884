"""A ``wait`` step's gate: the flow run suspended with an input form to confirm.

See docs/development.md#gates.
"""

from datetime import UTC, datetime
from typing import Literal

from prefect import runtime
from prefect.flow_runs import suspend_flow_run
from prefect.input import RunInput
from prefect.input.actions import create_flow_run_input, read_flow_run_input
from prefect.input.run_input import keyset_from_paused_state
from prefect.states import Suspended
from pydantic import Field

from config.runtime import job_on_command_line, CLI
from flows.job_card import JobRecordCard
from flows import job_state
from flows.jobs import Job
from tasks.core.errors import JobError
from tasks.core.json_shapes import JsonObject
from tasks.job.contract import StepInput, StepResult, stored_in_job
from tasks.job.record import SUSPENDED, PlainText
from tasks.wait import gate_result_path, wait

# the deployment of the jobs the command line starts (``flows.job_runs``)
COMMAND_LINE_DEPLOYMENT = "command-line"


def editable_toggle(schema: JsonObject) -> None:
    """Write ``{"enum": [true]}`` for pydantic's ``{"const": true}``.

    Why: the server refuses other values the same way, and Prefect's UI leaves the toggle editable
    (it disables a property with a truthy ``const``).
    """
    schema["enum"] = [schema.pop("const")]


class InspectionInput(RunInput):
    """The form a person fills in to resume a job suspended for inspection."""

    # JSON schema enum [true], required: the server refuses anything else
    confirmed: Literal[True] = Field(
        description="Turn on to confirm: I have inspected the data (and put any corrected files "
        "in the _wait folder). Submitted off, the resume is refused and the job stays suspended.",
        json_schema_extra=editable_toggle,
    )
    note: PlainText = Field(
        default="", description="A note for the job record: what was checked or changed"
    )


def run_gate(
    job: Job, step: StepInput, done: list[StepResult], card: JobRecordCard, note: str | None
) -> StepResult:
    """Suspend until resumed with the form, then run ``wait`` with its note.

    Note: a resumed or retried run finds the form. ``continue``'s note answers a gate that paused
    the job in a run no longer suspended (cancelled, database lost).
    """
    if runtime.deployment.id is None:
        raise JobError(
            f"job {job.job_id} reached a wait step in a flow run of no deployment, which cannot "
            f"be suspended; run it with {CLI} continue {job_on_command_line(job.paths.job_dir)}"
        )
    keys = [
        job_state.gate_pause_key(step.position, n) for n in range(runtime.flow_run.run_count, 0, -1)
    ]
    answer_keys = [keyset_from_paused_state(Suspended(pause_key=k))["response"] for k in keys]
    # an answer given in an earlier attempt of the run stands (its note kept, no form again)
    answer = next(filter(None, map(read_flow_run_input, answer_keys)), None)
    key, answer_key = keys[0], answer_keys[0]
    if answer is None and note is not None and gate_result_path(step, "paused").is_file():
        create_flow_run_input(answer_key, answer := {"confirmed": True, "note": note})
    if answer is None:
        awaiting = stored_in_job(wait, step)(step, job_state.resume_hint(job.paths.job_dir))
        card.note([*done, awaiting])  # the card shows the gate awaiting while the run is suspended
        timeout = job.settings.pipeline.wait_timeout
        card.set_state(
            SUSPENDED,
            job_state.suspended_message(key, datetime.now(UTC) + timeout, job.paths.job_dir),
        )
        answer = suspend_flow_run(
            wait_for_input=InspectionInput, timeout=int(timeout.total_seconds()), key=key
        )
    # Prefect's dispatch types it as a coroutine too
    inspection = InspectionInput.model_validate(answer)
    inspected: StepResult = stored_in_job(wait, step)(step, note=inspection.note)
    return inspected
