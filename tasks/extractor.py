"""The ``extractor`` step: run an extraction on the server, download its files.

Note: the files go into ``import/``. See docs/development.md#steps.
"""

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import httpx
from prefect import get_run_logger

from config.settings import Settings
from config.runtime import CLI, job_on_command_line
from tasks.clients.downloads import target_names, wait_until_available
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_documents import DeadHandleError, ExtractionError, ExtractionHandle
from tasks.clients.extraction_jobs import (
    ExtractionTaskClient,
    JobNotFoundError,
    TransitionRefusedError,
)
from tasks.clients.extraction_server import SUBMIT_PATH, ExtractionServerClient, PollProgress
from tasks.job.contract import (
    DataFile,
    StepInput,
    StepResult,
    core_first,
    file_task,
    settings_of,
    step_task,
)
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.streams.fanout import raise_if_cancelled, results_or_raise
from tasks.job.filework import map_files
from tasks.job.layout import is_result_url
from tasks.job.steps import download_tracked
from tasks.streams.progress import ProgressArtifact, expect_files
from tasks.core.readable import counted
from tasks.core.names import show_text
from tasks.job.record import now_iso, read_facts, record_facts

# Files downloaded at once. TORCH serves them from a static file server; 4 keeps a 1 Gbit/s link
# busy without crowding the server (its own batch concurrency default is 4 as well).
DOWNLOAD_CONCURRENCY = 4


@step_task("extractor")
def extractor(step: StepInput) -> StepResult:
    """Follow the extraction, then download every file.

    Note: after a failure no new download starts, every finished file is kept for ``continue``, and
    the first failure is raised.
    """
    settings = settings_of(step)
    config = settings.services.extractor
    with download_client(step) as client:  # the downloads' client too
        handle, urls = wait_for_result(step, client, current_handle(step, client))
        names = target_names(
            urls, compress=settings.compression.enabled, max_files=config.max_result_files
        )
        downloads = step.for_file_tasks([])  # of no input file
        arguments = [(downloads, url, name, client.files_need_token) for url, name in names.items()]
        expect_files(len(arguments))
        outcomes = map_files(download_result_file, arguments, DOWNLOAD_CONCURRENCY)
    files = sorted(results_or_raise(outcomes), key=core_first)  # so in the record
    return step.result(files, status_url=handle.status_url, extraction_job_id=handle.job_id)


@file_task("download-result-file", "download[{name}]")
def download_result_file(
    step: StepInput, url: str, name: str, needs_token: bool = False
) -> DataFile:
    """Download one result file.

    Note: ``needs_token``: the manifest said requiresAccessToken (credentials to approved origins).
    """
    settings = settings_of(step)
    config = settings.services.extractor
    with download_client(step) as client:
        if needs_token:
            client.trust_file_origins([url])
        wait_until_available(
            client.http, url, checks=config.file_ready_retries, interval=config.file_ready_interval
        )
        raise_if_cancelled()  # an interrupted run starts no new file
        stats = download_tracked(
            client.http, url, step.output_dir / name, settings, config.download_stall_timeout
        )
    return DataFile.written(name, stats)


_held_client: ContextVar[ExtractionServerClient | None] = ContextVar(
    "download_client", default=None
)
"""The step's client for its downloads, seen by the file tasks it runs in this process."""


@contextmanager
def download_client(step: StepInput) -> Iterator[ExtractionServerClient]:
    """Give a client for result-file downloads: the step's, else one of their own.

    Why: built where it runs (no client is a task parameter); the downloads a step runs in this
    process share its client (their threads copy its context), one run elsewhere (a Dask worker)
    builds and closes its own.
    """
    if held := _held_client.get():
        yield held
        return
    settings = settings_of(step)
    with ExtractionServerClient(settings.services.extractor, settings.tls) as client:
        token = _held_client.set(client)
        try:
            yield client
        finally:
            _held_client.reset(token)


def current_handle(step: StepInput, client: ExtractionServerClient) -> ExtractionHandle:
    """Return the job to follow: the given result URL, the recorded one, or a new one.

    Note: the recorded handle re-attaches; else this is a first submission.
    """
    if is_result_url(step.job_input):
        handle = ExtractionHandle.from_status_url(step.job_input)
        record_handle(step, handle, generation=0)
        return handle
    facts = read_facts(step.job_path)
    if facts.get("extraction_status_url"):
        # Through the door every status URL takes: a damaged record's job id is never logged or
        # followed.
        handle = ExtractionHandle.from_status_url(str(facts["extraction_status_url"]))
        get_run_logger().info("re-attaching to extraction job %s", handle.job_id)
        return handle
    if (in_flight := facts.get("extraction_submission")) is not None:
        raise StepError(submission_in_doubt_message(step, in_flight))
    return submit(step, client, generation=int(facts.get("extraction_generation", 0)))


def submit(step: StepInput, client: ExtractionServerClient, generation: int) -> ExtractionHandle:
    """Submit the job's CRTDL once.

    Note: a kick-off that certainly started no job (``started_no_job``) clears the recorded attempt,
    so ``continue`` submits again once the cause is fixed.
    Why: anything else stays in doubt: a timeout may come after the request was sent, and a 5xx may
    hide a job (a proxy's 502/503/504 while the server took it).
    """
    if (crtdl_path := step.crtdl_path) is None:
        raise ExtractionError(
            "the extractor step needs a CRTDL file (or a complete result URL) as the job input"
        )
    # read before the attempt is recorded: an unreadable file sends nothing
    crtdl = crtdl_path.read_bytes()
    in_flight = {"generation": generation, "started_at": now_iso()}
    record_facts(step.job_path, extraction_submission=in_flight)
    try:
        handle = client.submit(crtdl)
    except ServiceError as exc:
        if started_no_job(exc, client.base_url + SUBMIT_PATH):
            record_facts(step.job_path, extraction_submission=None)
            raise
        raise StepError(f"{exc}; {submission_in_doubt_message(step, in_flight)}") from exc
    record_handle(step, handle, generation)
    get_run_logger().info(
        "extraction submitted: job %s, status %s", handle.job_id, handle.status_url
    )
    return handle


