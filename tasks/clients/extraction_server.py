"""Client of the extraction server (TORCH): submit a CRTDL, poll the job, read the result's file URLs.

Plain Python, no Prefect. Follows /work/shared/spec/extraction-server-api.md and the real server's
deviations in protocols.md (kick-off answers 202; X-Progress header; CANCELLED is 410; progress extension
url ``https://torch.mii.de/fhir/torch-job-progress``).

- ``submit`` posts once and never retries (a retry could start a second job): ``call_once``, the visible opt-out
  of ``tasks.clients.retry``'s policy.
- ``poll_until_complete`` implements the poll table of pipeline-tool.md ("States and transitions"): 202/102
  progress, 200 done, 404/410 ``DeadHandleError`` (the caller decides to submit again), 500
  ``ExtractionFailedError``, 408/429/other 5xx and network failures retried after the back-off, other 4xx
  terminal. The back-off doubles from ``polling_interval`` to ``max_polling_interval``; only
  ``extraction_timeout`` without a 200/202 ends the wait. Time is injectable (``clock``, ``sleep``).
- One GET per poll iteration (pipeline-tool.md, procedure step 4). Progress: the X-Progress header (or the
  OperationOutcome diagnostics) of that answer; the batches done/total of the Task's progress extension are read
  besides only while batches run, at most once per ``TASK_PROGRESS_INTERVAL``, and never again once the server
  shows it has no Task API (404/405/501) — failures there are ignored.
- Status answers are read bounded: a completed job's manifest up to ``MAX_MANIFEST_BYTES`` (more is refused as
  soon as the wire or Content-Length shows it), any other answer up to ``MAX_STATUS_BODY_BYTES`` (the rest is
  not read: only its progress or error text matters). A manifest listing more than
  ``services.extractor.max_result_files`` outputs is refused before any URL is resolved.
- URLs from the server (Content-Location, the manifest's ``request`` and output URLs) with a user name or
  password are refused (tasks.core.url_credentials), never followed: httpx would send them as Basic auth.
- ``requiresAccessToken: true``: the configured credentials also go to the result files' origins, but only to
  base_url's origin or one listed in ``services.extractor.file_origins``; any other origin is an error naming
  it and the key. Without it, credentials go to base_url's origin only.
- ``ExtractionTaskClient``: the operator's Task API (search, read, $pause/$resume/$cancel, priority PUT with
  If-Match and re-read on 409/412, DELETE) and the cohort preview ``$evaluate-cohort`` (404: not supported).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from tasks.clients.errors import (
    ServiceError,
    error_from_response,
    is_transient_network_error,
    is_transient_status,
    network_error,
    operation_outcome_texts,
    parse_retry_after,
    raise_for_service_status,
)
from tasks.core.errors import StepError
from tasks.clients.auth import Origin, ServiceAuth, origin_of
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client, http_timeout
from tasks.clients.retry import call_once
from tasks.core.url_credentials import SERVER_URL_FIX, refuse_credentials_in_url

if TYPE_CHECKING:
    from config.services import ExtractorSettings
    from config.settings import RetrySettings, TlsSettings

log = logging.getLogger("dupflow.extractor")

SERVICE = "extractor"
FHIR_JSON = "application/fhir+json"
SUBMIT_PATH = "/fhir/$extract-data"
SUBMIT_TIMEOUT = timedelta(seconds=60)
POLL_TIMEOUT = timedelta(seconds=30)
TASK_TIMEOUT = timedelta(seconds=10)
# Batch progress from the Task API at most this often (the spec's poll is one GET; this is a rare extra read).
TASK_PROGRESS_INTERVAL = timedelta(minutes=2)
NO_TASK_API = (404, 405, 501)
BATCHES_RUNNING = re.compile(r"Processing batches|RUNNING_PROCESS_BATCH")
# A completed job's manifest: ~150 bytes per output entry, so 32 MiB holds over 200,000 entries (more than the
# default services.extractor.max_result_files of 100,000) and is refused long before it costs much memory.
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
# Any other status answer (progress, errors): only its first MiB is read.
MAX_STATUS_BODY_BYTES = 1024 * 1024
# Headers that no longer describe a body read and decoded here.
BODY_FRAMING_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
# The spec's {extension_base}/extractor-job-progress and the real server's torch-job-progress.
PROGRESS_EXTENSION_SUFFIXES = ("/extractor-job-progress", "/torch-job-progress")
ISSUES_EXTENSION_SUFFIXES = ("extractor-job-issues", "torch-job-issues")
IN_PROGRESS = (102, 202)
DEAD_HANDLE = (404, 410)
JOB_FAILED = 500
NO_MATCHING_DATA = (
    "the extraction finished without result files: no data matched the CRTDL. Typical causes: the cohort "
    "criteria matched no patient, the time period is out of range of the data, or the cohort or a profile "
    "is unknown to the server; check the CRTDL"
)


class ExtractionError(StepError):
    """A terminal failure of the extraction; the message says what happened and what to do."""


class InvalidCrtdlError(ExtractionError):
    pass


class DeadHandleError(ExtractionError):
    """The server no longer knows the job (404/410 on a status poll)."""

    def __init__(self, handle: ExtractionHandle, status_code: int):
        self.handle = handle
        super().__init__(
            f"extraction job {handle.job_id} is gone from the extraction server (HTTP {status_code} on "
            f"{handle.status_url})",
            status_code=status_code,
        )


class ExtractionFailedError(ExtractionError):
    pass


class ExtractionTimeoutError(ExtractionError):
    pass


class NoMatchingDataError(ExtractionError):
    pass


@dataclass(frozen=True)
class ExtractionHandle:
    status_url: str
    job_id: str

    @classmethod
    def from_status_url(cls, status_url: str) -> ExtractionHandle:
        """The extraction job ID is the last path segment of the status URL."""
        return cls(status_url, httpx.URL(status_url).path.rstrip("/").rsplit("/", 1)[-1])


@dataclass(frozen=True)
class PollProgress:
    """What the server tells about a running job. Batches are known once the cohort query has finished."""

    text: str | None
    batches_completed: int | None = None
    batches_total: int | None = None

    @property
    def percent(self) -> float | None:
        if self.batches_total:
            return 100.0 * (self.batches_completed or 0) / self.batches_total
        match = re.search(r"(\d+(?:\.\d+)?)\s*%", self.text or "")
        return float(match.group(1)) if match else None

    def describe(self) -> str:
        parts = [self.text or "running"]
        if self.batches_total is not None:
            parts.append(f"batches {self.batches_completed or 0}/{self.batches_total}")
        return ", ".join(parts)


ProgressCallback = Callable[[PollProgress], None]


def parse_crtdl(data: bytes, source: str | Path) -> dict[str, Any]:
    """The CRTDL as a JSON object; anything else is an ``InvalidCrtdlError`` naming ``source``."""
    try:
        crtdl = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidCrtdlError(f"invalid CRTDL {source}: not valid JSON ({exc}); nothing was submitted") from exc
    if not isinstance(crtdl, dict):
        raise InvalidCrtdlError(f"invalid CRTDL {source}: expected a JSON object; nothing was submitted")
    return crtdl


def kickoff_parameters(crtdl: bytes) -> dict[str, Any]:
    return {
        "resourceType": "Parameters",
        "parameter": [{"name": "crtdl", "valueBase64Binary": base64.b64encode(crtdl).decode("ascii")}],
    }


class ExtractionServerClient:
    """One extraction server, as configured by ``services.extractor``. Use as a context manager."""

    def __init__(
        self,
        settings: ExtractorSettings,
        tls: TlsSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not settings.base_url:
            raise ExtractionError("services.extractor.base_url is not set; set it to the extraction server's URL")
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.clock, self.sleep = clock, sleep
        timeout = http_timeout(min(POLL_TIMEOUT, settings.extraction_timeout))
        self.http = build_client(ServiceEndpoint(SERVICE, self.base_url, settings.auth, timeout), tls)
        self.files_need_token = False  # the manifest's requiresAccessToken, once the job is complete
        self._task_api = True
        self._last_task_read = float("-inf")
        self._batches: tuple[int, int] | None = None

    def __enter__(self) -> ExtractionServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # --- submission --------------------------------------------------------------------------------------

    def submit(self, crtdl: bytes) -> ExtractionHandle:
        """POST $extract-data exactly once (``call_once``: it opts out of retry, since a second
        request could start a second job); the status URL from Content-Location, made absolute. A failure leaves
        the submission in doubt for the extraction step to settle."""
        operation = "submit extraction"

        def attempt() -> httpx.Response:
            response = self.http.post(
                self.base_url + SUBMIT_PATH,
                content=json.dumps(kickoff_parameters(crtdl)).encode(),
                headers={"Content-Type": FHIR_JSON, "Accept": FHIR_JSON},
                timeout=http_timeout(SUBMIT_TIMEOUT),
            )
            raise_for_service_status(response, operation=operation, service=SERVICE)
            return response

        response = call_once(attempt, operation=operation, service=SERVICE)
        if response.status_code not in (200, 202):
            raise ExtractionError(
                f"submit extraction: the server answered HTTP {response.status_code}, expected 200 or 202"
            )
        location = response.headers.get("Content-Location")
        if not location:
            raise ExtractionError(
                "submit extraction: the server accepted the request but sent no Content-Location header, so the "
                "job cannot be followed; check base_url points at the extraction server (not a proxy page)"
            )
        refuse_credentials_in_url(location, door="the kick-off answer's Content-Location header", fix=SERVER_URL_FIX)
        return ExtractionHandle.from_status_url(str(response.url.join(location)))

    # --- polling -----------------------------------------------------------------------------------------

    def poll_until_complete(self, handle: ExtractionHandle, on_progress: ProgressCallback | None = None) -> list[str]:
        """Poll until the job is complete and return the absolute URLs of its result files."""
        interval = self.settings.polling_interval.total_seconds()
        cap = self.settings.max_polling_interval.total_seconds()
        window = self.settings.extraction_timeout.total_seconds()
        last_contact = self.clock()
        while True:
            response = self._poll_once(handle)
            retry_after = None
            if response is not None:
                if response.status_code == 200:
                    return self.result_file_urls(response)
                if response.status_code in IN_PROGRESS:
                    last_contact = self.clock()
                    if on_progress is not None:
                        on_progress(self.progress(handle, response))
                else:
                    self._raise_unless_transient(handle, response)
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
            silent_for = self.clock() - last_contact
            if silent_for >= window:
                raise self._timeout(handle)
            self.sleep(min(retry_after if retry_after is not None else interval, cap, window - silent_for))
            interval = min(interval * 2, cap)

    def _poll_once(self, handle: ExtractionHandle) -> httpx.Response | None:
        """One status GET; a transient network failure is swallowed (None): the liveness window is the net."""
        try:
            with self.http.stream("GET", handle.status_url, headers={"Accept": "application/json"}) as response:
                return bounded_answer(response)
        except httpx.TransportError as exc:
            if not is_transient_network_error(exc):
                raise network_error(exc, operation="poll extraction status", service=SERVICE) from exc
            log.warning(
                "extractor: status poll of job %s failed (%s: %s); polling again",
                handle.job_id,
                type(exc).__name__,
                exc,
            )
            return None

    def _raise_unless_transient(self, handle: ExtractionHandle, response: httpx.Response) -> None:
        status = response.status_code
        if status in DEAD_HANDLE:
            raise DeadHandleError(handle, status)
        if status == JOB_FAILED:
            texts = operation_outcome_texts(response.content)
            reason = "; ".join(texts) if texts else "the server gave no reason"
            raise ExtractionFailedError(
                f"extraction job {handle.job_id} failed on the extraction server (HTTP 500): {reason}. "
                "Fix the cause, then start a new job"
            )
        if is_transient_status(status):
            log.warning("extractor: status poll of job %s answered HTTP %d; polling again", handle.job_id, status)
            return
        if status >= 400:
            raise error_from_response(response, operation="poll extraction status", service=SERVICE)
        raise ExtractionError(f"poll extraction status: unexpected HTTP {status} from {handle.status_url}")

    def _timeout(self, handle: ExtractionHandle) -> ExtractionTimeoutError:
        window = self.settings.extraction_timeout
        return ExtractionTimeoutError(
            f"extraction timeout: the extraction server gave no 200/202 answer for job {handle.job_id} for "
            f"{window.total_seconds():g} s (services.extractor.extraction_timeout). The job may still run: "
            "continue re-attaches to it; raise services.extractor.extraction_timeout if the server is slow"
        )

    # --- progress ----------------------------------------------------------------------------------------

    def progress(self, handle: ExtractionHandle, response: httpx.Response) -> PollProgress:
        text = response.headers.get("X-Progress") or next(iter(operation_outcome_texts(response.content)), None)
        if self._task_read_due(text):
            self._batches = self.task_batches(handle.job_id) or self._batches
        return PollProgress(text, *(self._batches or (None, None)))

    def _task_read_due(self, text: str | None) -> bool:
        """Only while batches run (before, the Task has no batches), where the server has the Task API, and at
        most once per ``TASK_PROGRESS_INTERVAL``."""
        if not (self._task_api and text and BATCHES_RUNNING.search(text)):
            return False
        return self.clock() - self._last_task_read >= TASK_PROGRESS_INTERVAL.total_seconds()

    def task_batches(self, job_id: str) -> tuple[int, int] | None:
        """(batches completed, batches total) from the Task's progress extension; None if not (yet) there."""
        self._last_task_read = self.clock()
        try:
            response = self.http.get(
                f"{self.base_url}/fhir/Task/{job_id}", headers={"Accept": FHIR_JSON}, timeout=http_timeout(TASK_TIMEOUT)
            )
            if response.status_code in NO_TASK_API:
                self._task_api = False
            raise_for_service_status(response, operation="read task", service=SERVICE)
            return batches_from_task(response.json())
        except Exception as exc:  # progress is informational: any failure just means "unknown"
            log.debug("extractor: no task progress for %s (%s)", job_id, type(exc).__name__)
            return None

    # --- result ------------------------------------------------------------------------------------------

    def result_file_urls(self, response: httpx.Response) -> list[str]:
        try:
            document = orjson.loads(response.content)  # orjson bounds the nesting depth (json recurses)
        except (orjson.JSONDecodeError, RecursionError) as exc:
            raise ExtractionError(
                "the completed extraction's answer is not JSON (or nested deeper than JSON's sane limits); "
                "cannot find the result files"
            ) from exc
        refuse_credentials_in_url(manifest_request(document), door="the manifest's request URL", fix=SERVER_URL_FIX)
        urls = [self.resolve_url(url) for url in result_urls(document, self.settings.max_result_files)]
        for url in urls:
            refuse_credentials_in_url(url, door="a result file URL of the manifest", fix=SERVER_URL_FIX)
        if requires_access_token(document):
            self.trust_file_origins(urls)
        return urls

    def resolve_url(self, url: str) -> str:
        return resolve_file_url(self.base_url, url)

    def trust_file_origins(self, urls: Sequence[str]) -> None:
        """The files need a token: send the credentials to their origins too, if each is base_url's origin or
        listed in ``services.extractor.file_origins`` (else an error naming the origin and the key)."""
        self.files_need_token = True
        auth = self.http.auth
        assert isinstance(auth, ServiceAuth)
        allowed = {origin_of(origin) for origin in self.settings.file_origins}
        for origin in dict.fromkeys(origin_of(url) for url in urls):
            if origin == auth.origin:
                continue
            if origin not in allowed:
                raise ExtractionError(unapproved_origin_message(origin))
            auth.trust(origin)


