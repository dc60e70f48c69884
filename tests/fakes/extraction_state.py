"""State of the fake extraction server: switches, records, and the job simulation.

Jobs advance lazily: every request first calls ``ExtractionServerState.advance()``, which replays all
transitions due since the previous request in time order (so queueing, priorities and concurrency
come out the same as with a background worker, without one). ``clock`` is injectable, so a test can
drive time by hand; by default it is ``time.monotonic``.

Timing model:
- a job waits at least ``durations["PENDING"]`` and until fewer than ``max_running_jobs`` jobs run;
  among waiting jobs HIGH priority (Task.priority asap/stat/urgent) goes first, then submission order;
- RUNNING_GET_COHORT and RUNNING_PROCESS_CORE last their duration;
- in RUNNING_PROCESS_BATCH, batches run ``max_concurrency`` at a time and each takes
  ``durations["RUNNING_PROCESS_BATCH"]``, so the phase lasts that times ceil(batches / max_concurrency).
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from tests.fakes.extraction_content import ContentPlan
from tests.fakes.extraction_crtdl import Crtdl


class JobStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING_GET_COHORT = "RUNNING_GET_COHORT"
    RUNNING_PROCESS_BATCH = "RUNNING_PROCESS_BATCH"
    RUNNING_PROCESS_CORE = "RUNNING_PROCESS_CORE"
    PAUSED = "PAUSED"
    TEMP_FAILED = "TEMP_FAILED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


RUNNING = (JobStatus.RUNNING_GET_COHORT, JobStatus.RUNNING_PROCESS_BATCH, JobStatus.RUNNING_PROCESS_CORE)
FINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
_ADVANCING = (JobStatus.PENDING, *RUNNING)
_NEXT_PHASE = {
    JobStatus.RUNNING_GET_COHORT: JobStatus.RUNNING_PROCESS_BATCH,
    JobStatus.RUNNING_PROCESS_BATCH: JobStatus.RUNNING_PROCESS_CORE,
    JobStatus.RUNNING_PROCESS_CORE: JobStatus.COMPLETED,
}
HIGH_PRIORITIES = frozenset({"asap", "stat", "urgent"})
BATCH_STAGES = ("CONSENT_FETCH", "DIRECT_LOAD", "REFERENCE_RESOLVE", "CASCADING_DELETE", "COPY_REDACT")


class TransitionError(Exception):
    """A Task operation not allowed in the job's state (answered 409)."""


@dataclass(frozen=True)
class RecordedRequest:
    origin: Literal["api", "files"]
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Submission:
    body: bytes
    headers: dict[str, str]  # lower-cased names
    status: int
    job_id: str | None


@dataclass
class Job:
    id: str
    seq: int
    crtdl: Crtdl
    patient_ids: tuple[str, ...]
    batch_ids: tuple[str, ...]
    batch_size: int
    plan: ContentPlan
    submitted_at: float
    priority: str = "routine"
    status: JobStatus = JobStatus.PENDING
    phase: JobStatus = JobStatus.PENDING  # last work phase; differs from status while paused/stopped
    phase_start: float = 0.0
    eligible_at: float = 0.0
    stopped_elapsed: float | None = None  # time spent in ``phase`` when the job stopped advancing
    paused_from: JobStatus | None = None
    version_events: int = 1
    started_at: float | None = None
    finished_at: float | None = None
    last_updated: float = 0.0
    failure: str | None = None

    @property
    def cohort_size(self) -> int:
        return len(self.patient_ids)

    @property
    def is_high_priority(self) -> bool:
        return self.priority in HIGH_PRIORITIES

    @property
    def cohort_known(self) -> bool:
        return self.phase in (JobStatus.RUNNING_PROCESS_BATCH, JobStatus.RUNNING_PROCESS_CORE, JobStatus.COMPLETED)

    def batch_patients(self, batch_id: str) -> tuple[str, ...]:
        index = self.batch_ids.index(batch_id)
        return self.patient_ids[index * self.batch_size : (index + 1) * self.batch_size]

    def elapsed(self, now: float) -> float:
        return self.stopped_elapsed if self.stopped_elapsed is not None else now - self.phase_start


