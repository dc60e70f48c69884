"""What the extraction server (TORCH) is sent and answers, read and checked.

Note: also the errors of an extraction. See docs/development.md#service-clients.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx

from tasks.clients.errors import BODY_LIMIT
from tasks.clients.http import ServiceEndpoint
from tasks.core.json_shapes import as_array, as_object, as_objects, JsonObject
from tasks.core.errors import StepError
from tasks.core.names import invisible_character_problem, show_name
from tasks.core.url_credentials import shown_url

if TYPE_CHECKING:
    from config.services import ExtractorSettings

SERVICE = "extractor"
BASE_URL_SETTING = "services.extractor.base_url"
CRTDL_REFUSALS = {
    413: f"the CRTDL is larger than the extraction server accepts: raise {BODY_LIMIT}"
}
TASK_TIMEOUT = timedelta(seconds=10)
# The spec's {extension_base}/extractor-job-progress and the real server's torch-job-progress.
PROGRESS_EXTENSION_SUFFIXES = ("/extractor-job-progress", "/torch-job-progress")
ISSUES_EXTENSION_SUFFIXES = ("extractor-job-issues", "torch-job-issues")
# A host in a scheme-less file URL: an IPv6 address in brackets, or labels of letters, digits and
# inner hyphens.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
HOST = re.compile(rf"\[[0-9A-Fa-f:.]+\]|{_LABEL}(?:\.{_LABEL})*")
NO_MATCHING_DATA = (
    "the extraction finished without result files: no data matched the CRTDL. Typical causes: the "
    "cohort criteria matched no patient, the time period is out of range of the data, or the "
    "cohort or a profile is unknown to the server; check the CRTDL"
)


class ExtractionError(StepError):
    """A terminal failure of the extraction; the message says what and what to do."""


class InvalidCrtdlError(ExtractionError):
    pass


class DeadHandleError(ExtractionError):
    """The server no longer knows the job (404/410 on a status poll)."""

    def __init__(self, handle: ExtractionHandle, status_code: int):
        self.handle = handle
        super().__init__(
            f"extraction job {handle.job_id} is gone from the extraction server (HTTP "
            # an older record's URL may hold a secret
            f"{status_code} on {shown_url(handle.status_url)})",
            status_code=status_code,
        )


class ExtractionCancelledError(ExtractionError):
    """The job's status answered 404/410 and its Task says CANCELLED or DELETED.

    Note: a person's doing; nothing is lost.
    """

    def __init__(self, handle: ExtractionHandle, status_code: int, job_status: str):
        done = "deleted" if job_status.upper() == "DELETED" else "cancelled"
        super().__init__(
            f"extraction job {handle.job_id} was {done} on the extraction server (its status "
            f"answered HTTP {status_code}, its Task says {job_status}); a {done} extraction is "
            "not submitted again on its own: to extract anew, continue the job with --resubmit, "
            "or start a new job",
            status_code=status_code,
        )


class StatusUrlMismatchError(ExtractionError):
    """The status URL answered 404/410 while the Task shows the job alive.

    Note: the URL misses the job (a proxy's prefix).
    """

    def __init__(self, handle: ExtractionHandle, status_code: int, job_status: str):
        super().__init__(
            f"extraction job {handle.job_id}: its status URL {shown_url(handle.status_url)} "
            f"answered HTTP {status_code}, but the server's Task API shows the job "
            f"{show_name(job_status)}, so the URL does not lead to it (the extraction server's "
            "own base URL may lack a proxy's path prefix); it is not submitted again. Fix the "
            "server's base URL or the proxy, then continue the job with --attach and the job's "
            "status URL (extraction show gives it), or with --resubmit to extract anew",
            status_code=status_code,
        )


def job_status_of(task: JsonObject) -> str:
    """A Task's JobStatus code (``businessStatus``), else its FHIR ``status``."""
    codings = as_objects(as_object(task.get("businessStatus")).get("coding"))
    code = next((c["code"] for c in codings if isinstance(c.get("code"), str)), None)
    return code if code is not None else str(task.get("status") or "unknown")


class ExtractionTimeoutError(ExtractionError):
    pass


class ExtractionHandle(NamedTuple):
    status_url: str
    job_id: str

    @classmethod
    def from_status_url(cls, status_url: str) -> ExtractionHandle:
        """Make the handle of a status URL: the job ID is its last path segment, decoded.

        Why: the ID is stored and shown, so one that would not show as itself (``%0A``,
        ``%E2%80%AE`` decoded) is refused, whichever door the URL came through.
        """
        job_id = httpx.URL(status_url).path.rstrip("/").rsplit("/", 1)[-1]
        if problem := ("is empty" if not job_id else invisible_character_problem(job_id)):
            raise ExtractionError(
                f"the status URL {shown_url(status_url)} names the extraction job "
                f"{show_name(job_id)}, which {problem}; a job ID is stored and shown, so check "
                "where the URL came from (the server's Content-Location, --attach, the job input "
                "or the job's job.json)"
            )
        return cls(status_url, job_id)


def endpoint_of(settings: ExtractorSettings, timeout: timedelta) -> ServiceEndpoint:
    """Return ``services.extractor`` as an endpoint whose requests wait ``timeout``.

    Note: an ``ExtractionError`` when its base_url is not set.
    """
    if not settings.base_url:
        raise ExtractionError(
            f"{BASE_URL_SETTING} is not set; set it to the extraction server's URL"
        )
    return ServiceEndpoint(
        SERVICE,
        settings.base_url.rstrip("/"),
        settings.auth,
        timeout,
        setting=BASE_URL_SETTING,
    )


def parse_crtdl(data: bytes, source: str | Path) -> JsonObject:
    """Parse the CRTDL as a JSON object, else raise ``InvalidCrtdlError``.

    Note: the error names ``source``.
    """
    try:
        crtdl = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError too
        raise InvalidCrtdlError(
            f"invalid CRTDL {source}: not valid JSON ({exc}); nothing was submitted"
        ) from exc
    if not isinstance(crtdl, dict):
        raise InvalidCrtdlError(
            f"invalid CRTDL {source}: expected a JSON object; nothing was submitted"
        )
    return crtdl


def kickoff_parameters(crtdl: bytes) -> JsonObject:
    data = base64.b64encode(crtdl).decode("ascii")
    return {
        "resourceType": "Parameters",
        "parameter": [{"name": "crtdl", "valueBase64Binary": data}],
    }


def progress_values(task: Any) -> JsonObject:
    """Return the values of the Task's progress extension ({} without one).

    Note: ``activeBatch`` as (id, stage) pairs.
    """
    for extension in as_objects(as_object(task).get("extension")):
        if str(extension.get("url", "")).endswith(PROGRESS_EXTENSION_SUFFIXES):
            values: JsonObject = {"activeBatch": ()}
            for sub in as_objects(extension.get("extension")):
                if sub.get("url") == "activeBatch":
                    parts = {
                        str(p.get("url")): p.get("valueString")
                        for p in as_objects(sub.get("extension"))
                    }
                    values["activeBatch"] += ((str(parts.get("batchId")), parts.get("stage")),)
                elif isinstance(sub.get("valueInteger"), int) and isinstance(sub.get("url"), str):
                    values[sub["url"]] = sub["valueInteger"]
            return values
    return {}


def _as_manifest(document: Any) -> JsonObject:
    """Return a completed job's manifest ({} for what is no object).

    Note: the ``Parameters`` the spec also allows are read into its shape: ``request``,
    ``requiresAccessToken``, ``output[].url`` and ``error`` texts.
    """
    if as_object(document).get("resourceType") != "Parameters":
        return as_object(document)
    manifest: JsonObject = {"output": [], "error": []}
    for parameter in as_objects(document.get("parameter")):
        name = parameter.get("name")
        parts = {str(p.get("name")): _value(p) for p in as_objects(parameter.get("part"))}
        if name == "output" and (url := parts.get("url")):
            manifest["output"].append({"url": url})
        elif name == "error":
            manifest["error"].append(parts.get("diagnostics") or _value(parameter) or "error")
        elif name == "request":
            manifest.setdefault("request", _value(parameter))
        elif name == "requiresAccessToken" and parameter.get("valueBoolean") is True:
            manifest["requiresAccessToken"] = True
    return manifest


def manifest_request(document: Any) -> str | None:
    """The manifest's ``request`` (the status URL); None if absent."""
    request = _as_manifest(document).get("request")
    return request if isinstance(request, str) else None


def requires_access_token(document: Any) -> bool:
    return _as_manifest(document).get("requiresAccessToken") is True


def result_urls(document: Any, max_files: int) -> list[str]:
    """Return the file URLs of a completed job.

    Note: none is a ``ExtractionError`` with the server's errors; more than ``max_files``
    entries are refused before any is taken.
    """
    key = "parameter" if as_object(document).get("resourceType") == "Parameters" else "output"
    if (entries := len(as_array(as_object(document).get(key)))) > max_files:
        raise ExtractionError(
            f"the completed extraction's manifest lists {entries:,} entries, more than "
            f"services.extractor.max_result_files ({max_files:,}); split the extraction (a "
            "smaller cohort or fewer attribute groups per CRTDL), or raise max_result_files if "
            "the files really are wanted"
        )
    if not isinstance((manifest := _as_manifest(document)).get("output"), list):
        raise ExtractionError(
            "the completed extraction's answer is neither a manifest nor a Parameters resource"
        )
    if urls := [o["url"] for o in as_objects(manifest["output"]) if isinstance(o.get("url"), str)]:
        return urls
    errors = [_error_entry_text(e) for e in as_array(manifest.get("error"))]
    for extension in as_objects(manifest.get("extension")):
        if str(extension.get("url", "")).endswith(ISSUES_EXTENSION_SUFFIXES):
            errors += [_issue_text(issue) for issue in as_objects(extension.get("valueObject"))]
    if errors := [e for e in errors if e]:
        raise ExtractionError(
            "the extraction finished without result files; the server reported: "
            + "; ".join(errors)
        )
    raise ExtractionError(NO_MATCHING_DATA)


def _error_entry_text(entry: Any) -> str:
    if isinstance(entry, dict):
        return (
            f"error file {shown_url(entry['url'])}"
            if isinstance(entry.get("url"), str)
            else json.dumps(entry)[:500]
        )
    return str(entry)


def _issue_text(issue: JsonObject) -> str:
    parts = [str(issue[k]) for k in ("severity", "msg", "diagnostics") if issue.get(k)]
    return ": ".join(parts[:1] + [" - ".join(parts[1:])]) if len(parts) > 1 else "".join(parts)


def _value(element: JsonObject) -> str | None:
    keys = ("valueUri", "valueUrl", "valueString", "valueCode")
    return next((element[key] for key in keys if isinstance(element.get(key), str)), None)


def resolve_file_url(base_url: str, url: str) -> str:
    """Resolve a file URL against ``base_url``.

    Note: absolute URLs are kept; ``host[:port]/path`` inherits base_url's scheme; other paths
    resolve against base_url.
    """
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
    """Tell whether ``segment`` is a ``HOST``: with a dot, a port, or ``localhost``.

    Note: ``127.0.0.1:8080`` and ``files.example.org`` are; ``files``, ``job-1`` and ``..`` are not.
    """
    host = segment.rsplit(":", 1)[0] if re.search(r":\d+$", segment) else segment
    return bool(HOST.fullmatch(host)) and (host == "localhost" or host != segment or "." in host)
