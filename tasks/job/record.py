"""The job's own file, ``job.json`` (``JobRecord``): what must survive a lost or changed Prefect server; what
``status``, ``list``, the job-record artifact, the ``wait`` gate and ``continue`` read.

**The one rule (Prefect vs this file).** The job's state is its flow run's on the server; the file's stands in where
no server knows the run (a lost database, a copy of the job), and either is corrected by the job's lock: Running
while no process holds the lock is Crashed.

A step's working files (``send/progress/``, the S3 upload manifest, the flattening's ``.parts``) say how far it got
within a file; they never decide whether a step is done (Prefect's cached result and ``steps`` here do).

A file that is no job record (not JSON, too large or deep, wrong types, another version; no ``version`` means 1) is
a one-line ``RecordError``. Every write goes through ``changing_record``: under an ``flock`` on ``.job.json.lock``,
atomically, so readers never lock. Older layouts (``facts.json``, ``steps/``) are not migrated. No Prefect import:
``status`` and ``list`` use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from tasks.core.errors import JobError
from tasks.core.jsonfile import MB, JsonFileError, read_json_file
from tasks.core.readable import counted, plain_text
from tasks.job.layout import JobPaths
from tasks.streams.files import exclusive_lock, write_file_atomically

WRITE_LOCK_FILE = ".job.json.lock"
SCHEMA_VERSION = 2  # version 1: the same fields without ``version`` (dupflow before the typed record)
MAX_RECORD_BYTES = 64 * MB  # the record of 8 steps with 50,000 files each is some 40 MB

# Job states: Prefect's state names, the same in every view (CLI with or without a server, job.json, README).
RUNNING, COMPLETED, FAILED, CRASHED, CANCELLED = "Running", "Completed", "Failed", "Crashed", "Cancelled"
PENDING = "Pending"  # a job made and not yet started by a flow run (nothing ran; continue starts it)
AWAITING_INSPECTION = "AwaitingInspection"  # a job at a wait step, of a dupflow before every gate was a suspend
SUSPENDED = "Suspended"  # a run at a wait step, waiting for the inspection form
FINAL_STATES = (COMPLETED, FAILED, CRASHED, CANCELLED)  # a job in one of them has ended; no run carries it on


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _iso_time(text: str) -> str:
    datetime.fromisoformat(text)  # a ValueError is the validation error
    return text


Timestamp = Annotated[str, AfterValidator(_iso_time)]
PlainText = Annotated[str, AfterValidator(plain_text)]
"""A text of the record shown as it is (the job's id and state, a flow run's id, a step's name, a message, a note):
a damaged file's escape sequences, line breaks and bidi controls become spaces as it is read (``plain_text``)."""


class RecordError(JobError):
    """A ``job.json`` that cannot be read as a job record; the message names the file and the problem."""


class FileEntry(BaseModel):
    """A data file of a step's folder as the record keeps it (``tasks.job.contract.DataFile`` is one)."""

    name: str
    size: int
    resources: int
    bundles: int | None = None
    bundled: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """What the file holds, by unit: CSV ``rows``, ``Parquet rows`` (never added to the CSVs'), NDJSON bare
        ``resources`` and ``Bundles`` holding ``bundled``, or ``lines`` if counted before Bundles were."""
        if self.name.endswith(".parquet"):
            return {"Parquet rows": self.resources}
        if self.name.endswith(".csv"):
            return {"rows": self.resources}
        if self.bundles is None:
            return {"lines": self.resources}
        return {"resources": self.resources - self.bundles, "Bundles": self.bundles, "bundled": self.bundled}


class StepRecord(BaseModel):
    """A finished (or awaiting) step as the flow saw it (``tasks.job.contract.StepResult`` is one)."""

    step: str
    position: int
    folder: str
    files: Sequence[FileEntry] = Field(default_factory=list)  # a StepResult's are DataFiles
    summary: dict[str, Any] = Field(default_factory=dict)
    awaiting: bool = False
    seconds: float | None = None
    cached: bool = False


class JobRecord(BaseModel):
    """The frozen inputs (``job_id`` to ``created_at``); the state of the latest flow run (written by the flow only);
    ``facts`` later steps and people need (the effective CRTDL, the extraction handle, a submission in flight), merged
    as soon as known. A step's files and counts are its task's result record, a gate's note the run input of its
    inspection form: a ``steps`` or ``gates`` of an older record is dropped as it is read."""

    version: int = SCHEMA_VERSION
    job_id: PlainText
    config_path: str | None = None
    job_input: str | None = None
    overrides: dict[str, str] = Field(default_factory=dict)
    enabled_steps: list[PlainText] = Field(default_factory=list)
    created_at: Timestamp = Field(default_factory=now_iso)
    updated_at: Timestamp = Field(default_factory=now_iso)
    state: PlainText = PENDING
    state_message: PlainText = ""
    flow_run_ids: list[PlainText] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)