def unapproved_origin_message(origin: Origin) -> str:
    scheme, host, port = origin
    return (
        f"the extraction server says its result files need an access token (requiresAccessToken), but they are "
        f"on {scheme}://{host}:{port}, another origin than services.extractor.base_url; dupflow sends credentials "
        f"only where you approve: add {scheme}://{host}:{port} to services.extractor.file_origins if that file "
        "server is yours, then continue the job"
    )


def bounded_answer(response: httpx.Response) -> httpx.Response:
    """A status answer with its body read from the wire up to a limit: a manifest (200) over
    ``MAX_MANIFEST_BYTES`` is refused, any other answer is cut at ``MAX_STATUS_BODY_BYTES``."""
    complete = response.status_code == 200
    limit = MAX_MANIFEST_BYTES if complete else MAX_STATUS_BODY_BYTES
    declared = response.headers.get("Content-Length", "")
    if complete and declared.isdigit() and int(declared) > limit:
        raise manifest_too_large(f"{int(declared):,} bytes (its Content-Length)")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            if complete:
                raise manifest_too_large(f"more than {limit:,} bytes")
            del body[limit:]
            break
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in BODY_FRAMING_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=bytes(body), request=response.request)


def manifest_too_large(size: str) -> ExtractionError:
    return ExtractionError(
        f"the completed extraction's manifest is {size}, over the limit of {MAX_MANIFEST_BYTES:,} bytes "
        "(tasks.clients.extraction_server.MAX_MANIFEST_BYTES, room for well over 100,000 result files); the job "
        "lists too many files to download sensibly: split the extraction (a smaller cohort or fewer attribute "
        "groups per CRTDL) or check the server"
    )


