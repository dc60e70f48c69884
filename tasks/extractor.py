"""The ``extractor`` step: run an extraction on the extraction server and download its files into ``import/``.

Input (the job input): a CRTDL file, or the status URL of an already complete extraction (procedure step 8:
nothing is submitted, the URL is polled and its files downloaded).

Resume and resubmission. Each submission is a cached sub-task of kind ``record`` keyed by its *generation*
(0 for the first submission, +1 for each fresh submission after the server lost the job). Its result,
``{crtdl_path, status_url, extraction_job_id, generation}``, is persisted before the first poll. A run first
reads the newest persisted record (``read_newest_result``) and runs the submission task for that generation,
which Prefect answers from the cache: it re-attaches to the stored job instead of submitting. When a poll
says the job is gone (404/410), the next generation is submitted and persisted, so a crash after a
resubmission re-attaches to the newest job. At most ``retry.max_attempts`` fresh submissions per run.

Downloads: one cached sub-task per file URL (kind ``file``), ``DOWNLOAD_CONCURRENCY`` at a time on one shared
client, so a resumed job fetches only the files it had not finished.
"""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
import time
from pathlib import Path
from collections.abc import Callable
from uuid import UUID

import orjson
from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from tasks.clients.downloads import download_ndjson, target_names, wait_until_available
from tasks.clients.extraction_server import (
    DeadHandleError,
    ExtractionError,
    ExtractionHandle,
    ExtractionServerClient,
    PollProgress,
    parse_crtdl,
)
from tasks.context import FileRecord, StepContext, StepOutput
from tasks.crtdl_enrichment import enrich_crtdl
from tasks.layout import artifact_key, read_newest_result, write_file_atomically
from tasks.ndjson import remove_partial_files
from tasks.progress import track

# Files downloaded at once. TORCH serves them from a static file server; 4 keeps a 1 Gbit/s link busy
# without crowding the server (its own batch concurrency default is 4 as well).
DOWNLOAD_CONCURRENCY = 4
CRTDL_NAME = "crtdl.json"
ENRICHED_CRTDL_NAME = "enriched-crtdl.json"
ARTIFACT_EVERY_SECONDS = 1.0
CANCEL_GRACE_SECONDS = 1.0


@task(name="extractor")
def extractor(ctx: StepContext, previous: StepOutput | None = None) -> StepOutput:
    remove_partial_files(ctx.folder)
    crtdl_path = None if is_result_url(ctx.job_input) else prepare_crtdl(ctx)
    settings = ctx.settings
    with ExtractionServerClient(settings.services.extractor, settings.tls, settings.retry) as client:
        record = current_record(ctx, client, crtdl_path)
        record, urls = wait_for_result(ctx, client, record, crtdl_path)
        files = download_result_files(ctx, client, urls)
    return ctx.output(files, **record)


@task(name="extraction-submit")
def submit_extraction(ctx: StepContext, client: ExtractionServerClient, crtdl_path: Path, generation: int) -> dict:
    """Submit once and return the handle; as a cached ``record`` task, this is what ``continue`` re-attaches to."""
    handle = client.submit(crtdl_path.read_bytes())
    get_run_logger().info("extraction submitted: job %s, status %s", handle.job_id, handle.status_url)
    return handle_record(crtdl_path, handle, generation)


@task(name="extraction-result-url")
def remember_result_url(ctx: StepContext, url: str) -> dict:
    return handle_record(None, ExtractionHandle.from_status_url(url), 0)


@task(name="download-result-file")
def download_result_file(
    ctx: StepContext, client: ExtractionServerClient, url: str, dest: Path, on_bytes: Callable[[int], None]
) -> FileRecord:
    extractor_settings = ctx.settings.services.extractor
    wait_until_available(
        client.http, url, checks=extractor_settings.file_ready_retries, interval=extractor_settings.file_ready_interval
    )
    on_bytes(0)  # an interrupted run starts no new file
    stats = download_ndjson(
        client.http,
        url,
        dest,
        level=ctx.compression_level,
        max_line_bytes=ctx.max_line_bytes,
        stall_timeout=extractor_settings.download_stall_timeout,
        retry=ctx.settings.retry,
        on_bytes=on_bytes,
    )
    return FileRecord(name=dest.name, size=stats.size, resources=stats.resources)