@dataclass(frozen=True)
class BatchProgress:
    completed: int
    active: tuple[tuple[str, str], ...]  # (batchId, stage) of batches being processed

    def percent(self, total: int) -> int:
        return 100 if total == 0 else self.completed * 100 // total


@dataclass
class ExtractionServerState:
    """All switches, records and jobs of one fake extraction server. Thread-safe through ``lock``."""

    # --- simulation ---------------------------------------------------------------------------
    durations: dict[str, float] = field(
        default_factory=lambda: {
            "PENDING": 0.05,
            "RUNNING_GET_COHORT": 0.05,
            "RUNNING_PROCESS_BATCH": 0.05,
            "RUNNING_PROCESS_CORE": 0.05,
        }
    )
    cohort_size: int = 5  # patients per job when no patient parameters are given
    batch_size: int = 2  # patients per batch file (torch.batchsize)
    max_concurrency: int = 4  # batches processed at once (torch.maxconcurrency)
    max_running_jobs: int = 2  # jobs out of PENDING at once; the rest queue by priority
    resources_per_patient: int = 4  # spread round-robin over the CRTDL's patient resource groups
    core_resources_per_group: int = 2
    default_core_types: tuple[str, ...] = ("Medication", "Organization")  # core.ndjson when no core group
    clock: Callable[[], float] = time.monotonic

    # --- protocol variants (spec vs. real server) -------------------------------------------------
    kickoff_status: int = 202  # spec: 200
    extension_style: Literal["torch", "extractor"] = "torch"
    stale_version_status: int = 409  # real server: 412
    lenient_transitions: bool = False  # real server: $pause from PENDING/TEMP_FAILED, $cancel of CANCELLED is a no-op
    result_shape: Literal["manifest", "parameters"] = "manifest"
    file_url_style: Literal["absolute", "relative", "host_prefixed"] = "absolute"
    files_base_url: str | None = None  # default {base}/files; point at a second origin to go cross-origin
    files_path: str = "/files"
    requires_access_token: bool = False  # also: file requests failing ``auth_check`` answer 401
    task_api: bool = True  # False: no /fhir/Task (older servers answer 404)
    status_102: Literal["interim", "final"] | None = None  # in-progress polls answered with 102

    # --- faults ---------------------------------------------------------------------------------
    response_delay: float = 0.0  # seconds slept before answering any request
    omit_content_location: bool = False
    status_unavailable_polls: int = 0  # next N status polls answer 503
    fail_next_status: bool = False  # next status poll fails its job and answers 500
    fail_jobs: bool = False  # jobs fail when their cohort query ends
    failure_diagnostics: str = "Cohort query failed: FHIR server answered 500 for Procedure search"
    empty_output: Literal["with_issues", "without_issues"] | None = None
    job_issues: list[dict] = field(default_factory=list)  # extra torch-job-issues entries
    file_not_ready_probes: int = 0  # first N requests per file answer 404
    head_status: int | None = None  # e.g. 405 or 403 for every HEAD
    stall_downloads: int = 0  # next N full GETs pause ``stall_seconds`` after ``stall_after_bytes``
    stall_after_bytes: int = 1024
    stall_seconds: float = 1.0
    reset_downloads: int = 0  # next N full GETs are reset after ``reset_after_bytes``
    reset_after_bytes: int = 1024
    faults_on_ranges: bool = False  # the stall and reset switches count GETs with a Range too (resumed downloads)
    ignore_ranges: bool = False  # every GET is answered 200 with the whole file, as by a server without ranges
    delete_fails: bool = False
    move_version_on_put: int = 0  # next N priority PUTs find the version moved on (as when a batch finishes)
    delete_files_after: float = 0.0  # real server: DELETE marks the job deleted, its files vanish later
    cohort_preview: bool = True  # False: no $evaluate-cohort (older servers answer 404)
    auth_check: Callable[[dict[str, str]], bool] | None = None  # API requests failing it answer 401
    url_userinfo: str | None = None  # e.g. "user:pw": put into Content-Location, the manifest's request and file URLs
    extra_output_entries: int = 0  # a completed manifest lists N more outputs, streamed without Content-Length
    edit_task: Callable[[dict], None] | None = None  # changes every Task before it is answered (hostile fields)
    cohort_ids: tuple[str, ...] | None = None  # the patient ids $evaluate-cohort answers (else ``cohort_of``)

    # --- directory mode -----------------------------------------------------------------------------
    serve_dir: Path | None = None  # every job's output is this directory's NDJSON files (plain or .zst)

    # --- records --------------------------------------------------------------------------------
    requests: list[RecordedRequest] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    polls: Counter = field(default_factory=Counter)  # job id -> status polls
    file_gets: Counter = field(default_factory=Counter)  # "<jobId>/<file>" -> GETs (ranged included)
    file_heads: Counter = field(default_factory=Counter)
    range_probes: Counter = field(default_factory=Counter)  # GETs with a Range header
    file_requests: Counter = field(default_factory=Counter)  # any request per file (readiness faults)

    jobs: dict[str, Job] = field(default_factory=dict)
    deleted: dict[str, tuple[Job, float]] = field(default_factory=dict)  # job id -> (job, files removed at)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _cursor: float | None = field(default=None, repr=False)
    _seq: int = field(default=0, repr=False)
    _wall_offset: float | None = field(default=None, repr=False)
    _workdir: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    # --- time -----------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

    def wall(self, t: float) -> datetime:
        """The wall-clock moment of simulation time ``t``."""
        with self.lock:
            if self._wall_offset is None:
                self._wall_offset = time.time() - self.now()
            return datetime.fromtimestamp(self._wall_offset + t, UTC)

    @property
    def workdir(self) -> Path:
        """Temporary directory for generated result files; removed by ``close()``."""
        with self.lock:
            if self._workdir is None:
                self._workdir = tempfile.TemporaryDirectory(prefix="fake-extraction-")
            return Path(self._workdir.name)

    def close(self) -> None:
        with self.lock:
            if self._workdir is not None:
                self._workdir.cleanup()
                self._workdir = None

    # --- records --------------------------------------------------------------------------------
    def record_request(self, request: RecordedRequest) -> None:
        with self.lock:
            self.requests.append(request)

    def requests_to(self, path_prefix: str, origin: str | None = None) -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.requests if r.path.startswith(path_prefix) and origin in (None, r.origin)]

    def take(self, switch: str) -> bool:
        """Consume one unit of a countdown fault switch (e.g. ``stall_downloads``); True if it fired."""
        with self.lock:
            remaining = getattr(self, switch)
            if remaining <= 0:
                return False
            setattr(self, switch, remaining - 1)
            return True

    # --- jobs -----------------------------------------------------------------------------------
    def submit(self, crtdl: Crtdl, patient_ids: list[str]) -> Job:
        with self.lock:
            now = self.now()
            self.advance(now)
            self._seq += 1
            job_id = str(uuid.uuid4())
            patients = tuple(patient_ids) or self.cohort_of(crtdl.digest)
            batch_count = math.ceil(len(patients) / self.batch_size)
            job = Job(
                id=job_id,
                seq=self._seq,
                crtdl=crtdl,
                patient_ids=patients,
                batch_ids=tuple(str(uuid.uuid5(uuid.UUID(job_id), f"batch-{i}")) for i in range(batch_count)),
                batch_size=self.batch_size,
                plan=ContentPlan(self.resources_per_patient, self.core_resources_per_group, self.default_core_types),
                submitted_at=now,
                phase_start=now,
                eligible_at=now + self.durations["PENDING"],
                last_updated=now,
            )
            self.jobs[job_id] = job
            return job

    def cohort_of(self, digest: str) -> tuple[str, ...]:
        """The patients a cohort definition selects: ``cohort_size`` ids seeded by the CRTDL's digest, so a
        cohort preview and an extraction of the same CRTDL agree."""
        return tuple(f"pat-{digest}-{i:05d}" for i in range(1, self.cohort_size + 1))

    def job(self, job_id: str) -> Job | None:
        with self.lock:
            self.advance()
            return self.jobs.get(job_id)

    def forget_jobs(self) -> None:
        """Simulate a server restart that lost its job store: every handle answers 404."""
        with self.lock:
            self.jobs.clear()

    def delete_job(self, job_id: str) -> bool:
        """Forget the job at once; its files stay readable for ``delete_files_after`` seconds."""
        with self.lock:
            job = self.jobs.pop(job_id, None)
            if job is not None:
                self.deleted[job_id] = (job, self.now() + self.delete_files_after)
            return job is not None

    def deleted_job(self, job_id: str) -> Job | None:
        """A deleted job whose files have not been removed yet (TORCH's Task read shows it DELETED until then)."""
        with self.lock:
            return self.deleted[job_id][0] if job_id in self.deleted else None

    def files_job(self, job_id: str) -> Job | None:
        """The job whose files the file server may still serve: a live job, or a deleted one whose files
        have not been removed yet."""
        with self.lock:
            self.advance()
            return self.jobs.get(job_id) or (self.deleted[job_id][0] if job_id in self.deleted else None)

    def due_file_removals(self) -> list[str]:
        """Ids of deleted jobs whose files are due for removal now (each is returned once)."""
        with self.lock:
            now = self.now()
            due = [job_id for job_id, (_, at) in self.deleted.items() if at <= now]
            for job_id in due:
                del self.deleted[job_id]
            return due

    def add_served_job(self) -> Job:
        """A completed job whose output is ``serve_dir`` (directory mode); its id derives from the path."""
        with self.lock:
            job_id = str(uuid.uuid5(uuid.NAMESPACE_URL, Path(self.serve_dir).resolve().as_uri()))
            now = self.now()
            self._seq += 1
            job = Job(
                id=job_id,
                seq=self._seq,
                crtdl=Crtdl(data={}, digest="served", groups=()),
                patient_ids=(),
                batch_ids=(),
                batch_size=self.batch_size,
                plan=ContentPlan(0, 0, ()),
                submitted_at=now,
                started_at=now,
                phase_start=now,
                last_updated=now,
            )
            self._enter_phase(job, JobStatus.COMPLETED, now)
            self.jobs[job_id] = job
            return job

    def version(self, job: Job, now: float) -> int:
        """Task.meta.versionId: moves on with every transition, priority change and finished batch."""
        return job.version_events + self.batch_progress(job, now).completed

    def move_version(self, job: Job) -> None:
        """Something changed on the job without a state transition (e.g. a batch finished)."""
        with self.lock:
            self._touch(job, self.now())

    # --- Task operations --------------------------------------------------------------------------
    def set_priority(self, job: Job, priority: str) -> None:
        with self.lock:
            job.priority = priority
            self._touch(job, self.now())

    def pause(self, job: Job) -> None:
        with self.lock:
            now = self.now()
            allowed = RUNNING + ((JobStatus.PENDING, JobStatus.TEMP_FAILED) if self.lenient_transitions else ())
            if job.status not in allowed:
                raise TransitionError(_reason(job.status, "not running"))
            job.paused_from = job.status
            self._stop(job, JobStatus.PAUSED, now)

    def resume(self, job: Job) -> None:
        with self.lock:
            now = self.now()
            if job.status is not JobStatus.PAUSED:
                raise TransitionError(_reason(job.status, "not paused"))
            self._restart(job, job.paused_from or job.phase, now)

    def cancel(self, job: Job) -> None:
        with self.lock:
            if job.status is JobStatus.CANCELLED and self.lenient_transitions:
                return
            if job.status in FINAL:
                raise TransitionError(_reason(job.status, ""))
            self._stop(job, JobStatus.CANCELLED, self.now())

    def force_status(self, job_id: str, status: JobStatus | str, failure: str | None = None) -> None:
        """Test helper: put a job into any state. PENDING/RUNNING_* restart that phase now; other
        states freeze the job where it is (TEMP_FAILED stays until forced again)."""
        with self.lock:
            now = self.now()
            self.advance(now)
            job, status = self.jobs[job_id], JobStatus(status)
            if status in _ADVANCING or status is JobStatus.COMPLETED:
                job.stopped_elapsed = None
                self._enter_phase(job, status, now)
            else:
                job.failure = failure or job.failure
                self._stop(job, status, now)

    # --- simulation -------------------------------------------------------------------------------
    def advance(self, now: float | None = None) -> None:
        """Apply every transition due up to ``now``, in time order."""
        with self.lock:
            now = self.now() if now is None else now
            cursor = now if self._cursor is None else min(self._cursor, now)
            while True:
                self._start_waiting_jobs(cursor)
                due = self._next_event_time(cursor)
                if due is None or due > now:
                    break
                cursor = due
                for job in list(self.jobs.values()):
                    if job.status in RUNNING and self._phase_end(job) <= cursor:
                        self._finish_phase(job, cursor)
            self._cursor = now

    def batch_progress(self, job: Job, now: float) -> BatchProgress:
        total = len(job.batch_ids)
        if job.phase in (JobStatus.RUNNING_PROCESS_CORE, JobStatus.COMPLETED):
            return BatchProgress(total, ())
        if job.phase is not JobStatus.RUNNING_PROCESS_BATCH:
            return BatchProgress(0, ())
        per_batch = self.durations["RUNNING_PROCESS_BATCH"]
        if per_batch <= 0:
            return BatchProgress(total, ())
        rounds, within = divmod(job.elapsed(now), per_batch)
        completed = min(total, int(rounds) * self.max_concurrency)
        stage = BATCH_STAGES[min(len(BATCH_STAGES) - 1, int(within / per_batch * len(BATCH_STAGES)))]
        running = job.batch_ids[completed : completed + self.max_concurrency]
        active = tuple((b, stage) for b in running) if job.status is JobStatus.RUNNING_PROCESS_BATCH else ()
        return BatchProgress(completed, active)

    def _start_waiting_jobs(self, t: float) -> None:
        free = self.max_running_jobs - sum(1 for j in self.jobs.values() if j.status in RUNNING)
        waiting = sorted(
            (j for j in self.jobs.values() if j.status is JobStatus.PENDING and j.eligible_at <= t),
            key=lambda j: (not j.is_high_priority, j.seq),
        )
        for job in waiting[: max(free, 0)]:
            job.started_at = t
            self._enter_phase(job, JobStatus.RUNNING_GET_COHORT, t)

    def _next_event_time(self, t: float) -> float | None:
        times = [self._phase_end(j) for j in self.jobs.values() if j.status in RUNNING]
        if sum(1 for j in self.jobs.values() if j.status in RUNNING) < self.max_running_jobs:
            times += [j.eligible_at for j in self.jobs.values() if j.status is JobStatus.PENDING and j.eligible_at > t]
        return min(times, default=None)

    def _phase_end(self, job: Job) -> float:
        duration = self.durations[job.phase.value]
        if job.phase is JobStatus.RUNNING_PROCESS_BATCH:
            duration *= math.ceil(len(job.batch_ids) / self.max_concurrency)
        return job.phase_start + duration

    def _finish_phase(self, job: Job, t: float) -> None:
        if job.phase is JobStatus.RUNNING_GET_COHORT and self.fail_jobs:
            job.failure = self.failure_diagnostics
            self._stop(job, JobStatus.FAILED, t)
            return
        self._enter_phase(job, _NEXT_PHASE[job.phase], t)

    def _enter_phase(self, job: Job, phase: JobStatus, t: float) -> None:
        job.status = job.phase = phase
        job.phase_start = t
        if phase is JobStatus.PENDING:
            job.eligible_at = t
        if phase is JobStatus.COMPLETED:
            job.finished_at = t
        self._touch(job, t)

    def _stop(self, job: Job, status: JobStatus, t: float) -> None:
        if job.stopped_elapsed is None:
            job.stopped_elapsed = job.elapsed(t)
        job.status = status
        if status in FINAL:
            job.finished_at = t
        self._touch(job, t)

    def _restart(self, job: Job, status: JobStatus, t: float) -> None:
        if status in _ADVANCING:
            job.phase_start = t - (job.stopped_elapsed or 0.0)
            job.stopped_elapsed = None
            job.eligible_at = min(job.eligible_at, t)
        job.status = status
        self._touch(job, t)

    @staticmethod
    def _touch(job: Job, t: float) -> None:
        job.version_events += 1
        job.last_updated = t


def _reason(status: JobStatus, fallback: str) -> str:
    reasons = {
        JobStatus.COMPLETED: "already completed",
        JobStatus.FAILED: "already failed",
        JobStatus.CANCELLED: "already cancelled",
    }
    return reasons.get(status, f"{fallback} (status {status.value})")


class ManualClock:
    """Simulation time for ``clock``: it only moves when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float) -> None:
        self.t += seconds