def manifest_request(document: Any) -> str | None:
    """The manifest's ``request`` (the status URL), or the Parameters' ``request`` value; None if absent."""
    if isinstance(document, dict) and document.get("resourceType") == "Parameters":
        parameters = [p for p in document.get("parameter") or [] if isinstance(p, dict)]
        return next((_value(p) for p in parameters if p.get("name") == "request"), None)
    request = document.get("request") if isinstance(document, dict) else None
    return request if isinstance(request, str) else None


def requires_access_token(document: Any) -> bool:
    """The manifest's (or the Parameters') ``requiresAccessToken`` is true."""
    if isinstance(document, dict) and document.get("resourceType") == "Parameters":
        return any(
            p.get("name") == "requiresAccessToken" and p.get("valueBoolean") is True
            for p in document.get("parameter") or []
            if isinstance(p, dict)
        )
    return isinstance(document, dict) and document.get("requiresAccessToken") is True


def batches_from_task(task: Any) -> tuple[int, int] | None:
    for extension in task.get("extension") or [] if isinstance(task, dict) else []:
        if isinstance(extension, dict) and str(extension.get("url", "")).endswith(PROGRESS_EXTENSION_SUFFIXES):
            values = {
                e.get("url"): e.get("valueInteger") for e in extension.get("extension") or [] if isinstance(e, dict)
            }
            done, total = values.get("batchesCompleted"), values.get("batchesTotal")
            if isinstance(done, int) and isinstance(total, int):
                return done, total
    return None


