"""The ``dupflow`` flow: one job, its steps in ``pipeline.enabled_steps`` order.

See docs/development.md#the-flow.
"""

import ctypes
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, runtime
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.exceptions import Pause, PrefectSignal
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.sorting import FlowRunSort
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import AwaitingRetry, Completed, Suspended
from prefect.utilities.annotations import quote

from config.settings import DATA_STEPS, GATE_STEPS
from flows.gates import run_gate
from flows.heartbeats import ensure_crash_detection
from flows.job_stop import stop_watch
from flows.job_card import JobRecordCard, publish_step_table
from flows.job_state import job_lock, suspended_message
from flows.jobs import (
    CONTINUING,
    Job,
    checked_attach,
    prepare_job,
    refuse_extraction_flags_of_a_followed_url,
)
from flows.run_logging import keep_one_trace_per_failure
from tasks.core.readable import counted
from tasks.core.redaction import redact
from tasks.core.errors import JobError
from tasks.core.url_credentials import shown_url
from tasks.job.contract import (
    StepInput,
    StepResult,
    digest,
    files_gone,
    redact_exception,
    stored_in_job,
)
from tasks.job.filework import file_runner
from tasks.job.layout import JobPaths, directory_tag, is_job_id, job_of_tag, job_tag
from tasks.job.record import COMPLETED, FAILED, counts_text, read_facts, record_facts


def step_module(name: str) -> ModuleType:
    """The step's module: its task of the same name, its ``shaped_settings`` if any.

    Why: a job imports only the steps it runs.
    Note: ``shaped_settings`` are the settings that shape the step's output; the extractor has
    none: never extract again.
    """
    return importlib.import_module(f"tasks.{name}")


def flow_run_name() -> str:
    """Name the run by its job id, known before the flow's first line.

    Why: so a deployment run's log never shows the generated name.
    """
    given = runtime.flow_run.parameters.get("job_id")
    # a form's text is no name yet
    return given if isinstance(given, str) and is_job_id(given) else own_job_id()


def own_job_id() -> str:
    """The job this run made (its tag), else the run's id.

    Why: a resumed run without job id finds its job again.
    """
    tagged = next(filter(None, map(job_of_tag, runtime.flow_run.tags or [])), None)
    return tagged or str(runtime.flow_run.id)


@flow(name="dupflow", flow_run_name=flow_run_name, log_prints=False, persist_result=False)
def pipeline(
    job_id: str | None = None,
    config_path: str | None = None,
    job_input: str | None = None,
    overrides: dict[str, str] | None = None,
    note: str | None = None,
    attach: str | None = None,
    resubmit: bool = False,
) -> Any:
    """Run (or continue) one dupflow job.

    Args:
        job_id: The job to continue; empty for a new job (scheduled and deployment runs).
        config_path: Path of the configuration YAML (absolute, or relative to the worker's
            directory).
        job_input: A CRTDL file, a data directory, or a URL, depending on the import step.
        overrides: Non-secret configuration keys to override, e.g. {"retry.max_attempts": "3"}.
        note: Continue past a wait step that paused the job, with this inspection note
            (``continue``'s form).
        attach: After a submission in doubt: follow the extraction at this status URL.
        resubmit: After a submission in doubt: submit the extraction anew (note, attach and
            resubmit apply once: a Retry of this run goes on without them).
    """
    checked_attach(attach)  # before anything is made or written
    forget_continue_flags()
    job = prepare_job(
        job_id or own_job_id(), config_path, job_input, overrides, must_exist=bool(job_id)
    )
    if elsewhere := handed_over(job, note):
        return elsewhere
    name_and_tag_flow_run(job.job_id, job.paths.job_dir)
    if problem := ensure_crash_detection():
        get_run_logger().warning(
            "the Prefect server may not mark this job Crashed if its process is killed: %s", problem
        )
    with job_lock(job.paths), stop_watch(UUID(runtime.flow_run.id)) as stop:
        settle_submission_in_doubt(job, attach, resubmit)
        card = JobRecordCard(job)
        try:
            return run_job_steps(job, card, note)
        except BaseException as exc:
            # a Cancel, a Suspend, an interrupt: no failure
            if stopped := stop.ended(exc):
                return ended_by_a_stop(job, card, stopped)
            # suspended for inspection: the card shows it already
            if isinstance(exc, PrefectSignal):
                raise
            redact_exception(exc)  # Prefect makes the failed state's message of its text
            card.set_state(FAILED, redact(f"{type(exc).__name__}: {exc}"))
            raise