def started_no_job(exc: ServiceError, kickoff_url: str) -> bool:
    """Tell whether a failed kick-off certainly started no job.

    Note: the server refused it (a 4xx), its connection was never made, or the OAuth token it needed
    could not be had (the failed request is the identity provider's).
    """
    if exc.service == "oauth" or (exc.status_code is not None and 400 <= exc.status_code < 500):
        return True
    cause = exc.__cause__
    if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    try:
        failed_request = cause.request if isinstance(cause, httpx.RequestError) else None
    except RuntimeError:  # httpx: raised before a request existed
        return False
    # without the query ``ServiceAuth`` adds (a token of base_url's)
    return failed_request is not None and failed_request.url.copy_with(query=None) != kickoff_url


def record_handle(step: StepInput, handle: ExtractionHandle, generation: int) -> None:
    record_facts(
        step.job_path,
        extraction_status_url=handle.status_url,
        extraction_job_id=handle.job_id,
        extraction_generation=generation,
        extraction_submission=None,
    )


def submission_in_doubt_message(step: StepInput, in_flight: JsonObject) -> str:
    job, config = (
        job_on_command_line(step.job_path),
        shlex.quote(step.config_path) if step.config_path else "CONFIG",
    )
    return (
        f"an extraction was submitted at {in_flight.get('started_at')} and no answer naming its "
        "job was recorded (the run ended, or the server answered with a 5xx or not at all), so "
        "the server may or may not have that job; submitting again could start a second "
        f"extraction. Look for it with: {CLI} extraction list {config} --status "
        "PENDING,RUNNING_GET_COHORT,RUNNING_PROCESS_BATCH,RUNNING_PROCESS_CORE,COMPLETED. Then "
        f"either follow it: {CLI} continue {job} --attach <status URL>, or submit anew: {CLI} "
        f"continue {job} --resubmit"
    )


def cancel_replaced_extraction(settings: Settings, job_id: str) -> str:
    """Cancel the extraction that ``continue --resubmit`` or ``--attach`` replaces.

    Why: left alone it takes the server's batch slots and disk.
    Note: returns what happened, for the log; a failed cancel does not stop the replacement.
    """
    shown = show_text(job_id)
    try:
        with ExtractionTaskClient(
            settings.services.extractor, settings.tls, settings.retry
        ) as client:
            result = client.control(job_id, "cancel")
    except TransitionRefusedError as exc:
        return (
            f"the replaced extraction job {shown} had already ended "
            f"({show_text(exc.job_status)}); nothing to cancel"
        )
    except JobNotFoundError:
        return (
            f"the extraction server answered 404 for the replaced extraction job {shown}: it is "
            "gone, or the server has no Task API to cancel it through (then it may still run "
            "there)"
        )
    except (ServiceError, ExtractionError) as exc:
        return (
            f"the replaced extraction job {shown} could not be cancelled ({exc}); it may still "
            f"run on the server: cancel it with: {CLI} extraction cancel CONFIG {shown}"
        )
    if result.changed:
        return f"cancelled extraction job {shown}, which this job no longer follows"
    return f"the replaced extraction job {shown} was already cancelled"


def wait_for_result(
    step: StepInput, client: ExtractionServerClient, handle: ExtractionHandle
) -> tuple[ExtractionHandle, list[str]]:
    """Poll until complete; a dead handle is replaced by a fresh submission.

    Note: at most ``retry.max_attempts`` times.
    """
    logger = get_run_logger()
    reporter = ProgressReporter(ProgressArtifact(step.artifact_key("progress")))
    attempts = settings_of(step).retry.max_attempts
    fresh_submissions = 0
    while True:
        logger.info("waiting for extraction job %s", handle.job_id)
        try:
            urls = client.poll_until_complete(handle, reporter)
        except DeadHandleError as exc:
            if is_result_url(step.job_input):
                raise ExtractionError(
                    f"{exc}; the result URL given as the job input is no longer valid"
                ) from exc
            if fresh_submissions >= attempts:
                raise ExtractionError(
                    f"{exc}; the server lost the job again after {fresh_submissions} fresh "
                    f"submission(s) (retry.max_attempts = {attempts}); check the extraction "
                    "server's job store and logs"
                ) from exc
            fresh_submissions += 1
            logger.warning(
                "%s; submitting the extraction again (%d of %d)", exc, fresh_submissions, attempts
            )
            generation = int(read_facts(step.job_path).get("extraction_generation", 0)) + 1
            record_facts(step.job_path, extraction_status_url=None, extraction_job_id=None)
            handle = submit(step, client, generation)
            continue
        reporter.finish(len(urls))
        return handle, urls


@dataclass
class ProgressReporter:
    """Polling progress in the log (when it changes) and as a progress artifact."""

    _artifact: ProgressArtifact
    _last_text: str | None = None
    _percent: float = 0.0

    def __call__(self, progress: PollProgress) -> None:
        text = progress.describe()
        if text != self._last_text:
            get_run_logger().info("extraction: %s", text)
            self._last_text = text
        self._percent = progress.percent if progress.percent is not None else self._percent
        if self._artifact.due():
            self._artifact.write(self._percent, f"Extraction: {text}")

    def finish(self, files: int) -> None:
        self._artifact.write(100.0, f"Extraction complete: {counted(files, 'file')} to download")