def result_urls(document: Any, max_files: int) -> list[str]:
    """The file URLs of a completed job, from a manifest (``output[].url``) or a Parameters resource
    (``output`` parameters with a ``url`` part). No URL: ``NoMatchingDataError`` with the server's errors.
    More than ``max_files`` entries: an ``ExtractionError`` before any URL is taken."""
    refuse_too_many_outputs(document, max_files)
    if isinstance(document, dict) and document.get("resourceType") == "Parameters":
        urls, errors = _parameters_urls(document)
    elif isinstance(document, dict) and isinstance(document.get("output"), list):
        urls, errors = _manifest_urls(document)
    else:
        raise ExtractionError("the completed extraction's answer is neither a manifest nor a Parameters resource")
    if urls:
        return urls
    if errors:
        raise NoMatchingDataError(
            "the extraction finished without result files; the server reported: " + "; ".join(errors)
        )
    raise NoMatchingDataError(NO_MATCHING_DATA)


def refuse_too_many_outputs(document: Any, max_files: int) -> None:
    entries = document.get("output") if isinstance(document, dict) else None
    if isinstance(document, dict) and document.get("resourceType") == "Parameters":
        entries = document.get("parameter")
    if isinstance(entries, list) and len(entries) > max_files:
        raise ExtractionError(
            f"the completed extraction's manifest lists {len(entries):,} entries, more than "
            f"services.extractor.max_result_files ({max_files:,}); split the extraction (a smaller cohort or fewer "
            "attribute groups per CRTDL), or raise max_result_files if the files really are wanted"
        )