def forget_continue_flags() -> None:
    """Drop ``continue``'s flags from the run's stored parameters: applied once.

    Why: a Retry (UI, worker) or a hand-over executes the run again with its stored parameters;
    a resubmit applied again submitted another extraction, an attach failed every Retry.
    Note: dropped before any is applied: a run that dies first loses them, never applies them twice.
    """
    given = runtime.flow_run.parameters
    if given.keys() & CONTINUING:
        with get_client(sync_client=True) as client:
            kept = {key: given[key] for key in given.keys() - CONTINUING}
            client.update_flow_run(runtime.flow_run.id, parameters=kept)


def ended_by_a_stop(job: Job, card: JobRecordCard, stopped: State[Any]) -> State[Any]:
    """The run's end after a Cancel, an interrupt or a Suspend (Prefect's ``Pause``).

    Note: a Suspend from the UI is set again on the server, saying until when and how to go on.
    """
    if paused := stopped.is_paused():
        until = stopped.state_details.pause_timeout
        message = suspended_message(None, until, job.paths.job_dir)
        stopped = Suspended(pause_expiration_time=until, message=message)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(runtime.flow_run.id, stopped, force=True)
    card.set_state(stopped.name or "", stopped.message or "")
    if paused:
        raise Pause(state=stopped)
    return stopped


def handed_over(job: Job, note: str | None) -> State[Any] | None:
    """Hand the job over to its other flow run, if it has one; this run ends saying so.

    Note: that run (a deployment's form given its id) is resumed with ``note`` or set to be retried,
    for its runner or worker.
    Why: one job is one flow run; a second one finished the job, the first stayed Suspended with its
    Resume.
    """
    with get_client(sync_client=True) as client:
        run = newest_job_run(client, job.paths)
        if run is None or str(run.id) == runtime.flow_run.id:
            return None
        said = f"job {job.job_id} goes on in its own flow run {run.id}"
        if run.state is not None and run.state.is_paused():
            if note is None:  # its wait step waits for its form: no answer here
                return Completed(message=f"{said}, waiting at its wait step: Resume it in the UI")
            client.resume_flow_run(run.id, run_input={"confirmed": True, "note": note})
        elif run.state is None or run.state.is_final():
            client.set_flow_run_state(run.id, AwaitingRetry(), force=True)
    return Completed(message=said)


def newest_job_run(client: SyncPrefectClient, paths: JobPaths) -> FlowRun | None:
    """The newest flow run of the job's directory (tags ``job-<id>``, ``dir-<digest>``)

    Note: a copy of the job has its own.
    """
    own = FlowRunFilterTags(all_=[job_tag(paths.job_id), directory_tag(paths.job_dir)])
    newest = FlowRunSort.EXPECTED_START_TIME_DESC
    found = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=own), sort=newest, limit=1)
    return found[0] if found else None


def run_job_steps(job: Job, card: JobRecordCard, note: str | None) -> Any:
    """Run the steps; the state the job ends in is shown on its card first.

    Note: a gate suspends the run instead.
    """
    with file_runner(job.settings.pipeline.task_runner, job.paths.log_file):
        results = run_steps(job, card, note)
    message = completed_message(job, results[-1])
    card.set_state(COMPLETED, message)
    return Completed(message=message)


def completed_message(job: Job, last: StepResult) -> str:
    """Say where a completed job's data went: a send's target, else the last folder."""
    output_dir = job.paths.job_dir / last.folder
    if last.step != "send":
        return f"outputs in {output_dir}"
    send = job.settings.services.send
    where = (
        f"S3 bucket {send.s3.bucket}" if send.send_as == "s3_upload" else shown_url(send.url or "")
    )
    sent = counted(last.summary["files_sent"], "file")
    return f"sent {sent} ({send.send_as}) to {where}; the data sent are in {output_dir}"