# --- CRTDL -------------------------------------------------------------------------------------------------


def is_result_url(job_input: str | None) -> bool:
    return bool(job_input) and job_input.lower().startswith(("http://", "https://"))


def prepare_crtdl(ctx: StepContext) -> Path:
    """The job's one CRTDL (procedure step 1): the input copied, or enriched when preprocessing has rules.

    An existing copy is kept, so a resubmission after ``continue`` sends what the first submission sent.
    """
    preprocessing = ctx.settings.services.crtdl_preprocessing
    enrich = preprocessing.enabled and bool(preprocessing.rules)
    target = ctx.job_dir / (ENRICHED_CRTDL_NAME if enrich else CRTDL_NAME)
    if target.is_file():
        return target
    source = crtdl_source(ctx.job_input)
    data = source.read_bytes()
    crtdl = parse_crtdl(data, source)
    if enrich:
        crtdl, warnings = enrich_crtdl(crtdl, preprocessing.rules)
        for warning in warnings:
            get_run_logger().warning("CRTDL preprocessing: %s", warning)
        data = orjson.dumps(crtdl, option=orjson.OPT_INDENT_2)
    write_file_atomically(target, data)
    return target


def crtdl_source(job_input: str | None) -> Path:
    if not job_input:
        raise ExtractionError("the extractor step needs a CRTDL file (or a complete result URL) as the job input")
    source = Path(job_input).expanduser()
    if not source.is_file():
        problem = "is a directory" if source.is_dir() else "does not exist"
        raise ExtractionError(f"CRTDL {source} {problem}; give the CRTDL JSON file as the job input")
    return source


# --- submission and polling ----------------------------------------------------------------------------------


def handle_record(crtdl_path: Path | None, handle: ExtractionHandle, generation: int) -> dict:
    return {
        "crtdl_path": str(crtdl_path) if crtdl_path else None,
        "status_url": handle.status_url,
        "extraction_job_id": handle.job_id,
        "generation": generation,
    }


def current_record(ctx: StepContext, client: ExtractionServerClient, crtdl_path: Path | None) -> dict:
    """The handle to follow: the newest persisted generation (re-attach), else a first submission."""
    if crtdl_path is None:
        assert ctx.job_input is not None
        return ctx.run_cached(remember_result_url, "record", {"result_url": ctx.job_input}, ctx, ctx.job_input)
    newest = read_newest_result(ctx.paths, ctx.position, ctx.step, "record") or {}
    return submission(ctx, client, crtdl_path, int(newest.get("generation", 0)))


def submission(ctx: StepContext, client: ExtractionServerClient, crtdl_path: Path, generation: int) -> dict:
    return ctx.run_cached(submit_extraction, "record", {"generation": generation}, ctx, client, crtdl_path, generation)


def wait_for_result(
    ctx: StepContext, client: ExtractionServerClient, record: dict, crtdl_path: Path | None
) -> tuple[dict, list[str]]:
    """Poll until complete; a dead handle is replaced by a fresh submission, at most retry.max_attempts times."""
    logger = get_run_logger()
    reporter = ProgressReporter(ctx)
    attempts = ctx.settings.retry.max_attempts
    fresh_submissions = 0
    while True:
        handle = ExtractionHandle(record["status_url"], record["extraction_job_id"])
        logger.info("waiting for extraction job %s", handle.job_id)
        try:
            urls = client.poll_until_complete(handle, reporter)
        except DeadHandleError as exc:
            if crtdl_path is None:
                raise ExtractionError(f"{exc}; the result URL given as the job input is no longer valid") from exc
            if fresh_submissions >= attempts:
                raise ExtractionError(
                    f"{exc}; the server lost the job again after {fresh_submissions} fresh submission(s) "
                    f"(retry.max_attempts = {attempts}); check the extraction server's job store and logs"
                ) from exc
            fresh_submissions += 1
            logger.warning("%s; submitting the extraction again (%d of %d)", exc, fresh_submissions, attempts)
            record = submission(ctx, client, crtdl_path, int(record["generation"]) + 1)
            continue
        reporter.finish(len(urls))
        return record, urls