def _manifest_urls(manifest: dict) -> tuple[list[str], list[str]]:
    urls = [o["url"] for o in manifest["output"] if isinstance(o, dict) and isinstance(o.get("url"), str)]
    errors = [_error_entry_text(e) for e in manifest.get("error") or []]
    for extension in manifest.get("extension") or []:
        if isinstance(extension, dict) and str(extension.get("url", "")).endswith(ISSUES_EXTENSION_SUFFIXES):
            errors += [_issue_text(i) for i in extension.get("valueObject") or [] if isinstance(i, dict)]
    return urls, [e for e in errors if e]


def _error_entry_text(entry: Any) -> str:
    if isinstance(entry, dict):
        return f"error file {entry['url']}" if isinstance(entry.get("url"), str) else json.dumps(entry)[:500]
    return str(entry)


def _issue_text(issue: dict) -> str:
    parts = [str(issue[k]) for k in ("severity", "msg", "diagnostics") if issue.get(k)]
    return ": ".join(parts[:1] + [" - ".join(parts[1:])]) if len(parts) > 1 else "".join(parts)


def _parameters_urls(parameters: dict) -> tuple[list[str], list[str]]:
    urls, errors = [], []
    for parameter in parameters.get("parameter") or []:
        if not isinstance(parameter, dict):
            continue
        parts = {p.get("name"): _value(p) for p in parameter.get("part") or [] if isinstance(p, dict)}
        if parameter.get("name") == "output" and parts.get("url"):
            urls.append(parts["url"])
        elif parameter.get("name") == "error":
            errors.append(parts.get("diagnostics") or _value(parameter) or "error")
    return urls, errors


def _value(element: dict) -> str | None:
    for key in ("valueUri", "valueUrl", "valueString", "valueCode"):
        if isinstance(element.get(key), str):
            return element[key]
    return None


def resolve_file_url(base_url: str, url: str) -> str:
    """Absolute URLs are kept; ``host[:port]/path`` inherits base_url's scheme; other paths resolve
    against base_url (``/files/x`` against its origin, ``files/x`` against its path)."""
    base = httpx.URL(base_url.rstrip("/") + "/")
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", url):
        return url
    if url.startswith("//"):
        return f"{base.scheme}:{url}"
    first, slash, _ = url.partition("/")
    if slash and _looks_like_host(first):
        return f"{base.scheme}://{url}"
    return str(base.join(url))


def _looks_like_host(segment: str) -> bool:
    """``127.0.0.1:8080``, ``files.example.org``, ``localhost:80`` — not ``files`` or ``job-1``."""
    host = segment.rsplit(":", 1)[0] if re.search(r":\d+$", segment) else segment
    return bool(host) and (host == "localhost" or host != segment or "." in host)


