"""Client of the extraction server (TORCH): submit a CRTDL, poll, read file URLs.

Note: no Prefect. See docs/development.md#service-clients.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import quote

import httpx

from tasks.clients.auth import ServiceAuth, origin_of
from tasks.clients.bounds import MB, Deadline, answer_within, declared_size
from tasks.clients.errors import (
    Call,
    ServiceError,
    answered,
    error_from_response,
    first_bytes,
    is_transient_status,
    json_or_none,
    operation_outcome_texts,
    parse_retry_after,
    raise_for_service_status,
)
from tasks.clients.extraction_documents import (
    CRTDL_REFUSALS,
    SERVICE,
    DeadHandleError,
    ExtractionCancelledError,
    ExtractionError,
    ExtractionHandle,
    ExtractionTimeoutError,
    StatusUrlMismatchError,
    endpoint_of,
    job_status_of,
    kickoff_parameters,
    manifest_request,
    requires_access_token,
    resolve_file_url,
    result_urls,
)
from tasks.clients.http import (
    FHIR_JSON_HEADERS,
    Closing,
    build_client,
    http_timeout,
)
from tasks.clients.retry import call_once
from tasks.core.json_shapes import as_object
from tasks.core.url_credentials import refuse_credentials_in_url, shown_url
from tasks.streams.fanout import Sleep, pause

if TYPE_CHECKING:
    from config.services import ExtractorSettings
    from config.settings import TlsSettings

log = logging.getLogger("dupflow.extractor")

SUBMIT_PATH = "/fhir/$extract-data"
SUBMIT_TIMEOUT = timedelta(seconds=60)
POLL_TIMEOUT = timedelta(seconds=30)
# A completed job's manifest: ~150 bytes per output entry, so 32 MiB holds over 200,000 entries
# (more than the default services.extractor.max_result_files of 100,000) and is refused long before
# it costs much memory.
MAX_MANIFEST_BYTES = 32 * MB
# Any other status answer (progress, errors): only its first MiB is read.
MAX_STATUS_BODY_BYTES = MB
# One status poll (or Task read) in all, at most: a status answer is a few KB, a manifest at most
# MAX_MANIFEST_BYTES.
POLL_DEADLINE = timedelta(minutes=2)
POLL_DEADLINE_SETTING = (
    "a status poll's deadline, 2 minutes or services.extractor.extraction_timeout if shorter"
)
# Why: a kick-off goes on a new connection, not on one a poll left that the server may close under
# it (the kick-off then in doubt); so no call here leaves one.
OWN_CONNECTION = {"Connection": "close"}
STATUS_ACCEPT = {"Accept": "application/json"} | OWN_CONNECTION
TASK_ACCEPT = {"Accept": "application/fhir+json"} | OWN_CONNECTION
# a Task's JobStatus code, or its FHIR status
STOPPED_BY_PERSON = ("CANCELLED", "cancelled", "DELETED")


class PollProgress(NamedTuple):
    """What a status answer tells about a running job."""

    text: str | None

    @property
    def percent(self) -> float | None:
        match = re.search(r"(\d+(?:\.\d+)?)\s*%", self.text or "")
        return float(match.group(1)) if match else None

    def describe(self) -> str:
        return self.text or "running"


class ExtractionServerClient(Closing):
    """One extraction server, as ``services.extractor`` sets it; a context manager."""

    def __init__(
        self,
        settings: ExtractorSettings,
        tls: TlsSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = pause,
    ):
        endpoint = endpoint_of(settings, min(POLL_TIMEOUT, settings.extraction_timeout))
        # its query: the endpoint's
        self.settings, self.base_url = settings, endpoint.url_without_query
        self.clock, self.sleep = clock, sleep
        self.http = build_client(endpoint, tls)
        assert isinstance(self.http.auth, ServiceAuth), (
            "build_client gives every client a ServiceAuth"
        )
        self._auth = self.http.auth
        # the manifest's requiresAccessToken, once the job is complete
        self.files_need_token = False

    def submit(self, crtdl: bytes) -> ExtractionHandle:
        """POST $extract-data exactly once.

        Why: a second request could start a second job; a failure leaves the submission in doubt for
        the extraction step to settle.
        Note: only the answer's status and Content-Location are read (of an error answer the first
        MiB, for its diagnostics).
        """
        where: Call = {
            "operation": f"submit extraction to {shown_url(self.base_url)}",
            "service": SERVICE,
        }
        content = json.dumps(kickoff_parameters(crtdl)).encode()

        def attempt() -> ExtractionHandle:
            deadline = Deadline(SUBMIT_TIMEOUT, "the kick-off's deadline, 60 s")
            with answer_within(
                self.http,
                deadline,
                "POST",
                self.base_url + SUBMIT_PATH,
                body=content,
                headers=FHIR_JSON_HEADERS | OWN_CONNECTION,
                timeout=http_timeout(SUBMIT_TIMEOUT),
                **where,
            ) as answer:
                raise_for_service_status(answer, **where, hints=CRTDL_REFUSALS)
                return kicked_off(answer)

        return call_once(attempt, **where)

    def poll_until_complete(
        self, handle: ExtractionHandle, on_progress: Callable[[PollProgress], None] | None = None
    ) -> list[str]:
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
                if response.status_code in (102, 202):
                    last_contact = self.clock()
                    if on_progress is not None:
                        on_progress(progress(response))
                else:
                    self._raise_unless_transient(handle, response)
                    retry_after = parse_retry_after(response.headers.get("Retry-After"))
            silent_for = self.clock() - last_contact
            if silent_for >= window:
                raise ExtractionTimeoutError(
                    "extraction timeout: the extraction server gave no 200/202 answer for job "
                    f"{handle.job_id} for {window:g} s (services.extractor.extraction_timeout). "
                    "The job may still run: continue re-attaches to it; raise "
                    "services.extractor.extraction_timeout if the server is slow"
                )
            # "Retry-After: 0" is no storm
            wait = interval if retry_after is None else max(retry_after, interval)
            self.sleep(min(wait, cap, window - silent_for))
            interval = min(interval * 2, cap)

    def _poll_once(self, handle: ExtractionHandle) -> httpx.Response | None:
        """Send one status GET within its deadline; a transient failure gives None.

        Why: a server that drips its answer would hold it past the liveness window. Failures are
        swallowed, the identity provider's included: the window is the net.
        """
        deadline = Deadline(
            min(POLL_DEADLINE, self.settings.extraction_timeout), POLL_DEADLINE_SETTING
        )
        where: Call = {"operation": "poll extraction status", "service": SERVICE}

        def attempt() -> httpx.Response:
            with answer_within(
                self.http, deadline, "GET", handle.status_url, headers=STATUS_ACCEPT, **where
            ) as answer:
                return bounded_answer(answer)

        try:
            return call_once(attempt, **where)
        except ServiceError as exc:  # a network error's names the URL: it may be on another host
            if not exc.transient:
                raise
            log.warning(
                "extractor: status poll of job %s failed (%s); polling again",
                handle.job_id,
                exc.message,
            )
            return None

    def _raise_unless_transient(self, handle: ExtractionHandle, response: httpx.Response) -> None:
        status = response.status_code
        if status in (404, 410):
            if (job_status := self._task_status(handle)) in STOPPED_BY_PERSON:
                raise ExtractionCancelledError(handle, status, job_status)
            if job_status:
                raise StatusUrlMismatchError(handle, status, job_status)
            raise DeadHandleError(handle, status)
        if status == 500:
            texts = operation_outcome_texts(response.content)
            reason = "; ".join(texts) if texts else "the server gave no reason"
            raise ExtractionError(
                f"extraction job {handle.job_id} failed on the extraction server (HTTP 500): "
                f"{reason}. Fix the cause, then start a new job"
            )
        if is_transient_status(status):
            log.warning(
                "extractor: status poll of job %s answered HTTP %d; polling again",
                handle.job_id,
                status,
            )
            return
        foreign, home = origin_of(handle.status_url), origin_of(self.base_url)
        # it got no credentials, by design
        if status in (401, 403) and foreign != home and self._auth.sends_credentials:
            message = (
                f"the status URL {shown_url(handle.status_url)} answered HTTP {status}; it is on "
                f"{foreign}, not on the origin of services.extractor.base_url "
                f"({home}), and dupflow sends the credentials only there. Have the "
                "extraction server name its status URLs under the address dupflow uses (TORCH: "
                "torch.base.url), or set services.extractor.base_url to the server's address; "
                "then continue the job (--attach STATUS_URL follows the job at a status URL "
                "under base_url)"
            )
            raise ServiceError("poll extraction status", status, message, service=SERVICE)
        if status >= 400:
            raise error_from_response(response, operation="poll extraction status", service=SERVICE)
        raise ExtractionError(
            f"poll extraction status: unexpected HTTP {status} from {handle.status_url}"
        )

    def _task_status(self, handle: ExtractionHandle) -> str | None:
        """Return the job's state as its Task shows it, else None.

        Why: TORCH answers a cancelled or deleted job's status (its Task says DELETED until the
        files are removed) as it answers a job it lost; a person's cancel or delete must not be
        undone by a fresh submission, and a job whose Task is there is not lost. No answer is no
        proof.
        """
        url = f"{self.base_url}/fhir/Task/{quote(handle.job_id, safe='')}"
        deadline = Deadline(POLL_DEADLINE, POLL_DEADLINE_SETTING)
        try:
            with answer_within(
                self.http,
                deadline,
                "GET",
                url,
                headers=TASK_ACCEPT,
                operation="read extraction job",
                service=SERVICE,
            ) as answer:
                task = (
                    as_object(json_or_none(bounded_answer(answer).content))
                    if answer.status_code == 200
                    else {}
                )
        # ExtractionError: over the manifest bound
        except (httpx.HTTPError, ServiceError, ExtractionError):
            return None
        return job_status_of(task) if task.get("resourceType") == "Task" else None

    def result_file_urls(self, response: httpx.Response) -> list[str]:
        if (document := json_or_none(response.content)) is None:
            raise ExtractionError(
                "the completed extraction's answer is not JSON (or nested deeper than JSON's sane "
                "limits); cannot find the result files"
            )
        refuse_credentials_in_url(manifest_request(document), door="the manifest's request URL")
        urls = [
            resolve_file_url(self.base_url, url)
            for url in result_urls(document, self.settings.max_result_files)
        ]
        for url in urls:
            refuse_credentials_in_url(url, door="a result file URL of the manifest")
        if requires_access_token(document):
            self.trust_file_origins(urls)
        return urls

    def trust_file_origins(self, urls: Sequence[str]) -> None:
        """Send the credentials to the files' origins too: the files need a token.

        Note: each origin must be base_url's or listed in ``services.extractor.file_origins``, else
        an error names the origin and the key.
        """
        self.files_need_token = True
        allowed = {self._auth.origin, *map(origin_of, self.settings.file_origins)}
        for origin in dict.fromkeys(origin_of(url) for url in urls):
            if origin not in allowed:
                raise ExtractionError(
                    "the extraction server says its result files need an access token "
                    f"(requiresAccessToken), but they are on {origin}, another "
                    "origin than services.extractor.base_url; dupflow sends credentials only "
                    f"where you approve: add {origin} to "
                    "services.extractor.file_origins if that file server is yours, then continue "
                    "the job"
                )
            self._auth.trust(origin)


def kicked_off(response: httpx.Response) -> ExtractionHandle:
    """Return the handle of the job a successful kick-off started.

    Note: read from its status and headers only.
    """
    if response.status_code not in (200, 202):
        raise ExtractionError(
            f"submit extraction: the server answered HTTP {response.status_code}, expected 200 or "
            "202"
        )
    if not (location := response.headers.get("Content-Location")):
        raise ExtractionError(
            "submit extraction: the server accepted the request but sent no Content-Location "
            "header, so the job cannot be followed; check base_url points at the extraction "
            "server (not a proxy page)"
        )
    refuse_credentials_in_url(
        location,
        door="the kick-off answer's Content-Location header",
        tokens=True,
    )
    return ExtractionHandle.from_status_url(str(response.url.join(location)))


def progress(response: httpx.Response) -> PollProgress:
    """Return an in-progress answer's X-Progress header, else its diagnostics."""
    return PollProgress(
        response.headers.get("X-Progress")
        or next(iter(operation_outcome_texts(response.content)), None)
    )


def bounded_answer(response: httpx.Response) -> httpx.Response:
    """Return a status answer with its body read from the wire up to a limit.

    Note: a manifest (200) over ``MAX_MANIFEST_BYTES`` is refused; any other answer is cut at
    ``MAX_STATUS_BODY_BYTES``.
    """
    complete = response.status_code == 200
    limit = MAX_MANIFEST_BYTES if complete else MAX_STATUS_BODY_BYTES
    if complete and (declared := declared_size(response)) is not None and declared > limit:
        raise manifest_too_large(f"{declared:,} bytes (its Content-Length)")
    body = first_bytes(response, limit)
    if complete and len(body) > limit:
        raise manifest_too_large(f"more than {limit:,} bytes")
    return answered(response, body[:limit])


def manifest_too_large(size: str) -> ExtractionError:
    return ExtractionError(
        f"the completed extraction's manifest is {size}, over the limit of {MAX_MANIFEST_BYTES:,} "
        "bytes (tasks.clients.extraction_server.MAX_MANIFEST_BYTES, room for well over 100,000 "
        "result files); the job lists too many files to download sensibly: split the extraction "
        "(a smaller cohort or fewer attribute groups per CRTDL) or check the server"
    )
