"""The ``http_import`` step: fetch one NDJSON file from an HTTP(S) URL (the job input) into ``import/``.

The URL is fetched through the client layer with no credentials (there is no auth block for it); ``tls`` and
``retry`` apply. Naming, compression and counting follow the extractor's downloads (``tasks.clients.downloads``):
the file is named after the URL's last segment, forced to ``.ndjson`` (+ ``.zst``). A non-200 answer, an HTML
page or a body that is not NDJSON is an error and leaves no file. The fetch is a cached sub-task keyed by the
URL, so ``continue`` does not fetch a finished file again. The stall timeout is the built-in default of
``services.extractor.download_stall_timeout`` (1 minute): this step has no settings block of its own.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prefect import task

from config.settings import ExtractorSettings
from tasks.clients.downloads import display_url, download_ndjson, safe_file_name
from tasks.clients.http import ServiceEndpoint, build_client, http_timeout
from tasks.context import FileRecord, StepContext, StepOutput
from tasks.ndjson import remove_partial_files
from tasks.progress import track

STALL_TIMEOUT = ExtractorSettings.DEFAULT_DOWNLOAD_STALL_TIMEOUT


class HttpImportError(Exception):
    """Bad http_import input; the message says what is wrong and what to do."""


@task(name="http_import")
def http_import(ctx: StepContext, previous: StepOutput | None = None) -> StepOutput:
    url = source_url(ctx.job_input)
    name = safe_file_name(url, compress=ctx.compression_level is not None)
    remove_partial_files(ctx.folder)
    record = ctx.run_cached(fetch_url, "file", {"url": url}, ctx, url, ctx.folder / name)
    return ctx.output([record], source=display_url(url))


@task(name="fetch-url")
def fetch_url(ctx: StepContext, url: str, dest: Path) -> FileRecord:
    endpoint = ServiceEndpoint("http_import", origin(url), None, http_timeout(STALL_TIMEOUT))
    with build_client(endpoint, ctx.settings.tls) as client, track(f"download {dest.name}") as progress:
        stats = download_ndjson(
            client,
            url,
            dest,
            level=ctx.compression_level,
            max_line_bytes=ctx.max_line_bytes,
            stall_timeout=STALL_TIMEOUT,
            retry=ctx.settings.retry,
            on_bytes=progress.advance,
        )
    return FileRecord(name=dest.name, size=stats.size, resources=stats.resources)


def source_url(job_input: str | None) -> str:
    if not job_input:
        raise HttpImportError("http_import needs the URL of an NDJSON file as the job input")
    try:
        scheme = httpx.URL(job_input).scheme
    except httpx.InvalidURL as exc:
        raise HttpImportError(f"http_import: {job_input!r} is not a valid URL ({exc})") from exc
    if scheme not in ("http", "https"):
        raise HttpImportError(f"http_import: {display_url(job_input)} is not an http(s) URL; give the file's URL")
    return job_input


def origin(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path="/", query=None, fragment=None, userinfo=b"")).rstrip("/")