# --- Task API and cohort preview ---------------------------------------------------------------------------
#
# The operator's side of the server (``python -m flows.run extraction …`` and ``cohort preview``): list,
# read, pause, resume, cancel, reprioritise and delete jobs through the FHIR Task API, and evaluate a cohort
# without starting a job. Every call goes through ``ServiceClient`` (retry and classification by default);
# failures are ``ServiceError``s, the subclasses below for the answers an operator needs explained.

JOB_STATUSES = (
    "PENDING",
    "RUNNING_GET_COHORT",
    "RUNNING_PROCESS_BATCH",
    "RUNNING_PROCESS_CORE",
    "PAUSED",
    "TEMP_FAILED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
)
RUNNING_STATUSES = frozenset({"RUNNING_GET_COHORT", "RUNNING_PROCESS_BATCH", "RUNNING_PROCESS_CORE"})
FINAL_STATUSES = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
HIGH_TASK_PRIORITIES = frozenset({"asap", "stat", "urgent"})
TASK_PRIORITY_FOR = {"high": "asap", "normal": "routine"}
# A stale If-Match answers 409 in the spec and 412 on the real server: the version moved on, read it again.
STALE_VERSION = (409, 412)
PRIORITY_ATTEMPTS = 5
COHORT_PREVIEW_TIMEOUT = timedelta(minutes=10)
CONSENT_AUDIT_TEXT = "Consent audit NDJSON"
# Per operation: the states the job ends in (already there means nothing to do) and why a 409 happens.
CONTROL_OPERATIONS = {
    "pause": ({"PAUSED"}, "only running jobs can be paused"),
    "resume": (set(RUNNING_STATUSES), "only paused jobs can be resumed"),
    "cancel": ({"CANCELLED"}, "only jobs that have not finished can be cancelled"),
}


class JobNotFoundError(ServiceError):
    """The server knows no job with this id (404)."""


class TransitionRefusedError(ServiceError):
    """$pause, $resume or $cancel is not allowed in the job's state (409); ``job_status`` is that state."""

    def __init__(self, operation: str, message: str, job_status: str | None):
        self.job_status = job_status
        super().__init__(operation, 409, message, transient=False, service=SERVICE)


class SearchRejectedError(ServiceError):
    """A strict Task search that the server refused (400); ``problems`` lists what was wrong."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("search extraction jobs", 400, "; ".join(problems), transient=False, service=SERVICE)


class VersionConflictError(ServiceError):
    """The Task's version kept moving while we tried to change its priority."""


class CohortPreviewUnsupportedError(ServiceError):
    """The server has no $evaluate-cohort (older servers answer 404)."""


@dataclass(frozen=True)
class ExtractionJob:
    """One job as the Task API shows it. Progress fields are None until the cohort query has finished."""

    id: str
    status: str  # the JobStatus code (Task.businessStatus), e.g. RUNNING_PROCESS_BATCH
    priority: str  # HIGH or NORMAL
    version: str | None
    authored_on: str | None
    last_updated: str | None
    cohort_size: int | None = None
    batch_size: int | None = None
    batches_total: int | None = None
    batches_completed: int | None = None
    active_batches: tuple[tuple[str, str | None], ...] = ()  # (batch id, stage)
    consent_audit_files: tuple[str, ...] = ()

    @classmethod
    def from_task(cls, task: dict[str, Any]) -> ExtractionJob:
        meta = task.get("meta") if isinstance(task.get("meta"), dict) else {}
        progress = _progress_values(task)
        return cls(
            id=str(task.get("id")),
            status=_job_status(task),
            priority="HIGH" if task.get("priority") in HIGH_TASK_PRIORITIES else "NORMAL",
            version=meta.get("versionId"),
            authored_on=task.get("authoredOn"),
            last_updated=meta.get("lastUpdated"),
            cohort_size=progress.get("cohortSize"),
            batch_size=progress.get("batchSize"),
            batches_total=progress.get("batchesTotal"),
            batches_completed=progress.get("batchesCompleted"),
            active_batches=progress.get("activeBatch", ()),
            consent_audit_files=_consent_audit_files(task),
        )

    def as_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["active_batches"] = [{"batch_id": b, "stage": s} for b, s in self.active_batches]
        data["consent_audit_files"] = list(self.consent_audit_files)
        return data


@dataclass(frozen=True)
class ControlResult:
    job: ExtractionJob
    changed: bool  # False: the job already was where the operation would have put it


@dataclass(frozen=True)
class CohortPreview:
    patient_ids: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.patient_ids)


def _consent_audit_files(task: dict[str, Any]) -> tuple[str, ...]:
    urls = tuple(
        o["valueUrl"]
        for o in task.get("output") or []
        if isinstance(o, dict)
        and isinstance(o.get("valueUrl"), str)
        and (o.get("type") or {}).get("text") == CONSENT_AUDIT_TEXT
    )
    for url in urls:
        refuse_credentials_in_url(url, door="a consent audit file URL of the Task", fix=SERVER_URL_FIX)
    return urls


