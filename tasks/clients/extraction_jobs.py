"""The operator's side of the extraction server: Task API, ``$evaluate-cohort``.

Note: failures are ``ServiceError``s, the subclasses below for the answers an operator needs
explained. No Prefect.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

import httpx

from tasks.core.json_shapes import as_object, as_objects, JsonObject
from tasks.clients.bounds import MB, Deadline
from tasks.clients.errors import ServiceError, json_or_none
from tasks.clients.extraction_documents import (
    CRTDL_REFUSALS,
    SERVICE,
    TASK_TIMEOUT,
    ExtractionError,
    endpoint_of,
    job_status_of,
    progress_values,
)
from tasks.clients.http import (
    FHIR_JSON,
    FHIR_JSON_HEADERS,
    ServiceClient,
    http_timeout,
)
from tasks.core.url_credentials import refuse_credentials_in_url, shown_url

if TYPE_CHECKING:
    from config.services import ExtractorSettings
    from config.settings import RetrySettings, TlsSettings

log = logging.getLogger("dupflow.extractor")

RUNNING_STATUSES = ("RUNNING_GET_COHORT", "RUNNING_PROCESS_BATCH", "RUNNING_PROCESS_CORE")
UNFINISHED_STATUSES = ("PENDING", *RUNNING_STATUSES, "PAUSED", "TEMP_FAILED")
JOB_STATUSES = (*UNFINISHED_STATUSES, "COMPLETED", "FAILED", "CANCELLED")
HIGH_TASK_PRIORITIES = frozenset({"asap", "stat", "urgent"})
TASK_PRIORITY_FOR = {"high": "asap", "normal": "routine"}
# A stale If-Match answers 409 in the spec and 412 on the real server: the version moved on, read it
# again.
STALE_VERSION = (409, 412)
PRIORITY_ATTEMPTS = 5
COHORT_PREVIEW_TIMEOUT = timedelta(minutes=10)
TASK_DEADLINE = functools.partial(Deadline, TASK_TIMEOUT, "the Task API's deadline, 10 s")
COHORT_PREVIEW_DEADLINE = functools.partial(
    Deadline, COHORT_PREVIEW_TIMEOUT, "the cohort preview's deadline, 10 min"
)
CONSENT_AUDIT_TEXT = "Consent audit NDJSON"
MAX_TASK_ANSWER_BYTES = 32 * MB
"""The most of a Task API answer that is read: a Task is a few KB, so this holds a search over
thousands of jobs."""
MAX_COHORT_ANSWER_BYTES = 64 * MB
"""The most of a cohort preview (a List) that is read: about 60 bytes per patient, room for some
1,000,000."""
TOO_MANY_JOBS = (
    "list fewer jobs (extraction list --status or --id) or delete old ones; or check "
    "services.extractor.base_url"
)
TOO_LARGE_COHORT = (
    "the cohort is too large to preview; start the extraction, or check services.extractor.base_url"
)
IF_MATCH_SENT = (
    "the server says If-Match is missing, but dupflow sent it; this is a bug in dupflow, please "
    "report it"
)
NOT_THE_SERVER = (
    "check that services.extractor.base_url points at the extraction server (not a proxy or login "
    "page)"
)
# Per operation: the states the job ends in (already there means nothing to do) and why a 409
# happens.
CONTROL_OPERATIONS = {
    "pause": ({"PAUSED"}, "only running jobs can be paused"),
    "resume": (set(RUNNING_STATUSES), "only paused jobs can be resumed"),
    "cancel": ({"CANCELLED"}, "only jobs that have not finished can be cancelled"),
}


class JobNotFoundError(ServiceError):
    """The server knows no job with this id (404)."""


class TransitionRefusedError(ServiceError):
    """$pause, $resume or $cancel is not allowed in the job's state (409).

    Note: ``job_status`` is that state.
    """

    def __init__(self, operation: str, message: str, job_status: str | None):
        self.job_status = job_status
        super().__init__(operation, 409, message, service=SERVICE)


class SearchRejectedError(ServiceError):
    """A strict Task search that the server refused (400); ``problems`` says why."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("search extraction jobs", 400, "; ".join(problems), service=SERVICE)


