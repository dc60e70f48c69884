"""The ``http_import`` step: fetch one NDJSON file by HTTP(S) into ``import/``.

See docs/development.md#steps.
"""

from pathlib import Path

import httpx

from config.services import STALL_TIMEOUT
from config.settings import Settings
from tasks.clients.downloads import safe_file_name
from tasks.clients.http import ServiceEndpoint, build_client
from tasks.job.contract import (
    DataFile,
    StepInput,
    StepResult,
    commit_each,
    file_task,
    settings_of,
    step_task,
)
from tasks.core.errors import StepError
from tasks.job.steps import compression_shape, download_tracked
from tasks.streams.ndjson import FileStats
from tasks.streams.progress import expect_files
from tasks.core.url_credentials import shown_url


@step_task("http_import")
def http_import(step: StepInput) -> StepResult:
    url = source_url(step.job_input)
    name = safe_file_name(url, compress=settings_of(step).compression.enabled)
    expect_files(1)
    record = commit_each(fetch_url, step, url, name)
    return step.result([record], source=shown_url(url))


@file_task("fetch-url", "fetch[{name}]")
def fetch_url(step: StepInput, url: str, name: str) -> DataFile:
    return DataFile.written(name, fetch_ndjson(url, step.output_dir / name, settings_of(step)))


def fetch_ndjson(url: str, dest: Path, settings: Settings) -> FileStats:
    endpoint = ServiceEndpoint("http_import", origin(url), None, STALL_TIMEOUT)
    with build_client(endpoint, settings.tls) as client:
        return download_tracked(client, url, dest, settings, STALL_TIMEOUT)


def source_url(job_input: str | None) -> str:
    if not job_input:
        raise StepError("http_import needs the URL of an NDJSON file as the job input")
    try:
        scheme = httpx.URL(job_input).scheme
    except httpx.InvalidURL as exc:
        raise StepError(f"http_import: {shown_url(job_input)} is not a valid URL ({exc})") from None
    if scheme not in ("http", "https"):
        raise StepError(
            f"http_import: {shown_url(job_input)} is not an http(s) URL; give the file's URL"
        )
    return job_input


def origin(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode()}"  # netloc: host and port, no userinfo


shaped_settings = compression_shape  # what the step's files depend on besides its input