def _job_status(task: dict[str, Any]) -> str:
    business = task.get("businessStatus") if isinstance(task.get("businessStatus"), dict) else {}
    for coding in business.get("coding") or []:
        if isinstance(coding, dict) and isinstance(coding.get("code"), str):
            return coding["code"]
    return str(task.get("status") or "unknown")


def _progress_values(task: dict[str, Any]) -> dict[str, Any]:
    """Sub-extension values of the progress extension; ``activeBatch`` as (batch id, stage) pairs."""
    for extension in task.get("extension") or []:
        if isinstance(extension, dict) and str(extension.get("url", "")).endswith(PROGRESS_EXTENSION_SUFFIXES):
            values: dict[str, Any] = {"activeBatch": ()}
            for sub in extension.get("extension") or []:
                if not isinstance(sub, dict):
                    continue
                if sub.get("url") == "activeBatch":
                    parts = {p.get("url"): p.get("valueString") for p in sub.get("extension") or []}
                    values["activeBatch"] += ((str(parts.get("batchId")), parts.get("stage")),)
                elif isinstance(sub.get("valueInteger"), int):
                    values[sub["url"]] = sub["valueInteger"]
            return values
    return {}


def cohort_patient_ids(document: Any) -> tuple[str, ...]:
    """Patient ids of an $evaluate-cohort List (``entry[].item.reference``, ``Patient/`` dropped)."""
    if not isinstance(document, dict) or document.get("resourceType") != "List":
        raise ExtractionError("cohort preview: the server's answer is not a FHIR List")
    ids = []
    for entry in document.get("entry") or []:
        item = entry.get("item") if isinstance(entry, dict) else None
        reference = item.get("reference") if isinstance(item, dict) else None
        if isinstance(reference, str):
            ids.append(reference.removeprefix("Patient/"))
    return tuple(ids)