def settle_submission_in_doubt(job: Job, attach: str | None, resubmit: bool) -> None:
    """Settle a submission in doubt: follow ``attach``, or submit anew on ``resubmit``."""
    if not (attach or resubmit):
        return
    if job.paths.finished(job.settings.pipeline.enabled_steps, "extractor"):
        raise JobError(
            f"job {job.job_id} has finished its extraction: attach and resubmit apply to a "
            "submission in doubt; start a new job to extract again"
        )
    # a deployment's run: no CLI check
    refuse_extraction_flags_of_a_followed_url(job.record, attach, resubmit)
    from tasks.clients.extraction_documents import ExtractionHandle
    from tasks.extractor import cancel_replaced_extraction

    job_id = ExtractionHandle.from_status_url(attach).job_id if attach else None
    replaced = read_facts(job.paths.job_dir).get("extraction_job_id")
    # the job's own extraction, given up for another: not left running
    if replaced and replaced != job_id:
        get_run_logger().warning("%s", cancel_replaced_extraction(job.settings, replaced))
    record_facts(
        job.paths.job_dir,
        extraction_status_url=attach or None,
        extraction_job_id=job_id,
        extraction_submission=None,
    )


def name_and_tag_flow_run(job_id: str, job_dir: Path) -> None:
    """Name the flow run by the job id; tag it ``job-<id>`` and ``dir-<digest>``."""
    own = {job_tag(job_id), directory_tag(job_dir)}
    tags = set(runtime.flow_run.tags or [])
    if runtime.flow_run.name == job_id and own <= tags:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(runtime.flow_run.id, name=job_id, tags=sorted(tags | own))


def run_steps(job: Job, card: JobRecordCard, note: str | None) -> list[StepResult]:
    """Run every step in order; each input follows the kinds of the steps before it."""
    keep_one_trace_per_failure()
    results: list[StepResult] = []
    current: StepResult | None = None  # what the next step reads
    card.refresh()  # the first step at work, with its progress, before it ends
    for position, name in enumerate(job.settings.pipeline.enabled_steps):
        step = step_input(job, position, name, current)
        try:
            if name in GATE_STEPS:
                result = run_gate(job, step, results, card, note)
            else:
                result = run_step(getattr(step_module(name), name), step)
        # a suspend for inspection (Pause) or an abort: not a failure of the step
        except PrefectSignal:
            raise
        except BaseException as exc:
            card.note(results, exc)  # published with the job's ended state
            raise
        release_free_memory()
        results.append(result)
        publish_step_table(job, result)
        card.note(results)
        card.refresh()
        files = f"{counted(len(result.files), 'file')}, {counts_text(result.files)}"
        get_run_logger().info("step %d %s: %s in %s", position + 1, name, files, result.folder)
        # a pass-through or sink step passes its input on
        if name in DATA_STEPS + GATE_STEPS:
            current = result
    return results


def release_free_memory() -> None:
    """Give back the memory a step freed (glibc's ``malloc_trim``).

    Why: glibc keeps what a step freed, so its peak would stay resident.
    """
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def run_step(step_task: Any, step: StepInput) -> StepResult:
    """Run a step's task; mark a cached result so.

    Note: a cached result is taken only while its files are on disk as recorded.
    Note: ``step`` is ``quote``d: Prefect would walk (and copy) every file of its input.
    """
    # a refreshed run is never a cache hit: the second pass ends the loop
    for refresh in (False, True):
        state = stored_in_job(step_task, step, refresh)(quote(step), return_state=True)
        if not files_gone(state, step.job_path):
            break
    result: StepResult = state.result()
    return result.model_copy(update={"cached": True}) if state.name == "Cached" else result


def step_input(job: Job, position: int, name: str, current: StepResult | None) -> StepInput:
    shaped = getattr(step_module(name), "shaped_settings", None)
    return StepInput(
        job_id=job.job_id,
        job_dir=str(job.paths.job_dir),
        position=position,
        step=name,
        job_input=job.record.job_input,
        folder=current.folder if current else None,
        files=current.files if current else [],
        facts=read_facts(job.paths.job_dir),
        config_path=job.record.config_path,
        overrides=job.record.overrides,
        settings_digest=digest(shaped(job.settings)) if shaped else None,
    )