class ProgressReporter:
    """Shows polling progress in the log (when it changes) and as a Prefect progress artifact (<= 1/s)."""

    def __init__(self, ctx: StepContext):
        self._key = artifact_key(ctx.job_id, f"{ctx.position:02d}", ctx.step, "progress")
        self._artifact: UUID | None = None
        self._last_text: str | None = None
        self._last_update = float("-inf")
        self._percent = 0.0

    def __call__(self, progress: PollProgress) -> None:
        text = progress.describe()
        if text != self._last_text:
            get_run_logger().info("extraction: %s", text)
            self._last_text = text
        self._percent = progress.percent if progress.percent is not None else self._percent
        if time.monotonic() - self._last_update >= ARTIFACT_EVERY_SECONDS:
            self._publish(self._percent, f"Extraction: {text}")

    def finish(self, files: int) -> None:
        self._publish(100.0, f"Extraction complete: {files} file(s) to download")

    def _publish(self, percent: float, description: str) -> None:
        self._last_update = time.monotonic()
        if self._artifact is None:
            self._artifact = create_progress_artifact(percent, key=self._key, description=description)
        else:
            update_progress_artifact(self._artifact, percent, description=description)


# --- downloads -----------------------------------------------------------------------------------------------


def download_result_files(ctx: StepContext, client: ExtractionServerClient, urls: list[str]) -> list[FileRecord]:
    """Download every file (cached per URL), ``core`` first in the record; raise the first failure after all
    others have ended, so every file that could be finished is kept for ``continue``.

    On an interrupt (Ctrl+C, SIGTERM) the downloads in flight stop at their next chunk, no new file starts, and
    after a grace of ``CANCEL_GRACE_SECONDS`` every temporary file is removed; the workers are daemon threads,
    so a stalled read never delays the exit beyond that.
    """
    names = target_names(urls, compress=ctx.compression_level is not None)
    cancelled = threading.Event()
    with track(f"download {len(names)} file(s)") as progress:
        on_bytes = cancellable(cancelled, thread_safe(progress.advance))
        calls = [
            functools.partial(
                contextvars.copy_context().run,
                ctx.run_cached,
                download_result_file,
                "file",
                {"url": url},
                ctx,
                client,
                url,
                ctx.folder / name,
                on_bytes,
            )
            for url, name in names.items()
        ]
        try:
            outcomes = run_bounded(calls, DOWNLOAD_CONCURRENCY, cancelled)
        except BaseException:
            remove_partial_files(ctx.folder)
            raise
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if errors:
        raise errors[0]
    return sorted(outcomes, key=lambda r: (not r["name"].startswith("core."), r["name"]))


class DownloadCancelled(Exception):
    """Raised inside a download when the run is being interrupted."""


def cancellable(cancelled: threading.Event, advance: Callable[[int], None]) -> Callable[[int], None]:
    def checked(amount: int) -> None:
        if cancelled.is_set():
            raise DownloadCancelled("the run was interrupted")
        advance(amount)

    return checked


def run_bounded(calls: list[Callable[[], FileRecord]], workers: int, cancelled: threading.Event) -> list:
    """Run ``calls`` on at most ``workers`` daemon threads; each outcome is a result or the exception raised.

    The caller's thread waits in short joins, so a signal reaches it at once.
    """
    outcomes: list = [None] * len(calls)
    pending = queue.SimpleQueue()
    for index in range(len(calls)):
        pending.put(index)

    def work() -> None:
        while not cancelled.is_set():
            try:
                index = pending.get_nowait()
            except queue.Empty:
                return
            try:
                outcomes[index] = calls[index]()
            except Exception as exc:  # kept for the caller, which raises the first one
                outcomes[index] = exc

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(calls)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except BaseException:
        # Give the workers a moment to notice and discard their files; a stalled read is not waited for.
        cancelled.set()
        grace_ends = time.monotonic() + CANCEL_GRACE_SECONDS
        for thread in threads:
            thread.join(max(0.0, grace_ends - time.monotonic()))
        raise
    return outcomes


def thread_safe(advance: Callable[[int], None]) -> Callable[[int], None]:
    lock = threading.Lock()

    def locked(amount: int) -> None:
        with lock:
            advance(amount)

    return locked