class ExtractionTaskClient:
    """The Task API and $evaluate-cohort of the server configured by ``services.extractor``."""

    def __init__(self, settings: ExtractorSettings, tls: TlsSettings, retry: RetrySettings):
        if not settings.base_url:
            raise ExtractionError("services.extractor.base_url is not set; set it to the extraction server's URL")
        self.base_url = settings.base_url.rstrip("/")
        endpoint = ServiceEndpoint(SERVICE, self.base_url, settings.auth, http_timeout(TASK_TIMEOUT))
        self.client = ServiceClient(endpoint, tls, retry)

    def __enter__(self) -> ExtractionTaskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def search(
        self, ids: Sequence[str] = (), statuses: Sequence[str] = (), *, strict: bool = False
    ) -> list[ExtractionJob]:
        """GET /fhir/Task; with ``strict`` the server refuses bad parameters (``SearchRejectedError``)."""
        params = {name: ",".join(values) for name, values in (("_id", ids), ("status", statuses)) if values}
        headers = {"Accept": FHIR_JSON} | ({"Prefer": "handling=strict"} if strict else {})
        try:
            response = self.client.request(
                "GET", "/fhir/Task", operation="search extraction jobs", params=params, headers=headers
            )
        except ServiceError as exc:
            if exc.status_code == 400:
                raise SearchRejectedError(exc.message.split("; ")) from exc
            raise
        bundle = response.json()
        return [
            ExtractionJob.from_task(entry["resource"])
            for entry in bundle.get("entry") or []
            if isinstance(entry, dict) and isinstance(entry.get("resource"), dict)
        ]

    def read_task(self, job_id: str) -> dict[str, Any]:
        response = self._job_request("GET", job_id, "", operation="read extraction job")
        return response.json()

    def job(self, job_id: str) -> ExtractionJob:
        return ExtractionJob.from_task(self.read_task(job_id))

    def control(self, job_id: str, operation: str) -> ControlResult:
        """POST $pause, $resume or $cancel. A 409 is explained with the job's state; a job already in the
        state the operation leads to is reported as unchanged, not as an error (the real server answers a
        repeated $cancel with 200, the spec with 409)."""
        target, rule = CONTROL_OPERATIONS[operation]
        before = self.job(job_id)
        if before.status in target:
            return ControlResult(before, changed=False)
        try:
            response = self._job_request("POST", job_id, f"/${operation}", operation=f"{operation} extraction job")
        except ServiceError as exc:
            if exc.status_code != 409:
                raise
            now = self.job(job_id)
            if now.status in target:
                return ControlResult(now, changed=False)
            raise TransitionRefusedError(
                f"{operation} extraction job", f"job {job_id} is {now.status}; {rule}", now.status
            ) from exc
        return ControlResult(ExtractionJob.from_task(response.json()), changed=True)

    def set_priority(self, job_id: str, level: str, attempts: int = PRIORITY_ATTEMPTS) -> ControlResult:
        """Read the Task and PUT it with ``If-Match: W/"<versionId>"``; on a stale version (409/412) read it
        again and retry, up to ``attempts`` times. ``level`` is ``high`` or ``normal``."""
        priority = TASK_PRIORITY_FOR[level]
        for _ in range(attempts):
            task = self.read_task(job_id)
            job = ExtractionJob.from_task(task)
            if job.priority == level.upper():
                return ControlResult(job, changed=False)
            try:
                response = self._job_request(
                    "PUT",
                    job_id,
                    "",
                    operation="set extraction job priority",
                    content=json.dumps(_priority_update(task, priority)).encode(),
                    headers={"Content-Type": FHIR_JSON, "Accept": FHIR_JSON, "If-Match": f'W/"{job.version}"'},
                )
            except ServiceError as exc:
                if exc.status_code in STALE_VERSION:
                    log.info("extractor: job %s changed while setting its priority; reading it again", job_id)
                    continue
                if exc.status_code == 428:
                    raise ServiceError(
                        exc.operation,
                        428,
                        "the server says If-Match is missing, but dupflow sent it; this is a bug in dupflow, "
                        "please report it",
                        transient=False,
                        service=SERVICE,
                    ) from exc
                raise
            return ControlResult(self._updated_job(job_id, response), changed=True)
        raise VersionConflictError(
            "set extraction job priority",
            None,
            f"job {job_id} kept changing (its version moved on {attempts} times in a row, e.g. as batches "
            "finished); try again",
            transient=True,
            service=SERVICE,
        )

    def delete(self, job_id: str) -> None:
        """DELETE the job and its result files. Attempted once: a repeat after a 500 could answer a misleading
        404 for a job whose files were left behind."""
        try:
            self._job_request("DELETE", job_id, "", operation="delete extraction job", once=True)
        except ServiceError as exc:
            if exc.status_code == 500:
                raise ServiceError(
                    exc.operation,
                    500,
                    f"the server could not remove the result files of job {job_id} ({exc.message}); check the "
                    "server's disk and logs, then delete again",
                    transient=False,
                    service=SERVICE,
                ) from exc
            raise

    def evaluate_cohort(self, crtdl: bytes) -> CohortPreview:
        """POST /fhir/$evaluate-cohort with the CRTDL as plain JSON; the patients of the resulting List."""
        try:
            response = self.client.request(
                "POST",
                "/fhir/$evaluate-cohort",
                operation="preview cohort",
                content=crtdl,
                headers={"Content-Type": "application/json", "Accept": FHIR_JSON},
                timeout=http_timeout(COHORT_PREVIEW_TIMEOUT),
            )
        except ServiceError as exc:
            if exc.status_code in (404, 405):
                raise CohortPreviewUnsupportedError(
                    "preview cohort",
                    exc.status_code,
                    f"the extraction server at {self.base_url} does not support cohort preview ($evaluate-cohort "
                    "exists only in newer servers)",
                    transient=False,
                    service=SERVICE,
                ) from exc
            raise
        return CohortPreview(cohort_patient_ids(response.json()))

    def _job_request(
        self, method: str, job_id: str, suffix: str, *, operation: str, once: bool = False, **kwargs
    ) -> httpx.Response:
        """A request about one job (retried unless ``once``); a 404 becomes ``JobNotFoundError``."""
        send = self.client.request_once if once else self.client.request
        try:
            return send(method, f"/fhir/Task/{job_id}{suffix}", operation=operation, **kwargs)
        except ServiceError as exc:
            if exc.status_code == 404:
                raise JobNotFoundError(
                    operation, 404, f"the extraction server has no job {job_id}", transient=False, service=SERVICE
                ) from exc
            raise

    def _updated_job(self, job_id: str, response: httpx.Response) -> ExtractionJob:
        """The Task of a successful PUT (its body is not specified: read the Task when it is not one)."""
        try:
            document = response.json()
        except ValueError:
            document = None
        if isinstance(document, dict) and document.get("resourceType") == "Task":
            return ExtractionJob.from_task(document)
        return self.job(job_id)


def _priority_update(task: dict[str, Any], priority: str) -> dict[str, Any]:
    """The full Task the PUT needs (resourceType, id, status, intent, priority); only priority is read."""
    return {
        "resourceType": "Task",
        "id": task.get("id"),
        "status": task.get("status"),
        "intent": task.get("intent") or "order",
        "priority": priority,
    }
