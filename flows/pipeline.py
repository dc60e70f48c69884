"""The ``dupflow`` flow: one job, its steps in the order of ``pipeline.enabled_steps``.

Every entry point (the command line, a deployment run, a scheduled run) runs this flow; ``prepare_job`` makes or
finds the job, and the flow run is named after the job id and tagged ``job-<id>``; a run without a job id (a
deployment or scheduled run) makes a job with its own flow-run id, so Prefect names it after the job as it begins.
Parameters carry no secret: the configuration's location, the job input and non-secret overrides; the
configuration (with its secrets) is loaded inside the run. Each step is a Prefect task registered in ``STEPS``
with its kind (``StepKind``), which decides what the next step reads. Finished steps and files come back from
their cached results in the job directory, so running the flow again for the same job resumes it.

The flow owns the job: it prepares it, takes its lock, closes the job's earlier flow run that no process carries
on (a local run paused for inspection, perhaps resumed in the UI with nothing behind it: it ends ``Continued``),
settles a submission in doubt (``attach``/``resubmit``), releases the gates that paused the job (``note``), runs
the steps, and writes every state of the job into its record itself (``tasks.job.record``, whose one rule settles
Prefect vs the file). A job that reaches a ``wait`` step ends its run as ``AwaitingInspection`` (a Paused state,
never a green Completed) in a local run, and is suspended with an input form in a deployment run. Only a resume
that confirms the inspection opens the gate: one without (the form's toggle is off until a person turns it on)
suspends the run again, with a log line and the inspection artifact saying why. The job-record artifact is one
card per flow run, updated in place at every step boundary.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.exceptions import ExternalSignal, PrefectSignal
from prefect.input import RunInput
from prefect.states import Completed, Paused
from pydantic import Field

from config.settings import Settings
from flows.jobs import Job, JobLock, prepare_job
from tasks.core.readable import CLI, duration_text, readable_lines, size_text
from tasks.core.redaction import redact
from tasks.job.contract import StepInput, StepKind, StepResult, count_text, stored_in_job
from tasks.core.errors import DupflowError
from tasks.extractor import extractor
from tasks.job.filework import file_runner
from tasks.flattening import flattening
from tasks.http_import import http_import
from tasks.job.layout import artifact_key, job_of_tag, job_tag, step_artifact_key
from tasks.local_import import local_import
from tasks.pseudonymizer import pseudonymizer
from tasks.job.record import (
    AWAITING_INSPECTION,
    COMPLETED,
    CONTINUED,
    CRASHED,
    FAILED,
    RUNNING,
    SUSPENDED,
    count_unconfirmed_resume,
    gate,
    read_facts,
    read_record,
    record_facts,
    record_state,
    record_step,
    release_awaiting_gates,
    release_gate,
)
from tasks.send import send
from tasks.core.url_credentials import refuse_credentials_in_url
from tasks.validation import validation
from tasks.wait import awaiting_result, refuse_unconfirmed_resume, released_result, wait

SUSPEND_TIMEOUT_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class StepSpec:
    kind: StepKind
    task: Any


STEPS: dict[str, StepSpec] = {
    "extractor": StepSpec(StepKind.IMPORT, extractor),
    "local_import": StepSpec(StepKind.IMPORT, local_import),
    "http_import": StepSpec(StepKind.IMPORT, http_import),
    "pseudonymizer": StepSpec(StepKind.TRANSFORM, pseudonymizer),
    "wait": StepSpec(StepKind.GATE, wait),
    "validation": StepSpec(StepKind.PASS_THROUGH, validation),
    "flattening": StepSpec(StepKind.TRANSFORM, flattening),
    "send": StepSpec(StepKind.SINK, send),
}


class InspectionInput(RunInput):
    """The form a person fills in to resume a job suspended for inspection."""

    confirmed: bool = Field(
        description="Turn on to confirm: I have inspected the data (and put any corrected files in the _wait folder). "
        "Submitted off, the job stays suspended.",
    )
    note: str = Field(default="", description="A note for the job record: what was checked or changed")


def flow_run_name() -> str:
    """The job id, known before the flow's first line: Prefect names the run with it as the run begins, so a
    deployment run's log never shows another name (before that, the server's generated name is all there is)."""
    return run_job_id(runtime.flow_run.parameters.get("job_id"))


def run_job_id(job_id: str | None) -> str:
    """The job this flow run works on: ``job_id``, else the job it already made (its ``job-<id>`` tag), else a new
    job named after this flow run's id (a deployment or scheduled run without a job id).

    A resumed deployment run starts the flow again with the same parameters (no job id): its own id (or the tag,
    for a job made before jobs took the run's id) makes it resume its own job instead of starting a new one.
    """
    if job_id:
        return job_id
    tagged = next(filter(None, map(job_of_tag, runtime.flow_run.tags or [])), None)
    return tagged or str(runtime.flow_run.id)


@flow(
    name="dupflow",
    flow_run_name=flow_run_name,
    log_prints=False,
    persist_result=False,
)
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
        config_path: Path of the configuration YAML (absolute, or relative to the worker's directory).
        job_input: A CRTDL file, a data directory, or a URL, depending on the import step.
        overrides: Non-secret configuration keys to override, e.g. {"retry.max_attempts": "3"}.
        note: Continue past the wait steps that paused the job, with this inspection note.
        attach: After a submission in doubt: follow the extraction at this status URL.
        resubmit: After a submission in doubt: submit the extraction anew.
    """
    job = prepare_job(
        run_job_id(job_id), config_path, job_input, overrides, overrides_source="the flow's overrides parameter"
    )
    flow_run_id = str(runtime.flow_run.id)
    name_and_tag_flow_run(job.job_id)
    with JobLock(job.paths):
        close_earlier_flow_run(job, flow_run_id)
        record_state(job.paths.job_dir, RUNNING, flow_run_id=flow_run_id)
        settle_submission_in_doubt(job, attach, resubmit)
        if note is not None:
            release_awaiting_gates(job.paths.job_dir, note)
        card = JobRecordCard(job)
        try:
            return run_job_steps(job, card)
        except PrefectSignal:  # suspended for inspection: the state is written before the suspend
            raise
        except BaseException as exc:
            record_state(job.paths.job_dir, *ended_state(exc))
            card.refresh()
            raise


def ended_state(exc: BaseException) -> tuple[str, str]:
    """The state a run ends in when ``exc`` stops it, with Prefect's words for it (secrets redacted)."""
    if isinstance(exc, Exception):
        return FAILED, redact(f"{type(exc).__name__}: {exc}")
    return CRASHED, "Execution was aborted by an interrupt signal (Ctrl+C or SIGTERM); continue resumes the job"


def run_job_steps(job: Job, card: JobRecordCard) -> Any:
    """The steps, and the state the job ends in (written to its record first)."""
    with file_runner(job.settings.pipeline.task_runner):
        results = run_steps(job, card)
    summary = job_summary(job, results)
    last = results[-1]
    if last.awaiting:
        message = f"awaiting inspection at step {last.position + 1} (wait); continue with: {CLI} continue {job.job_id}"
        record_state(job.paths.job_dir, AWAITING_INSPECTION, message)
        card.refresh()
        return Paused(name=AWAITING_INSPECTION, message=message, data=summary)
    message = f"outputs in {summary['output_dir']}"
    record_state(job.paths.job_dir, COMPLETED, message)
    card.refresh()
    return Completed(message=message, data=summary)


def close_earlier_flow_run(job: Job, flow_run_id: str) -> None:
    """The job's previous flow run, left Paused (awaiting inspection) or Running (resumed in the UI, or killed) by
    a process that is gone (this flow holds the job's lock), ends as ``Continued``, naming this run."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Cancelled

    earlier = [run_id for run_id in job.file.flow_run_ids if run_id != flow_run_id]
    if not earlier:
        return
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(earlier[-1])
        except ObjectNotFound:  # not in this server's database (another PREFECT_HOME): nothing to close
            return
        if run.state is not None and not run.state.is_final():
            message = f"the job was continued in flow run {flow_run_id}"
            client.set_flow_run_state(earlier[-1], Cancelled(name=CONTINUED, message=message), force=True)


def settle_submission_in_doubt(job: Job, attach: str | None, resubmit: bool) -> None:
    """``attach`` follows the extraction at that status URL; ``resubmit`` allows a fresh submission."""
    refuse_credentials_in_url(attach, door="attach", fix="give the status URL without them")
    if attach:
        job_id = attach.rstrip("/").rsplit("/", 1)[-1]
        record_facts(
            job.paths.job_dir, extraction_status_url=attach, extraction_job_id=job_id, extraction_submission=None
        )
    elif resubmit:
        record_facts(job.paths.job_dir, extraction_status_url=None, extraction_job_id=None, extraction_submission=None)


def name_and_tag_flow_run(job_id: str) -> None:
    """The flow run itself carries the job: name = job id, tag ``job-<id>`` (deployment runs included)."""
    from prefect.client.orchestration import get_client

    tag = job_tag(job_id)
    tags = set(runtime.flow_run.tags or [])
    if runtime.flow_run.name == job_id and tag in tags:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(runtime.flow_run.id, name=job_id, tags=sorted(tags | {tag}))


def run_steps(job: Job, card: JobRecordCard) -> list[StepResult]:
    """Run every step in order; each step's input follows the kinds of the steps before it."""
    logger = get_run_logger()
    keep_one_trace_per_failure()
    results: list[StepResult] = []
    current: StepResult | None = None  # what the next step reads
    for position, name in enumerate(job.settings.pipeline.enabled_steps):
        spec = STEPS[name]
        step = step_input(job, position, name, current)
        try:
            result = run_gate(job, step, results, card) if spec.kind is StepKind.GATE else run_step(spec.task, step)
        except PrefectSignal:  # a suspend for inspection (Pause) or an abort: not a failure of the step
            raise
        except BaseException as exc:
            card.note_failure(results, name, exc)  # published with the job's ended state
            raise
        record_step(job.paths.job_dir, position, result.model_dump(mode="json"))
        results.append(result)
        if not result.awaiting:
            publish_step_table(job, result)
        card.publish(results)
        if result.awaiting:
            break
        logger.info(
            "step %d %s: %d file(s), %s in %s",
            position + 1,
            name,
            len(result.files),
            count_text(result.files),
            result.folder,
        )
        if spec.kind in (StepKind.IMPORT, StepKind.TRANSFORM, StepKind.GATE):
            current = result
    return results


class OneTracePerFailure(logging.Filter):
    """Prefect logs a failure with its trace at every run it passes through (file task, step task, flow run): the
    first record keeps the trace, later records of the same failure (same type and text) keep their one line.
    ``forget`` starts over for a new flow run, so a later job failing the same way gets its trace too."""

    def __init__(self) -> None:
        super().__init__()
        self._traced: deque[tuple[str, str]] = deque(maxlen=64)

    def forget(self) -> None:
        self._traced.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        failure = record.exc_info[1] if record.exc_info else None
        if failure is not None:
            identity = (type(failure).__qualname__, str(failure))
            if identity in self._traced:
                record.exc_info, record.exc_text = None, None
            else:
                self._traced.append(identity)
        return True


_one_trace = OneTracePerFailure()


def keep_one_trace_per_failure() -> None:
    """On Prefect's run loggers, so the console, the job log and the UI's run log all get one trace (idempotent);
    called at the start of each flow run."""
    _one_trace.forget()
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if _one_trace not in logger.filters:
            logger.addFilter(_one_trace)


def run_step(step_task: Any, step: StepInput) -> StepResult:
    """Run a step's task; a result Prefect answers from the job's cache is marked ``cached`` for the record."""
    state = stored_in_job(step_task, step)(step, return_state=True)
    result: StepResult = state.result()
    return result.model_copy(update={"cached": True}) if state.name == "Cached" else result


def step_input(job: Job, position: int, name: str, current: StepResult | None) -> StepInput:
    return StepInput(
        job_id=job.job_id,
        job_dir=str(job.paths.job_dir),
        position=position,
        step=name,
        job_input=job.file.job_input,
        folder=current.folder if current else None,
        files=current.files if current else [],
        facts=read_facts(job.paths.job_dir),
        config_path=job.file.config_path,
        overrides=job.file.overrides,
    )


def run_gate(job: Job, step: StepInput, done: list[StepResult], card: JobRecordCard) -> StepResult:
    """A wait step: in a deployment run, suspend until resumed with the inspection form; locally, stop the run.

    In a deployment run the ``wait`` task runs once, when the gate pauses the job. Prefect runs a resumed run again
    from the top (every other task shows again, as Cached): the flow reads the form's answer first, without
    suspending again or saying so, and, confirmed, releases the gate and goes on with the folder the gate hands on
    (``released_result``), without running the task a second time."""
    in_deployment = runtime.deployment.id is not None
    hint = resume_hint(job, in_deployment)
    if not in_deployment or gate(job.paths.job_dir, step.position).get("released"):
        return wait(step, hint)
    inspection = confirmed_inspection(job, step, hint, done, card)
    release_gate(job.paths.job_dir, step.position, inspection.note)
    record_state(job.paths.job_dir, RUNNING)  # a resumed run passed its suspend, which wrote Suspended first
    return released_result(step)


def resume_hint(job: Job, in_deployment: bool) -> str:
    """How to go on past a wait step: a deployment run names its own resume call (with this run's id)."""
    if not in_deployment:
        return f"{CLI} continue {job.job_id}"
    return (
        "press Resume on this flow run in the Prefect UI and fill in the form, or "
        f'POST /api/flow_runs/{runtime.flow_run.id}/resume with {{"run_input": {{"confirmed": true, "note": "..."}}}}, '
        f"or run: {CLI} continue {job.job_id}"
    )


def confirmed_inspection(
    job: Job, step: StepInput, hint: str, done: list[StepResult], card: JobRecordCard
) -> InspectionInput:
    """The form of the resume that confirmed the inspection. The first time, the ``wait`` task publishes what to
    inspect and the run is suspended. A resume without confirmation is counted in the job's record's gate and
    suspends the run again under a new key, so each key is answered once; a resumed run finds the answer to its
    latest key without suspending."""
    unconfirmed = gate(job.paths.job_dir, step.position).get("unconfirmed_resumes", 0)
    inspection = answered_inspection(step.position, unconfirmed)
    if inspection is None:
        card.note([*done, wait(step, hint)])  # the record shows the gate awaiting while the run is suspended
        inspection = suspend_for_inspection(job, step.position, unconfirmed, card)
    while not inspection.confirmed:
        unconfirmed = count_unconfirmed_resume(job.paths.job_dir, step.position)
        refuse_unconfirmed_resume(step, hint, inspection.note)
        card.note([*done, awaiting_result(step)])
        inspection = suspend_for_inspection(job, step.position, unconfirmed, card)
    return inspection


def inspection_key(position: int, unconfirmed: int) -> str:
    """The suspend's key: new after every resume without confirmation, so that the run is suspended once more."""
    return f"wait-{position:02d}" + (f"-unconfirmed-{unconfirmed}" if unconfirmed else "")


def answered_inspection(position: int, unconfirmed: int) -> InspectionInput | None:
    """The form's answer to the suspend with this key, if the run was resumed with one."""
    from prefect.input.actions import read_flow_run_input
    from prefect.input.run_input import keyset_from_paused_state
    from prefect.states import Suspended

    keyset = keyset_from_paused_state(Suspended(pause_key=inspection_key(position, unconfirmed)))
    answer = read_flow_run_input(keyset["response"])
    return None if answer is None else InspectionInput(**answer)


def suspend_for_inspection(job: Job, position: int, unconfirmed: int, card: JobRecordCard) -> InspectionInput:
    """Suspend the deployment run (its process ends); the job record says Suspended first. A resume runs the flow
    again, which finds the form's answer with ``answered_inspection``."""
    from prefect.flow_runs import suspend_flow_run

    message = f"awaiting inspection at step {position + 1} (wait); resume in the UI with the confirmation turned on"
    record_state(job.paths.job_dir, SUSPENDED, message)
    card.refresh()
    key = inspection_key(position, unconfirmed)
    return suspend_flow_run(wait_for_input=InspectionInput, timeout=SUSPEND_TIMEOUT_SECONDS, key=key)


# --- the job record in the UI ----------------------------------------------------------------------------------


def job_summary(job: Job, results: list[StepResult]) -> dict[str, Any]:
    finished = [r for r in results if not r.awaiting]
    return {
        "job_id": job.job_id,
        "job_dir": str(job.paths.job_dir),
        "output_dir": str(job.paths.job_dir / finished[-1].folder) if finished else None,
        "steps": [{"step": r.step, "folder": r.folder, "files": len(r.files), "awaiting": r.awaiting} for r in results],
    }


def publish_step_table(job: Job, result: StepResult) -> None:
    rows = [{"name": f.name, "size": f.size, "contents": count_text([f])} for f in result.files]
    create_table_artifact(
        key=step_artifact_key(job.job_id, result.position, result.step),
        table=rows or [{"name": "(no files)", "size": 0, "contents": ""}],
        description=f"Job {job.job_id}, step {result.position + 1} `{result.step}`: files in `{result.folder}`",
    )


class JobRecordCard:
    """The job-record artifact (key ``job-<id>``, one key per job, so the UI's Artifacts page shows one card per job):
    one version per flow run, made at its first step boundary and updated in place at the later ones and when the
    job's state changes, so the run's Artifacts tab shows one "Job record" card (a deployment run resumed from the
    top finds its card again) and the key's page keeps one version per run as the job's history."""

    def __init__(self, job: Job):
        self._job = job
        self._artifact_id: Any = None
        self._results: list[StepResult] = []
        self._failed: tuple[str, BaseException] | None = None

    def publish(self, results: list[StepResult]) -> None:
        """The record with these steps done (or awaiting), now."""
        self.note(results)
        self.refresh()

    def note(self, results: list[StepResult]) -> None:
        """These steps, shown at the next ``refresh``."""
        self._results = list(results)

    def note_failure(self, results: list[StepResult], step: str, exc: BaseException) -> None:
        """The failed step's cause, shown at the next ``refresh`` (when the job's ended state is recorded)."""
        self.note(results)
        self._failed = (step, exc)

    def refresh(self) -> None:
        """Publish the record as it stands: the job's state from ``job.json`` and the steps noted so far. The card
        is a picture of the job: one that cannot be published (the API may be what failed) is logged, never put in
        place of the job's own outcome (a finished job stays Completed)."""
        try:
            self._publish()
        except Exception as publish_error:
            get_run_logger().warning("the job record could not be updated: %s", one_line(publish_error))

    def _publish(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        markdown = job_record_markdown(self._job, self._results, self._failed)
        if self._artifact_id is None:
            self._artifact_id = this_runs_artifact_id(artifact_key(self._job.job_id))
        if self._artifact_id is None:
            self._artifact_id = create_markdown_artifact(
                key=artifact_key(self._job.job_id), markdown=markdown, description="Job record"
            )
            return
        with get_client(sync_client=True) as client:
            client.update_artifact(self._artifact_id, ArtifactUpdate(data=markdown))


def this_runs_artifact_id(key: str) -> Any:
    """The id of the artifact ``key`` made by this flow run, if it made one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[runtime.flow_run.id])
            ),
            limit=1,
        )
    return found[0].id if found else None


def job_record_markdown(job: Job, results: list[StepResult], failed: tuple[str, BaseException] | None) -> str:
    """The job record: the job's state on top; per step its state, folder, files, contents, size, wall time
    (that of the run that made it, for a step served from the cache) and links to its artifacts; the step time so
    far, the inspections with their notes, the recorded facts as text, and a link to this flow run."""
    settings: Settings = job.settings
    base = ui_base_url()
    links = artifact_links(job.job_id, base)
    record = read_record(job.paths.job_dir)
    lines = [
        f"# dupflow job `{job.job_id}`",
        "",
        job_state_line(record),
        "",
        f"Job directory: `{job.paths.job_dir}`",
        "",
    ]
    if runtime.flow_run.id:
        lines += [f"Latest flow run: [{runtime.flow_run.name}]({base}/runs/flow-run/{runtime.flow_run.id})", ""]
    lines += [
        "| # | step | state | folder | files | contents | size | time | artifacts |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        state = "awaiting inspection" if r.awaiting else "done (cached)" if r.cached else "done"
        lines.append(
            f"| {r.position + 1} | {r.step} | {state} | `{r.folder}` | {len(r.files)} | {count_text(r.files)} "
            f"| {size_text(r.size)} | {seconds_text(r.seconds)} | {step_links(links, r.position)} |"
        )
    pending = list(enumerate(settings.pipeline.enabled_steps))[len(results) :]
    if failed is not None and pending:
        (position, step), *pending = pending
        cause = one_line(failed[1])
        lines.append(f"| {position + 1} | {step} | failed: {cause} | | | | | | {step_links(links, position)} |")
    lines += [f"| {position + 1} | {step} | not run yet | | | | | | |" for position, step in pending]
    lines += ["", step_time_text(results)]
    if others := links.pop(None, []):
        lines += ["", f"Other artifacts: {' · '.join(others)}"]
    if inspections := inspection_lines(record):
        lines += ["", "## Inspections", "", *inspections]
    if facts := record.get("facts"):
        lines += ["", "## Facts", "", *markdown_list(dict(sorted(facts.items())))]
    return "\n".join(lines)


def job_state_line(record: dict[str, Any]) -> str:
    """The job's state as its record holds it (the flow writes it at every transition), with its message."""
    message = record.get("state_message")
    return f"**State: {record.get('state') or RUNNING}**" + (f" — {one_line_text(message)}" if message else "")


def markdown_list(value: Any) -> list[str]:
    """``value`` as a nested markdown list: ``key: value`` items, never a Python dict or list."""
    lines = []
    for depth, label, text in readable_lines(value):
        parts = [f"**{label}**"] if label is not None else []
        parts += [f"`{text}`"] if text is not None else []
        lines.append("  " * depth + "- " + ": ".join(parts))
    return lines


def inspection_lines(record: dict[str, Any]) -> list[str]:
    """One line per gate that paused the job: released or not, and the note it was released with."""
    steps = record.get("enabled_steps") or []
    lines = []
    for key, entry in sorted((record.get("gates") or {}).items()):
        position = int(key)
        name = steps[position] if position < len(steps) else "wait"
        state = "released" if entry.get("released") else "awaiting inspection"
        note = f": {entry['note']}" if entry.get("note") else ""
        lines.append(f"- step {position + 1} ({name}): {state}{note}")
    return lines


def step_links(links: dict[int | None, list[str]], position: int) -> str:
    return " · ".join(links.pop(position, []))


def seconds_text(seconds: float | None) -> str:
    return "" if seconds is None else duration_text(seconds)


def step_time_text(results: list[StepResult]) -> str:
    """The step time so far; the part served from the cache is what earlier runs spent."""
    total = sum(r.seconds or 0.0 for r in results)
    cached = sum(r.seconds or 0.0 for r in results if r.cached)
    text = f"**Step time so far**: {duration_text(total)}"
    return text + (f" ({duration_text(cached)} of it in earlier runs, served from the cache)" if cached else "")


def one_line(exc: BaseException) -> str:
    """A failure's cause for a table cell: the first line of its message, no pipes, secrets redacted."""
    if isinstance(exc, KeyboardInterrupt | ExternalSignal):
        return "interrupted"
    return one_line_text(exc.message if isinstance(exc, DupflowError) else f"{type(exc).__name__}: {exc}")


def one_line_text(message: str) -> str:
    """A message's first line, no pipes (it may stand in a table cell), secrets redacted."""
    first = (redact(message).strip().splitlines() or [""])[0]
    return first.replace("|", "\\|")[:300]


def ui_base_url() -> str:
    """The Prefect UI's address (PREFECT_UI_URL, or derived by Prefect from the API's); empty: links relative to
    the UI's own origin."""
    from prefect.settings import get_current_settings

    return (get_current_settings().ui_url or "").rstrip("/")


def artifact_links(job_id: str, base: str) -> dict[int | None, list[str]]:
    """Markdown links to the latest version of each of the job's artifacts (the UI's ``/artifacts/artifact/<id>``
    page, which shows that one artifact; ``/artifacts/key/<key>`` would list every version), by step position
    (None: artifacts of no single step, e.g. the inspection note); each labelled by what follows the step's key."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    prefix = artifact_key(job_id) + "-"
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(like_=prefix))
        )
    links: dict[int | None, list[str]] = {}
    for artifact in sorted((a for a in found if a.key and a.key.startswith(prefix)), key=lambda a: a.key or ""):
        position, label = artifact_label(artifact.key.removeprefix(prefix))
        links.setdefault(position, []).append(f"[{label}]({base}/artifacts/artifact/{artifact.latest_id})")
    return links


def artifact_label(rest: str) -> tuple[int | None, str]:
    """The step position (0-based) and label of a key's rest: ``04-pseudonymizer-report`` (step 4) → (3,
    ``report``); ``04-pseudonymizer`` (the step's file table) → (3, ``files``); ``inspection`` → (None,
    ``inspection``)."""
    number, _, named = rest.partition("-")
    if not (number.isdigit() and named):
        return None, rest
    step = next((s for s in STEPS if named == s.replace("_", "-") or named.startswith(s.replace("_", "-") + "-")), None)
    if step is None:
        return None, rest
    return int(number) - 1, named.removeprefix(step.replace("_", "-")).removeprefix("-") or "files"
