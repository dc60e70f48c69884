"""JSON bodies of the fake extraction server: Task, OperationOutcome, progress, manifest, file URLs."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from tests.fakes.extraction_content import (
    CORE_FILE,
    PATIENT_EXCLUSIONS_FILE,
    RESOURCE_EXCLUSIONS_FILE,
    SUMMARY_FILE,
    batch_file,
    consent_file,
    diagnostics_summary,
    has_consent_audit,
    served_files,
)
from tests.fakes.extraction_state import FINAL, ExtractionServerState, Job, JobStatus

JOB_STATUS_SYSTEM = "https://medizininformatik-initiative.de/torch/job-status"
EXTENSION_BASE = "https://torch.mii.de/fhir"

TASK_STATUS = {
    JobStatus.PENDING: "requested",
    JobStatus.RUNNING_GET_COHORT: "in-progress",
    JobStatus.RUNNING_PROCESS_BATCH: "in-progress",
    JobStatus.RUNNING_PROCESS_CORE: "in-progress",
    JobStatus.PAUSED: "on-hold",
    JobStatus.TEMP_FAILED: "on-hold",
    JobStatus.COMPLETED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}
_DISPLAY = {
    JobStatus.PENDING: "Pending",
    JobStatus.RUNNING_GET_COHORT: "Getting cohort",
    JobStatus.RUNNING_PROCESS_BATCH: "Processing batches",
    JobStatus.RUNNING_PROCESS_CORE: "Processing core resources",
    JobStatus.PAUSED: "Paused",
    JobStatus.TEMP_FAILED: "Temporarily failed",
    JobStatus.COMPLETED: "Completed",
    JobStatus.FAILED: "Failed",
    JobStatus.CANCELLED: "Cancelled",
}


def extension_urls(state: ExtractionServerState) -> dict[str, str]:
    """Manifest/Task extension urls: ``torch-`` (real server) or ``extractor-`` (spec) prefixed."""
    prefix = state.extension_style
    return {
        "job": f"{EXTENSION_BASE}/StructureDefinition/{prefix}-job",
        "summary": f"{prefix}-job-diagnostics-summary",
        "resource_exclusions": f"{prefix}-resource-exclusions",
        "patient_exclusions": f"{prefix}-patient-exclusions",
        "issues": f"{prefix}-job-issues",
        "progress": f"{EXTENSION_BASE}/{prefix}-job-progress",
    }


def outcome(severity: str, code: str, diagnostics: str) -> dict:
    return {
        "resourceType": "OperationOutcome",
        "issue": [{"severity": severity, "code": code, "diagnostics": diagnostics}],
    }


def _instant(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


# --- status endpoint -----------------------------------------------------------------------------
def progress_text(state: ExtractionServerState, job: Job, now: float) -> str:
    """The X-Progress header value of an in-progress status answer."""
    if job.status is JobStatus.RUNNING_PROCESS_BATCH:
        return f"Processing batches ({state.batch_progress(job, now).percent(len(job.batch_ids))}%)"
    return _DISPLAY[job.status]


def progress_outcome(state: ExtractionServerState, job: Job, now: float) -> dict:
    percent = state.batch_progress(job, now).percent(len(job.batch_ids)) if job.cohort_known else 0
    summary = (
        f"Job {job.id}\n status: {job.status.value}\n batch progress: {percent}%\n"
        f" cohort Size: {job.cohort_size if job.cohort_known else 0}"
    )
    issues = [progress_text(state, job, now), summary]
    return {
        "resourceType": "OperationOutcome",
        "meta": {"lastUpdated": _instant(state.wall(now))},
        "issue": [{"severity": "information", "code": "informational", "diagnostics": text} for text in issues],
    }


def with_userinfo(url: str, userinfo: str | None) -> str:
    """``url`` with ``userinfo@`` before its host (the ``url_userinfo`` fault); unchanged without it."""
    if not userinfo:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{userinfo}@{rest}"


def padding_entries(files_base: str, job_id: str, count: int):
    """``count`` more manifest output entries as JSON text, in slices (the ``extra_output_entries`` fault)."""
    for start in range(0, count, 1000):
        yield "".join(
            f', {{"type": "NDJSON Bundle", "url": "{files_base}/{job_id}/padding-{i}.ndjson"}}'
            for i in range(start, min(start + 1000, count))
        )


def file_url(state: ExtractionServerState, files_base: str, job_id: str, name: str) -> str:
    """A result file URL in the configured style: absolute, path-relative or host-prefixed without scheme."""
    absolute = with_userinfo(f"{files_base}/{job_id}/{name}", state.url_userinfo)
    parts = urlsplit(absolute)
    if state.file_url_style == "relative":
        return parts.path
    if state.file_url_style == "host_prefixed":
        return parts.netloc + parts.path
    return absolute


def output_files(state: ExtractionServerState, job: Job) -> list[str]:
    """Manifest output: batch files, then core.ndjson last; none when ``empty_output`` is set."""
    if state.empty_output:
        return []
    if state.serve_dir is not None:
        return served_files(state.serve_dir)
    return [batch_file(b) for b in job.batch_ids] + [CORE_FILE]


def job_issues(state: ExtractionServerState, job: Job) -> list[dict]:
    issues = list(state.job_issues)
    if state.empty_output == "with_issues":
        issues += [
            {"severity": "WARNING", "msg": f"Batch {b} skipped: no consenting patients", "diagnostics": ""}
            for b in job.batch_ids
        ]
    return issues


def manifest(state: ExtractionServerState, job: Job, now: float, status_url: str, files_base: str) -> dict:
    urls = extension_urls(state)
    extensions: list[dict] = [{"url": urls["job"], "valueObject": job_record(state, job, now)}]
    if job.batch_ids:  # diagnostics exist once a batch completed
        extensions += [
            {
                "url": urls["summary"],
                "valueUrl": f"{files_base}/{job.id}/{SUMMARY_FILE}",
                "valueObject": diagnostics_summary(job),
            },
            {"url": urls["resource_exclusions"], "valueUrl": f"{files_base}/{job.id}/{RESOURCE_EXCLUSIONS_FILE}"},
            {"url": urls["patient_exclusions"], "valueUrl": f"{files_base}/{job.id}/{PATIENT_EXCLUSIONS_FILE}"},
        ]
    issues = job_issues(state, job)
    if issues:
        extensions.append({"url": urls["issues"], "valueObject": issues})
    return {
        "transactionTime": state.wall(job.finished_at or now).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "request": status_url,
        "requiresAccessToken": state.requires_access_token,
        "output": [
            {"type": "NDJSON Bundle", "url": file_url(state, files_base, job.id, name)}
            for name in output_files(state, job)
        ],
        "error": [],
        "extension": extensions,
    }


def parameters_result(state: ExtractionServerState, job: Job, now: float, status_url: str, files_base: str) -> dict:
    """The alternative completion shape: Parameters whose ``output`` parameters carry ``url`` parts."""
    parameters: list[dict] = [
        {"name": "transactionTime", "valueInstant": _instant(state.wall(job.finished_at or now))},
        {"name": "request", "valueUri": status_url},
        {"name": "requiresAccessToken", "valueBoolean": state.requires_access_token},
    ]
    parameters += [
        {
            "name": "output",
            "part": [
                {"name": "type", "valueCode": "Bundle"},
                {"name": "url", "valueUri": file_url(state, files_base, job.id, name)},
            ],
        }
        for name in output_files(state, job)
    ]
    parameters += [
        {"name": "error", "part": [{"name": "diagnostics", "valueString": issue["msg"]}]}
        for issue in job_issues(state, job)
    ]
    return {"resourceType": "Parameters", "parameter": parameters}


def job_record(state: ExtractionServerState, job: Job, now: float) -> dict:
    """The full serialised job (manifest job extension)."""
    progress = state.batch_progress(job, now)
    active = {batch_id for batch_id, _ in progress.active}

    def batch_status(index: int, batch_id: str) -> str:
        if index < progress.completed:
            return "FINISHED"
        return "IN_PROGRESS" if batch_id in active else "INIT"

    return {
        "id": job.id,
        "status": job.status.value,
        "priority": "HIGH" if job.is_high_priority else "NORMAL",
        "version": state.version(job, now),
        "createdAt": _instant(state.wall(job.submitted_at)),
        "startedAt": _instant(state.wall(job.started_at)) if job.started_at is not None else None,
        "finishedAt": _instant(state.wall(job.finished_at)) if job.finished_at is not None else None,
        "cohortSize": job.cohort_size,
        "batchSize": job.batch_size,
        "batches": [
            {"batchId": b, "status": batch_status(i, b), "patientCount": len(job.batch_patients(b))}
            for i, b in enumerate(job.batch_ids)
        ],
        "coreState": "FINISHED" if job.status is JobStatus.COMPLETED else "INIT",
        "issues": job_issues(state, job),
    }


# --- Task API ------------------------------------------------------------------------------------
def task_resource(state: ExtractionServerState, job: Job, now: float, files_base: str, deleted: bool = False) -> dict:
    """The job as a Task; ``deleted``: as TORCH shows a deleted job (Task.status cancelled, JobStatus DELETED)."""
    period = {"start": _instant(state.wall(job.started_at if job.started_at is not None else job.submitted_at))}
    if job.status in FINAL and job.finished_at is not None:
        period["end"] = _instant(state.wall(job.finished_at))
    code, display = ("DELETED", "Deleted") if deleted else (job.status.value, _DISPLAY[job.status])
    task: dict = {
        "resourceType": "Task",
        "id": job.id,
        "meta": {"versionId": str(state.version(job, now)), "lastUpdated": _instant(state.wall(job.last_updated))},
        "status": "cancelled" if deleted else TASK_STATUS[job.status],
        "intent": "order",
        "businessStatus": {"coding": [{"system": JOB_STATUS_SYSTEM, "code": code, "display": display}]},
        "priority": job.priority,
        "description": f"TORCH Job {job.id}",
        "authoredOn": _instant(state.wall(job.submitted_at)),
        "executionPeriod": period,
    }
    if job.cohort_known:
        task["extension"] = [_progress_extension(state, job, now)]
    outputs = _consent_outputs(state, job, now, files_base)
    if outputs:
        task["output"] = outputs
    if state.edit_task is not None:
        state.edit_task(task)
    return task


def _progress_extension(state: ExtractionServerState, job: Job, now: float) -> dict:
    progress = state.batch_progress(job, now)
    return {
        "url": extension_urls(state)["progress"],
        "extension": [
            {"url": "cohortSize", "valueInteger": job.cohort_size},
            {"url": "batchSize", "valueInteger": job.batch_size},
            {"url": "batchesTotal", "valueInteger": len(job.batch_ids)},
            {"url": "batchesCompleted", "valueInteger": progress.completed},
            *(
                {
                    "url": "activeBatch",
                    "extension": [{"url": "batchId", "valueString": b}, {"url": "stage", "valueString": stage}],
                }
                for b, stage in progress.active
            ),
        ],
    }


def _consent_outputs(state: ExtractionServerState, job: Job, now: float, files_base: str) -> list[dict]:
    if not has_consent_audit(job):
        return []
    finished = job.batch_ids[: state.batch_progress(job, now).completed]
    return [
        {"type": {"text": "Consent audit NDJSON"}, "valueUrl": f"{files_base}/{job.id}/{consent_file(b)}"}
        for b in finished
    ]


def cohort_list(patient_ids: list[str] | tuple[str, ...], wall: datetime) -> dict:
    """The $evaluate-cohort answer: a FHIR List with one entry per matching patient."""
    return {
        "resourceType": "List",
        "status": "current",
        "mode": "snapshot",
        "title": "Cohort",
        "date": wall.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "entry": [{"item": {"reference": f"Patient/{patient_id}"}} for patient_id in patient_ids],
    }


def search_bundle(tasks: list[dict]) -> dict:
    return {
        "resourceType": "Bundle",
        "type": "searchset",
        "total": len(tasks),
        "entry": [{"resource": t} for t in tasks],
    }


# --- files ---------------------------------------------------------------------------------------
def files_ready(state: ExtractionServerState, job: Job, now: float) -> list[str]:
    """Files the file server has now: finished batches (and their audit files), the rest at completion;
    in directory mode, the directory's files once the job completed."""
    if state.serve_dir is not None:
        return served_files(state.serve_dir) if job.status is JobStatus.COMPLETED else []
    finished = job.batch_ids[: state.batch_progress(job, now).completed]
    names = [batch_file(b) for b in finished]
    if has_consent_audit(job):
        names += [consent_file(b) for b in finished]
    if job.status is JobStatus.COMPLETED:
        names += [CORE_FILE, SUMMARY_FILE, RESOURCE_EXCLUSIONS_FILE, PATIENT_EXCLUSIONS_FILE]
    return names