class ExtractionJob(NamedTuple):
    """One job as the Task API shows it.

    Note: progress fields are None until the cohort query has finished.
    """

    id: str
    status: str  # the JobStatus code (Task.businessStatus), e.g. RUNNING_PROCESS_BATCH
    priority: str  # HIGH or NORMAL
    version: str | None
    authored_on: str | None
    last_updated: str | None
    cohort_size: int | None
    batch_size: int | None
    batches_total: int | None
    batches_completed: int | None
    active_batches: tuple[tuple[str, str | None], ...]  # (batch id, stage)
    consent_audit_files: tuple[str, ...]

    @classmethod
    def from_task(cls, task: JsonObject) -> ExtractionJob:
        meta = as_object(task.get("meta"))
        progress = progress_values(task)
        return cls(
            id=str(task.get("id")),
            status=job_status_of(task),
            priority="HIGH" if str(task.get("priority")) in HIGH_TASK_PRIORITIES else "NORMAL",
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

    def as_json(self) -> JsonObject:
        data = self._asdict()
        data["active_batches"] = [{"batch_id": b, "stage": s} for b, s in self.active_batches]
        return data


class ControlResult(NamedTuple):
    job: ExtractionJob
    changed: bool  # False: the job already was where the operation would have put it


def _consent_audit_files(task: JsonObject) -> tuple[str, ...]:
    urls = tuple(
        url
        for output in as_objects(task.get("output"))
        if as_object(output.get("type")).get("text") == CONSENT_AUDIT_TEXT
        and isinstance(url := output.get("valueUrl"), str)
    )
    for url in urls:
        refuse_credentials_in_url(url, door="a consent audit file URL of the Task")
    return urls


def document_of(response: httpx.Response, operation: str) -> JsonObject:
    """Return the JSON object the server answered, else a terminal ``ServiceError``.

    Note: orjson bounds the nesting; the error never holds the body.
    """
    document = json_or_none(response.content)
    if isinstance(document, dict):
        return document
    found = "a body that is not JSON" if document is None else "JSON that is not a JSON object"
    message = (
        f"{shown_url(str(response.url))} answered HTTP {response.status_code} with {found}; "
        f"{NOT_THE_SERVER}"
    )
    raise ServiceError(operation, None, message, service=SERVICE)


def cohort_patient_ids(document: Any) -> tuple[str, ...]:
    """Return the patient ids of an $evaluate-cohort List (``Patient/`` dropped).

    Note: read from ``entry[].item.reference``.
    """
    if as_object(document).get("resourceType") != "List":
        raise ExtractionError("cohort preview: the server's answer is not a FHIR List")
    return tuple(
        ref.removeprefix("Patient/")
        for entry in as_objects(document.get("entry"))
        if isinstance(ref := as_object(entry.get("item")).get("reference"), str)
    )


class ExtractionTaskClient(ServiceClient):
    """The Task API and $evaluate-cohort of the server of ``services.extractor``."""

    def __init__(self, settings: ExtractorSettings, tls: TlsSettings, retry: RetrySettings):
        endpoint = endpoint_of(settings, TASK_TIMEOUT)
        self.base_url = endpoint.url_without_query
        super().__init__(endpoint, tls, retry)

    def search(
        self, ids: Sequence[str] = (), statuses: Sequence[str] = (), *, strict: bool = False
    ) -> list[ExtractionJob]:
        """GET /fhir/Task; with ``strict`` the server refuses bad parameters.

        Note: a refusal raises ``SearchRejectedError``.
        """
        params = {
            name: ",".join(values)
            for name, values in (("_id", ids), ("status", statuses))
            if values
        }
        headers = {"Accept": FHIR_JSON} | ({"Prefer": "handling=strict"} if strict else {})
        try:
            response = self.request(
                "GET",
                "/fhir/Task",
                operation="search extraction jobs",
                params=params,
                headers=headers,
                deadline=TASK_DEADLINE,
                max_answer_bytes=MAX_TASK_ANSWER_BYTES,
                too_large_hint=TOO_MANY_JOBS,
            )
        except ServiceError as exc:
            if exc.status_code == 400:
                raise SearchRejectedError(exc.message.split("; ")) from exc
            raise
        bundle = document_of(response, "search extraction jobs")
        tasks = as_objects([entry.get("resource") for entry in as_objects(bundle.get("entry"))])
        return [ExtractionJob.from_task(task) for task in tasks]

    def read_task(self, job_id: str) -> JsonObject:
        operation = "read extraction job"
        return document_of(self._job_request("GET", job_id, operation=operation), operation)

    def job(self, job_id: str) -> ExtractionJob:
        return ExtractionJob.from_task(self.read_task(job_id))

    def control(self, job_id: str, operation: str) -> ControlResult:
        """POST $pause, $resume or $cancel; a 409 is explained with the job's state.

        Why: a job already in the state the operation leads to is reported as unchanged, not as an
        error (the real server answers a repeated $cancel with 200, the spec with 409).
        """
        target, rule = CONTROL_OPERATIONS[operation]
        if (before := self.job(job_id)).status in target:
            return ControlResult(before, changed=False)
        action = f"{operation} extraction job"
        try:
            response = self._job_request("POST", job_id, f"/${operation}", operation=action)
        except ServiceError as exc:
            if exc.status_code != 409:
                raise
            if (now := self.job(job_id)).status in target:
                return ControlResult(now, changed=False)
            raise TransitionRefusedError(
                action, f"job {job_id} is {now.status}; {rule}", now.status
            ) from exc
        job = ExtractionJob.from_task(document_of(response, action))
        return ControlResult(job, changed=True)

    def set_priority(self, job_id: str, level: str) -> ControlResult:
        """Set the Task's priority (``high`` or ``normal``) with ``If-Match``.

        Note: reads the Task and PUTs it with ``If-Match: W/"<versionId>"``; on a stale version
        (409/412) reads it again and retries, up to ``PRIORITY_ATTEMPTS`` times.
        """
        priority = TASK_PRIORITY_FOR[level]
        for _ in range(PRIORITY_ATTEMPTS):
            task = self.read_task(job_id)
            job = ExtractionJob.from_task(task)
            if job.priority == level.upper():
                return ControlResult(job, changed=False)
            try:
                response = self._put_priority(job_id, task, priority, job.version)
            except ServiceError as exc:
                if exc.status_code not in STALE_VERSION:
                    raise
                log.info(
                    "extractor: job %s changed while setting its priority; reading it again", job_id
                )
                continue
            # the body of a PUT's answer is not specified: the Task is read when it is not one
            task = json_or_none(response.content)
            if as_object(task).get("resourceType") != "Task":
                task = self.read_task(job_id)
            return ControlResult(ExtractionJob.from_task(task), changed=True)
        message = (
            f"job {job_id} kept changing (its version moved on {PRIORITY_ATTEMPTS} times in a row, "
            "e.g. as batches finished); try again"
        )
        raise ServiceError(
            "set extraction job priority", None, message, transient=True, service=SERVICE
        )

    def _put_priority(
        self, job_id: str, task: JsonObject, priority: str, version: str | None
    ) -> httpx.Response:
        """PUT the full Task the server needs, with ``If-Match``.

        Note: resourceType, id, status, intent, priority; only priority is read. A 428 (If-Match
        missing) is a bug of ours.
        """
        update = {"resourceType": "Task", "id": task.get("id"), "status": task.get("status")}
        update |= {"intent": task.get("intent") or "order", "priority": priority}
        return self._job_request(
            "PUT",
            job_id,
            operation="set extraction job priority",
            body=json.dumps(update).encode(),
            headers={**FHIR_JSON_HEADERS, "If-Match": f'W/"{version}"'},
            status_hints={428: IF_MATCH_SENT},
        )

    def delete(self, job_id: str) -> None:
        """DELETE the job and its result files.

        Why: attempted once: a repeat after a 500 could answer a misleading 404 for a job whose
        files were left behind.
        """
        try:
            self._job_request("DELETE", job_id, operation="delete extraction job", once=True)
        except ServiceError as exc:
            if exc.status_code != 500:
                raise
            message = (
                f"the server could not remove the result files of job {job_id} ({exc.message})"
            )
            message += "; check the server's disk and logs, then delete again"
            raise ServiceError(exc.operation, 500, message, service=SERVICE) from exc

    def evaluate_cohort(self, crtdl: bytes) -> tuple[str, ...]:
        """POST the CRTDL to /fhir/$evaluate-cohort; return the patient ids of the List."""
        unsupported = (
            f"the extraction server at {self.base_url} does not support cohort preview "
            "($evaluate-cohort exists only in newer servers)"
        )
        response = self.request(
            "POST",
            "/fhir/$evaluate-cohort",
            operation="preview cohort",
            body=crtdl,
            deadline=COHORT_PREVIEW_DEADLINE,
            timeout=http_timeout(COHORT_PREVIEW_TIMEOUT),
            status_hints={**CRTDL_REFUSALS, 404: unsupported, 405: unsupported},
            max_answer_bytes=MAX_COHORT_ANSWER_BYTES,
            too_large_hint=TOO_LARGE_COHORT,
            headers={"Content-Type": "application/json", "Accept": FHIR_JSON},
        )
        return cohort_patient_ids(document_of(response, "preview cohort"))

    def _job_request(
        self,
        method: str,
        job_id: str,
        suffix: str = "",
        *,
        operation: str,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send a request about one job (retried unless ``once``), its answer read bounded.

        Note: a 404 becomes ``JobNotFoundError``.
        Why: the id is one path segment, escaped: it may come from a job.json or a person.
        """
        path = f"/fhir/Task/{quote(job_id, safe='')}{suffix}"
        try:
            return self.request(
                method,
                path,
                operation=operation,
                deadline=TASK_DEADLINE,
                max_answer_bytes=MAX_TASK_ANSWER_BYTES,
                too_large_hint=NOT_THE_SERVER,
                **kwargs,
            )
        except ServiceError as exc:
            if exc.status_code != 404:
                raise
            message = f"the extraction server has no job {job_id}"
            raise JobNotFoundError(operation, 404, message, service=SERVICE) from exc
