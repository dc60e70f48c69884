"""Fake extraction server (TORCH) for dupflow's tests: a real HTTP server on 127.0.0.1.

Implements ../shared/spec/extraction-server-api.md plus the real server's deviations recorded in
protocols.md, with fault switches. Run alone: ``python -m tests.fakes.extraction_server --port N``;
``--serve-dir DIR`` serves an existing directory of result files (see "Directory mode").

Public API
----------
    start_extraction_server(*, ssl_context=None, file_origin=False, **state_options) -> ExtractionServer
        Started server (a ``LoopbackServer``); the caller stops it, or uses it as a context manager.
        ``state_options`` are ``ExtractionServerState`` fields. ``file_origin=True`` also starts a second
        origin serving the result files (``srv.file_server``) and points ``files_base_url`` at it.
    ExtractionServerState    dataclass with every switch and record (tests/fakes/extraction_state.py);
                             reach it as ``srv.state``; switches may be changed at any time.
    ExtractionHandler        the API handler (also serves the files under ``files_path``).
    ExtractionFilesHandler   the static file handler alone, for a second origin.
    JobStatus                job states; ``state.force_status(job_id, JobStatus.TEMP_FAILED)`` etc.

Switches (``ExtractionServerState`` fields; see the comments there)
-------------------------------------------------------------------
    simulation   durations{PENDING, RUNNING_GET_COHORT, RUNNING_PROCESS_BATCH (per batch), RUNNING_PROCESS_CORE},
                 cohort_size, batch_size, max_concurrency, max_running_jobs, resources_per_patient,
                 core_resources_per_group, default_core_types, clock (inject a manual clock for exact timing)
    variants     kickoff_status (202|200), extension_style ("torch"|"extractor"), stale_version_status (409|412),
                 lenient_transitions, result_shape ("manifest"|"parameters"),
                 file_url_style ("absolute"|"relative"|"host_prefixed"), files_base_url, files_path,
                 requires_access_token, status_102 (None|"interim"|"final": httpx only sees "interim"),
                 cohort_preview (False: no $evaluate-cohort, 404 as older servers), delete_files_after
                 (seconds the files of a deleted job stay readable; the real server removes them later),
                 auth_check (callable on the lower-cased request headers; False answers 401; with
                 requires_access_token also for file requests), task_api (False: no /fhir/Task, 404)
    faults       response_delay, omit_content_location, status_unavailable_polls (503 storm),
                 fail_next_status (500), fail_jobs + failure_diagnostics, empty_output ("with_issues"|
                 "without_issues"), job_issues, file_not_ready_probes, head_status (405|403),
                 stall_downloads/stall_after_bytes/stall_seconds, reset_downloads/reset_after_bytes, faults_on_ranges
                 (stalls and resets hit ranged GETs too), ignore_ranges (200 and the whole file), delete_fails,
                 move_version_on_put (next N priority PUTs meet a version that just moved on: 409/412),
                 url_userinfo ("user:pw" in Content-Location, the manifest's request and file URLs),
                 extra_output_entries (N more manifest outputs, streamed chunked without Content-Length),
                 edit_task (callable changing every Task answered: hostile ids, statuses, dates, URLs),
                 cohort_ids (the patient ids $evaluate-cohort answers)
    methods      forget_jobs() (restart: handles 404), force_status(job_id, status), job(job_id),
                 requests_to(path_prefix, origin)
    records      requests (origin, method, path, lower-cased headers), submissions (body, headers, status,
                 job_id), polls, file_gets, file_heads, range_probes, file_requests (Counters keyed
                 "<jobId>/<file>" or job id)

Endpoints
---------
    POST   /fhir/$extract-data            202 (``kickoff_status``) + Content-Location, 400 OperationOutcome, 406
    GET    /fhir/__status/{id}            202 progress / 200 manifest / 400 / 404 / 410 / 500 / 503
    GET    /fhir/Task, /fhir/Task/{id}    search (``Prefer: handling=strict``), read (a deleted job: DELETED until
                                          its files are removed, as TORCH; search leaves it out)
    PUT    /fhir/Task/{id}                priority; If-Match W/"<version>" (428, 409 or 412)
    POST   /fhir/Task/{id}/$pause|$resume|$cancel, DELETE /fhir/Task/{id}
    GET    /fhir/metadata                 minimal CapabilityStatement
    POST   /fhir/$evaluate-cohort         CRTDL or CCDL as application/json -> List of Patient references
    GET|HEAD {files_path}/<jobId>/<file>  <batchId>.ndjson, core.ndjson, <batchId>_consent.ndjson,
                                          reports/job-summary.json, reports/*.csv; Range -> 206

Kick-off and PUT need a JSON Content-Type (415 otherwise); If-Match must be a weak ETag (400 otherwise).

Directory mode
--------------
    start_extraction_server(serve_dir=DIR) or ``--serve-dir DIR``: the server holds a completed job
    (``srv.served_job_id``, ``srv.served_status_url``) whose manifest lists every ``*.ndjson`` and
    ``*.ndjson.zst`` under DIR (relative paths, core last); submitted jobs run as usual and end with the same
    output. Files are streamed from disk (sendfile) with HEAD and Range; nothing is read into memory.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import re
import select
import socket
import ssl
import struct
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes._server import LengthOnlyHandler, LoopbackServer
from tests.fakes.extraction_content import materialize, remove_job_files
from tests.fakes.extraction_crtdl import KickoffError, parse_kickoff
from tests.fakes.extraction_state import (
    ExtractionServerState,
    JobStatus,
    RecordedRequest,
    Submission,
    TransitionError,
)
from tests.fakes.extraction_views import (
    cohort_list,
    files_ready,
    manifest,
    outcome,
    padding_entries,
    parameters_result,
    progress_outcome,
    progress_text,
    search_bundle,
    task_resource,
    with_userinfo,
)

__all__ = [
    "ExtractionFilesHandler",
    "ExtractionHandler",
    "ExtractionServer",
    "ExtractionServerState",
    "JobStatus",
    "start_extraction_server",
]

FHIR_JSON = "application/fhir+json"
_CHUNK = 64 * 1024
_TASK_PRIORITIES = frozenset({"routine", "urgent", "asap", "stat"})
_ACCEPTABLE = frozenset({"application/fhir+json", "application/*", "*/*"})
_CONTENT_TYPES = {
    ".ndjson": "application/fhir+ndjson",
    ".zst": "application/zstd",
    ".json": "application/json",
    ".csv": "text/csv",
}
_JSON_BODIES = frozenset({"application/fhir+json", "application/json"})
_WEAK_ETAG = re.compile(r'^W/"([^"]*)"$')
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Abort(Exception):
    """Raised after the connection was reset on purpose; ends the request quietly."""


class ExtractionFilesHandler(LengthOnlyHandler):
    """Static result-file server (the nginx next to TORCH): GET, HEAD, Range; nothing else."""

    protocol_version = "HTTP/1.1"
    server_version = "FakeTorch/1.0"
    disable_nagle_algorithm = True  # headers and body go out as separate writes; avoid 40 ms delayed-ACK stalls
    origin = "files"

    @property
    def state(self) -> ExtractionServerState:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        self.body = self._read_body()
        self.path_only = unquote(urlsplit(self.path).path)
        self.query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        self.state.record_request(
            RecordedRequest(self.origin, method, self.path, {k.lower(): v for k, v in self.headers.items()})
        )
        if self.state.response_delay:
            self._silent(self.state.response_delay)
        for job_id in self.state.due_file_removals():
            remove_job_files(self.state, job_id)
        try:
            self.route(method)
        except _Abort:
            self.close_connection = True

    def route(self, method: str) -> None:
        if method in ("GET", "HEAD") and self.path_only.startswith(self.state.files_path + "/"):
            self._serve_file(method, self.path_only[len(self.state.files_path) + 1 :])
        else:
            self._send_html(404, "Not Found")

    # --- request/response helpers -------------------------------------------------------------
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def api_base(self) -> str:
        """The origin the client reached: its Host, and the scheme of a TLS-ending proxy before the server
        (``X-Forwarded-Proto``, as TORCH's base URL is set behind one) or of this connection."""
        scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        scheme = self.headers.get("X-Forwarded-Proto") or scheme
        host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
        return f"{scheme}://{host}"

    def files_base(self) -> str:
        return self.state.files_base_url or self.api_base() + self.state.files_path

    def send(
        self, status: int, body: bytes = b"", content_type: str | None = None, headers: dict | None = None
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def send_json(
        self, status: int, document: dict, content_type: str = FHIR_JSON, headers: dict | None = None
    ) -> None:
        self.send(status, json.dumps(document).encode(), content_type, headers)

    def _send_html(self, status: int, text: str) -> None:
        self.send(status, f"<html><body><h1>{status} {text}</h1></body></html>".encode(), "text/html")

    # --- files ----------------------------------------------------------------------------------
    def _serve_file(self, method: str, relative: str) -> None:
        state, key = self.state, relative
        check = state.auth_check if state.requires_access_token else None
        if check is not None and not check({k.lower(): v for k, v in self.headers.items()}):
            return self._send_html(401, "Unauthorized")
        job_id, _, name = relative.partition("/")
        ranged = self.headers.get("Range")
        with state.lock:
            state.file_requests[key] += 1
            not_ready = state.file_requests[key] <= state.file_not_ready_probes
            (state.file_heads if method == "HEAD" else state.file_gets)[key] += 1
            if ranged and method == "GET":
                state.range_probes[key] += 1
        if not_ready:
            return self._send_html(404, "Not Found")
        if method == "HEAD" and state.head_status:
            return self._send_html(state.head_status, "Not Allowed")
        job = state.files_job(job_id)
        if job is None or name not in files_ready(state, job, state.now()):
            return self._send_html(404, "Not Found")
        path = materialize(state, job, name)
        size = path.stat().st_size
        content_type = _CONTENT_TYPES.get(Path(name).suffix, "application/octet-stream")
        ranged = None if state.ignore_ranges else ranged
        span = _parse_range(ranged, size) if ranged else (0, size - 1)
        if span is None:
            return self.send(416, b"", "text/html", {"Content-Range": f"bytes */{size}"})
        start, end = span
        headers = {
            "Accept-Ranges": "none" if state.ignore_ranges else "bytes",
            "Last-Modified": self.date_time_string(int(path.stat().st_mtime)),
        }
        status = 200
        if ranged:
            status, headers["Content-Range"] = 206, f"bytes {start}-{end}/{size}"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for header, value in headers.items():
            self.send_header(header, value)
        self.send_header("Content-Length", str(max(end - start + 1, 0)))
        self.end_headers()
        if method == "GET":
            self._stream(path, start, end - start + 1, faults=not ranged or state.faults_on_ranges)

    def _stream(self, path: Path, start: int, length: int, faults: bool) -> None:
        reset_at = self.state.reset_after_bytes if faults and self.state.take("reset_downloads") else None
        stall_at = self.state.stall_after_bytes if faults and self.state.take("stall_downloads") else None
        sent = 0
        with path.open("rb") as source:
            if reset_at is None and stall_at is None:
                # From disk to socket without passing through Python (large served files, benchmarks).
                self.connection.sendfile(source, start, length)
                return
            source.seek(start)
            while sent < length:
                limit = min(_CHUNK, length - sent)
                for mark in (reset_at, stall_at):
                    if mark is not None and sent < mark:
                        limit = min(limit, mark - sent)
                chunk = source.read(limit)
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
                if sent == reset_at:
                    self._reset_connection()
                if sent == stall_at:
                    self.wfile.flush()
                    self._silent(self.state.stall_seconds)

    def _silent(self, seconds: float) -> None:
        """Say nothing for ``seconds``, or until the client hangs up, as a stalled server would.

        Why: a test can then stall far longer than any client timeout (no race on a busy machine)
        without waiting for the stall to end."""
        select.select([self.connection], [], [], seconds)

    def _reset_connection(self) -> None:
        """Close with RST (SO_LINGER 0) although Content-Length promised more bytes."""
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        raise _Abort


class ExtractionHandler(ExtractionFilesHandler):
    """The extraction API (kick-off, status, Task API, metadata) plus the result files."""

    origin = "api"

    def route(self, method: str) -> None:
        path = self.path_only
        check = self.state.auth_check
        if check is not None and not check({k.lower(): v for k, v in self.headers.items()}):
            return self.send_json(
                401, outcome("error", "login", "Authentication required"), headers={"WWW-Authenticate": "Basic"}
            )
        if method == "POST" and path == "/fhir/$extract-data":
            return self._kickoff()
        if method == "POST" and path == "/fhir/$evaluate-cohort" and self.state.cohort_preview:
            return self._evaluate_cohort()
        if method == "GET" and (match := re.fullmatch(r"/fhir/__status/([^/]+)", path)):
            return self._status(match.group(1))
        if method == "GET" and path == "/fhir/Task":
            return self._search_tasks()
        if path.startswith("/fhir/Task") and not self.state.task_api:
            return self.send_json(404, outcome("error", "not-found", f"No route for {method} {path}"))
        if match := re.fullmatch(r"/fhir/Task/([^/]+)", path):
            return self._task(method, match.group(1))
        if method == "POST" and (match := re.fullmatch(r"/fhir/Task/([^/]+)/\$(pause|resume|cancel)", path)):
            return self._task_operation(match.group(1), match.group(2))
        if method == "GET" and path == "/fhir/metadata":
            return self.send_json(200, _capability_statement(self.state.cohort_preview))
        if path.startswith(self.state.files_path + "/"):
            return super().route(method)
        self.send_json(404, outcome("error", "not-found", f"No route for {method} {path}"))

    # --- kick-off ---------------------------------------------------------------------------------
    def _kickoff(self) -> None:
        state = self.state
        headers = {k.lower(): v for k, v in self.headers.items()}
        accept = self.headers.get("Accept")
        if accept and not {t.split(";")[0].strip().lower() for t in accept.split(",")} & _ACCEPTABLE:
            self._record_submission(406, None, headers)
            return self.send_json(406, outcome("error", "not-supported", f"Not acceptable: {accept}"))
        if not self._json_body():
            self._record_submission(415, None, headers)
            return self._unsupported_media_type()
        try:
            crtdl, patients = parse_kickoff(self.body)
        except KickoffError as error:
            self._record_submission(400, None, headers)
            return self.send_json(400, outcome("fatal", "invalid", str(error)))
        job = state.submit(crtdl, patients)
        self._record_submission(state.kickoff_status, job.id, headers)
        location = {} if state.omit_content_location else {"Content-Location": self._status_url(job.id)}
        self.send(state.kickoff_status, b"", None, location)

    def _json_body(self) -> bool:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        return content_type in _JSON_BODIES

    def _unsupported_media_type(self) -> None:
        given = self.headers.get("Content-Type") or "none"
        self.send_json(
            415, outcome("error", "not-supported", f"Unsupported Content-Type: {given}; send application/fhir+json")
        )

    def _record_submission(self, status: int, job_id: str | None, headers: dict[str, str]) -> None:
        with self.state.lock:
            self.state.submissions.append(Submission(self.body, headers, status, job_id))

    def _status_url(self, job_id: str) -> str:
        return with_userinfo(f"{self.api_base()}/fhir/__status/{job_id}", self.state.url_userinfo)

    # --- cohort preview -------------------------------------------------------------------------
    def _evaluate_cohort(self) -> None:
        """A full CRTDL (only its cohortDefinition counts) or a bare CCDL, as plain JSON; no job is made."""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            given = self.headers.get("Content-Type") or "none"
            return self.send_json(
                415, outcome("error", "not-supported", f"Unsupported Content-Type: {given}; send application/json")
            )
        try:
            definition = json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            definition = None
        if not isinstance(definition, dict) or not (
            isinstance(definition.get("cohortDefinition"), dict) or "inclusionCriteria" in definition
        ):
            return self.send_json(
                400, outcome("fatal", "invalid", "Body is neither a CRTDL with a cohortDefinition nor a CCDL")
            )
        state = self.state
        patients = state.cohort_ids
        if patients is None:
            patients = state.cohort_of(hashlib.sha256(self.body).hexdigest()[:8])
        self.send_json(200, cohort_list(patients, state.wall(state.now())))

    # --- status -----------------------------------------------------------------------------------
    def _status(self, job_id: str) -> None:
        status, document, headers = self._status_answer(job_id)
        if status == 202 and self.state.status_102 == "interim":
            self.wfile.write(b"HTTP/1.1 102 Processing\r\n\r\n")
        if status == 202 and self.state.status_102 == "final":
            status, self.close_connection = 102, True
            headers = {**(headers or {}), "Connection": "close"}
        if status == 200 and self.state.extra_output_entries and "output" in document:
            return self._send_padded_manifest(job_id, document)
        self.send_json(status, document, "application/json", headers)

    def _send_padded_manifest(self, job_id: str, document: dict) -> None:
        """The manifest with ``extra_output_entries`` more outputs, chunked (no Content-Length), made as it is
        sent, after the job's own outputs (so not with ``empty_output``); a client that stops reading ends it."""
        rest = json.dumps({k: v for k, v in document.items() if k != "output"})
        head = rest[:-1] + ', "output": [' + ", ".join(json.dumps(o) for o in document["output"])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        padding = padding_entries(self.files_base(), job_id, self.state.extra_output_entries)
        pieces = itertools.chain([head], padding, ["]}"])
        try:
            for piece in pieces:
                data = piece.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _status_answer(self, job_id: str) -> tuple[int, dict, dict | None]:
        """Status code, body and extra headers of a status poll (decided under the state lock)."""
        state = self.state
        if not _is_uuid(job_id):
            return 400, outcome("fatal", "invalid", f"Invalid job id: {job_id}"), None
        with state.lock:
            state.polls[job_id] += 1
            if state.take("status_unavailable_polls"):
                return 503, outcome("error", "transient", "Service temporarily unavailable"), None
            job = state.job(job_id)
            if job is None:
                return 404, outcome("error", "not-found", f"Job {job_id} not found"), None
            if state.fail_next_status:
                state.fail_next_status = False
                state.force_status(job_id, JobStatus.FAILED, state.failure_diagnostics)
            now = state.now()
            if job.status is JobStatus.CANCELLED:
                return 410, outcome("error", "deleted", f"Job {job_id} was cancelled"), None
            if job.status is JobStatus.FAILED:
                return 500, outcome("fatal", "exception", job.failure or "Job failed"), None
            if job.status is JobStatus.TEMP_FAILED:
                return 503, outcome("error", "transient", f"Job {job_id} failed temporarily"), None
            if job.status is JobStatus.COMPLETED:
                render = parameters_result if state.result_shape == "parameters" else manifest
                return 200, render(state, job, now, self._status_url(job_id), self.files_base()), None
            return 202, progress_outcome(state, job, now), {"X-Progress": progress_text(state, job, now)}

    # --- Task API ---------------------------------------------------------------------------------
    def _search_tasks(self) -> None:
        state = self.state
        unsupported = sorted(k for k in self.query if k not in ("_id", "status"))
        ids, bad_ids = _split_values(self.query.get("_id"), _is_uuid)
        statuses, bad_statuses = _split_values(self.query.get("status"), lambda v: v in JobStatus.__members__)
        problems = [
            f"{label}: [{', '.join(values)}]"
            for label, values in (
                ("Unsupported search parameters", unsupported),
                ("Invalid _id values", bad_ids),
                ("Invalid status values", bad_statuses),
            )
            if values
        ]
        if problems and "handling=strict" in (self.headers.get("Prefer") or "").replace(" ", ""):
            return self.send_json(400, outcome("error", "invalid", "; ".join(problems)))
        with state.lock:
            state.advance()
            now = state.now()
            jobs = sorted(state.jobs.values(), key=lambda j: j.seq)
            tasks = [
                task_resource(state, j, now, self.files_base())
                for j in jobs
                if (not ids or j.id in ids) and (not statuses or j.status.value in statuses)
            ]
        self.send_json(200, search_bundle(tasks))

    def _task(self, method: str, job_id: str) -> None:
        state = self.state
        job = state.job(job_id)
        if job is None and method == "GET" and (gone := state.deleted_job(job_id)) is not None:
            # As TORCH: a deleted job stays readable, DELETED, until its files are removed (its status answers 404).
            return self.send_json(200, task_resource(state, gone, state.now(), self.files_base(), deleted=True))
        if job is None:
            return self._task_not_found(job_id)
        if method == "GET":
            return self._send_task(job_id)
        if method == "PUT":
            return self._put_priority(job_id)
        if method == "DELETE":
            if state.delete_fails:
                return self.send_json(
                    500, outcome("error", "exception", f"Failed to delete result files for job {job_id}")
                )
            state.delete_job(job_id)
            remove_job_files(state, job_id)
            return self.send(204)
        self.send_json(405, outcome("error", "not-supported", f"{method} not allowed on Task"))

    def _put_priority(self, job_id: str) -> None:
        state = self.state
        if_match = self.headers.get("If-Match")
        if not if_match:
            return self.send_json(
                428, outcome("error", "required", "If-Match header is required for PUT /fhir/Task/{id}")
            )
        weak = _WEAK_ETAG.match(if_match.strip())
        if weak is None:
            return self.send_json(
                400, outcome("error", "invalid", f'If-Match must be a weak ETag W/"<version>", got {if_match}')
            )
        if not self._json_body():
            return self._unsupported_media_type()
        try:
            task = json.loads(self.body)
            if not isinstance(task, dict) or task.get("resourceType") != "Task":
                raise ValueError("not a Task resource")
        except ValueError as exc:
            return self.send_json(400, outcome("error", "invalid", f"Could not parse Task resource: {exc}"))
        priority = task.get("priority") or "routine"
        if priority not in _TASK_PRIORITIES:
            return self.send_json(400, outcome("error", "invalid", f"Invalid Task.priority: {priority}"))
        given = weak.group(1)
        with state.lock:
            state.advance()
            job = state.jobs[job_id]
            if state.take("move_version_on_put"):
                state.move_version(job)
            expected = str(state.version(job, state.now()))
            if given != expected:
                return self.send_json(
                    state.stale_version_status,
                    outcome("error", "conflict", f"Version mismatch: expected {expected}, got {given}"),
                )
            state.set_priority(job, priority)
        self._send_task(job_id)

    def _task_operation(self, job_id: str, operation: str) -> None:
        state = self.state
        with state.lock:
            job = state.job(job_id)
            if job is None:
                return self._task_not_found(job_id)
            try:
                getattr(state, operation)(job)
            except TransitionError as error:
                return self.send_json(
                    409, outcome("error", "conflict", f"Task/{job_id} cannot be ${operation}: {error}")
                )
        self._send_task(job_id)

    def _send_task(self, job_id: str) -> None:
        state = self.state
        with state.lock:
            job = state.job(job_id)
            if job is None:
                return self._task_not_found(job_id)
            document = task_resource(state, job, state.now(), self.files_base())
        self.send_json(200, document)

    def _task_not_found(self, job_id: str) -> None:
        self.send_json(404, outcome("error", "not-found", f"Task/{job_id} not found"))


class ExtractionServer(LoopbackServer):
    """The API server, optionally with a second origin for the files; ``start()`` is idempotent so the
    already started server returned by ``start_extraction_server`` also works in a ``with`` block."""

    def __init__(
        self,
        state: ExtractionServerState,
        ssl_context: ssl.SSLContext | None = None,
        file_origin: bool = False,
        port: int = 0,
    ):
        super().__init__(ExtractionHandler, state, port=port, ssl_context=ssl_context)
        self.served_job_id: str | None = None
        self.file_server = LoopbackServer(ExtractionFilesHandler, state) if file_origin else None
        self._started = False

    def start(self) -> ExtractionServer:
        if not self._started:
            self._started = True
            if self.state.serve_dir is not None:
                self.served_job_id = self.state.add_served_job().id
            super().start()
            if self.file_server is not None:
                self.file_server.start()
                self.state.files_base_url = self.file_server.base_url + self.state.files_path
        return self

    @property
    def served_status_url(self) -> str:
        """Directory mode: the status URL of the completed job whose output is the served directory."""
        return f"{self.base_url}/fhir/__status/{self.served_job_id}"

    def stop(self) -> None:
        super().stop()
        if self.file_server is not None:
            self.file_server.stop()
        self.state.close()


def start_extraction_server(
    *, ssl_context: ssl.SSLContext | None = None, file_origin: bool = False, **state_options: Any
) -> ExtractionServer:
    """Start a fake extraction server on 127.0.0.1 (state built from ``state_options``). With
    ``serve_dir=<directory>`` the server also holds a completed job whose output is that directory's NDJSON
    files (``srv.served_status_url``), and every submitted job's output is those files too."""
    return ExtractionServer(ExtractionServerState(**state_options), ssl_context, file_origin).start()


def _is_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


def _split_values(raw: list[str] | None, valid: Callable[[str], bool]) -> tuple[set[str], list[str]]:
    values = [v.strip() for item in raw or [] for v in item.split(",") if v.strip()]
    return {v for v in values if valid(v)}, [v for v in values if not valid(v)]


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(start, end) of a single ``bytes=`` range, or None when unsatisfiable."""
    match = _RANGE.match(header.strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    return (start, end) if start <= end and start < size else None


def _capability_statement(cohort_preview: bool) -> dict:
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "kind": "instance",
        "fhirVersion": "4.0.1",
        "format": ["json"],
        "software": {"name": "Fake TORCH"},
        "rest": [
            {
                "mode": "server",
                "resource": [{"type": "Task", "interaction": [{"code": "read"}, {"code": "search-type"}]}],
                "operation": [{"name": "extract-data", "definition": "$extract-data"}]
                + ([{"name": "evaluate-cohort", "definition": "$evaluate-cohort"}] if cohort_preview else []),
            }
        ],
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.fakes.extraction_server [--port P] [--serve-dir DIR]``."""
    parser = argparse.ArgumentParser(description="Fake extraction server (TORCH)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--serve-dir", type=Path, help="serve this directory's NDJSON files (plain or .zst) as a completed job"
    )
    args = parser.parse_args(argv)
    if args.serve_dir is not None and not args.serve_dir.is_dir():
        parser.error(f"--serve-dir {args.serve_dir}: not a directory")
    server = ExtractionServer(ExtractionServerState(serve_dir=args.serve_dir), port=args.port).start()
    print(f"Fake extraction server (TORCH) listening on {server.base_url}", flush=True)
    if args.serve_dir is not None:
        print(f"completed job serving {args.serve_dir}: {server.served_status_url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    server.stop()


if __name__ == "__main__":
    main()