def read_record(job_dir: Path, new: JobRecord | None = None) -> JobRecord:
    """The job's record, validated (else ``RecordError``); ``new`` (or an empty one) when there is none yet."""
    paths = JobPaths(job_dir)
    path, label = paths.job_file, f"the job record {paths.job_file}"
    if not path.exists():
        return new or JobRecord(job_id=paths.job_id)
    try:
        document = read_json_file(path, MAX_RECORD_BYTES, label)
    except JsonFileError as exc:
        raise RecordError(str(exc)) from None
    version = document.get("version", 1) if isinstance(document, dict) else SCHEMA_VERSION
    if version not in (1, SCHEMA_VERSION):
        raise RecordError(
            f"{label} has version {repr(version)[:20]}; this dupflow reads versions 1 to {SCHEMA_VERSION}: finish "
            "the job with the dupflow that made it"
        )
    try:
        return JobRecord.model_validate({**document, "version": SCHEMA_VERSION})
    except (ValidationError, TypeError) as exc:
        raise RecordError(f"{label} is no job record ({validation_problem(exc)}); fix or remove it") from None


def validation_problem(exc: Exception) -> str:
    """The first problem pydantic found, in one line: where in the file, and what."""
    if not isinstance(exc, ValidationError):
        return "expected a JSON object"
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    more = f", and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
    return f"{repr(where[:120])[1:-1]}: {first['msg']}{more}"


@contextmanager
def changing_record(job_dir: Path, new: JobRecord | None = None) -> Iterator[JobRecord]:
    """The record to change in place, written once when the block ends without raising, locked against every other
    writer; a job without a record yet starts with ``new`` (an empty one)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(job_dir / WRITE_LOCK_FILE):  # a flock of its own open file: it excludes threads too
        record = read_record(job_dir, new)
        yield record
        record.updated_at = now_iso()
        write_file_atomically(JobPaths(job_dir).job_file, (record.model_dump_json(indent=2) + "\n").encode())


def read_facts(job_dir: Path) -> dict[str, Any]:
    return read_record(job_dir).facts


def record_facts(job_dir: Path, **facts: Any) -> dict[str, Any]:
    """Merge ``facts`` into the job's facts (a value of None removes the key); returns the merged facts."""
    with changing_record(job_dir) as record:
        record.facts = {key: value for key, value in {**record.facts, **facts}.items() if value is not None}
    return dict(record.facts)


def record_state(job_dir: Path, state: str, message: str = "", flow_run_id: str | None = None) -> None:
    """The job's latest flow-run state (``message`` must already be redacted); only the flow writes it."""
    with changing_record(job_dir) as record:
        record.state, record.state_message = state, plain_text(message)
        if flow_run_id and flow_run_id not in record.flow_run_ids:
            record.flow_run_ids.append(flow_run_id)


def record_stopped(job_dir: Path, state: str, message: str) -> None:
    """The state a run stops in on an error, a signal or the loss of its server, unless the run has written its end
    already: what fails after AwaitingInspection or Completed (the record card's refresh, Prefect's final state)
    changes nothing of the job, and an AwaitingInspection taken for a crash would let ``continue`` open its gate."""
    with changing_record(job_dir) as record:
        if record.state not in (AWAITING_INSPECTION, COMPLETED):
            record.state, record.state_message = state, plain_text(message)


def settled_state(recorded: str, *, locked: bool, server: str | None = None) -> str:
    """The job's state: its flow run's on the server (``server``, the state name, when a server knows the run of
    this directory), else the file's; Running that no process holds is Crashed (killed, and the server has not seen
    its heartbeats stop yet)."""
    state = server or recorded
    return CRASHED if state == RUNNING and not locked else state


def counts_text(files: Iterable[FileEntry]) -> str:
    """What the files hold in words, e.g. ``3 resources, 2 Bundles holding 19 resources`` or ``4 rows``."""
    totals: Counter[str] = Counter()
    for each in files:
        totals.update(each.counts)
    parts = []
    if totals["resources"] or ("resources" in totals and not totals["Bundles"]):
        parts.append(counted(totals["resources"], "resource"))
    if totals["Bundles"]:
        parts.append(f"{counted(totals['Bundles'], 'Bundle')} holding {counted(totals['bundled'], 'resource')}")
    parts += [counted(totals[unit], unit[:-1]) for unit in ("lines", "rows", "Parquet rows") if unit in totals]
    return ", ".join(parts) or "0 resources"
