"""The job's own file, ``job.json``: its frozen inputs and the facts it learned.

No Prefect import: ``status`` uses it. See docs/development.md#the-job-record.
"""

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from tasks.core.errors import JobError
from tasks.core.json_shapes import JsonObject
from tasks.core.jsonfile import MB, JsonFileError, read_json_file
from tasks.core.readable import counted, plain_text
from tasks.job.layout import JobPaths
from tasks.streams.files import exclusive_lock, write_file_atomically

WRITE_LOCK_FILE = ".job.json.lock"
SCHEMA_VERSION = 3  # 2 also held state, flow runs, steps and gates; 1 had no ``version``
# a version 2 record held every step's files: of 8 steps with 50,000 files, some 40 MB
MAX_RECORD_BYTES = 64 * MB

# Job states: Prefect's state names, the same in every view (the UI, status, list, README).
RUNNING = "Running"
COMPLETED = "Completed"
FAILED = "Failed"
CRASHED = "Crashed"
CANCELLED = "Cancelled"
SUSPENDED = "Suspended"  # a run at a wait step, waiting for the inspection form
# no flow run of the job on this server (a new server or database, another home's, a copy)
UNKNOWN = "Unknown"
# a job in one of them has ended; no run carries it on
FINAL_STATES = (COMPLETED, FAILED, CRASHED, CANCELLED)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _iso_time(text: str) -> str:
    datetime.fromisoformat(text)  # a ValueError is the validation error
    return text


Timestamp = Annotated[str, AfterValidator(_iso_time)]
PlainText = Annotated[str, AfterValidator(plain_text)]
"""A text of the record shown as it is: a damaged file's escape sequences, line breaks and bidi
controls become spaces as it is read."""


class RecordError(JobError):
    """A ``job.json`` that is no job record; the message names the file and problem."""


@contextmanager
def as_record_error() -> Iterator[None]:
    """Raise a ``JsonFileError`` of the block as a ``RecordError``, same message."""
    try:
        yield
    except JsonFileError as exc:
        raise RecordError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A data file of a step's folder as the record keeps it (``DataFile`` is one).

    Why: a dataclass of slots, 80 bytes, not a model's 380: the flow holds one per file of a step
    for the whole job.
    """

    name: str
    size: int
    resources: int
    bundles: int = 0
    bundled: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """What the file holds, by unit.

        Note: CSV ``rows``, ``Parquet rows`` (never added to the CSVs'), NDJSON bare ``resources``
        and ``Bundles`` holding ``bundled``.
        """
        if self.name.endswith(".parquet"):
            return {"Parquet rows": self.resources}
        if self.name.endswith(".csv"):
            return {"rows": self.resources}
        return {
            "resources": self.resources - self.bundles,
            "Bundles": self.bundles,
            "bundled": self.bundled,
        }


class FileColumns(BaseModel):
    """A model whose ``files`` are written as a list per field (a step's, a batch's)."""

    @field_serializer("files", when_used="json", check_fields=False)
    def files_as_columns(self, files: Sequence[FileEntry]) -> dict[str, list[Any]]:
        """Write the files as one list per field (``name``, ``size``, ...).

        Why: as a list of objects, a step's 10,000 files took 0.7 KB a file of the flow's peak to
        write (a dict each, the encoder's text of every key), for 0.15 KB a file written (an import
        batch's 0.2 KB); as columns 65 bytes.
        """
        names = [field.name for field in fields(files[0])] if files else []
        return {name: [getattr(each, name) for each in files] for name in names}

    @field_validator("files", mode="before", check_fields=False)
    @classmethod
    def files_from_columns(cls, files: Any) -> Any:
        """Read files written as columns (``files_as_columns``); a list as it is."""
        if not isinstance(files, dict):
            return files
        rows = zip(*files.values(), strict=True)
        return [dict(zip(files, row, strict=True)) for row in rows]


class StepRecord(FileColumns):
    """A finished (or awaiting) step as the flow saw it (``StepResult`` is one)."""

    step: str
    position: int
    folder: str
    files: Sequence[FileEntry] = []  # a StepResult's are DataFiles
    summary: JsonObject = {}
    awaiting: bool = False
    seconds: float | None = None
    cached: bool = False


class JobRecord(BaseModel):
    """The job's frozen inputs (``job_id`` to ``created_at``) and its ``facts``.

    Note: the facts are what later steps and people need: the effective CRTDL, the extraction
    handle, a submission in flight.
    """

    version: int = SCHEMA_VERSION
    job_id: PlainText
    config_path: str | None = None
    job_input: str | None = None
    overrides: dict[str, str] = {}
    enabled_steps: list[PlainText] = []
    created_at: Timestamp = Field(default_factory=now_iso)
    facts: JsonObject = {}


def read_record(job_dir: Path, new: JobRecord | None = None) -> JobRecord:
    """Read the job's record, validated (else ``RecordError``).

    Note: ``new`` (or an empty record) when there is none yet.
    """
    paths = JobPaths(job_dir)
    path, label = paths.job_file, f"the job record {paths.job_file}"
    if not path.exists():
        return new or JobRecord(job_id=paths.job_id)
    with as_record_error():
        document = read_json_file(path, MAX_RECORD_BYTES, label)
    try:
        record = JobRecord.model_validate(document)  # anything but an object is refused
    except ValidationError as exc:
        raise RecordError(
            f"{label} is no job record ({validation_problem(document, exc)}); fix or remove it"
        ) from None
    if isinstance(document, dict) and (version := document.get("version", 1)) != SCHEMA_VERSION:
        raise RecordError(
            f"{label} has version {repr(version)[:20]}; this dupflow reads version "
            f"{SCHEMA_VERSION} only: finish the job with the dupflow that made it, or start it "
            "anew"
        )
    return record


def validation_problem(document: Any, exc: ValidationError) -> str:
    """The first problem pydantic found, in one line: where in the file, and what."""
    if not isinstance(document, dict):
        return "expected a JSON object"
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    more = f", and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
    return f"{repr(where[:120])[1:-1]}: {first['msg']}{more}"


@contextmanager
def changing_record(job_dir: Path, new: JobRecord | None = None) -> Iterator[JobRecord]:
    """Lock the record (``new`` if none yet) to change in place; write it after.

    Note: nothing is written when the block raises.
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    # a flock of its own open file: it excludes threads too
    with exclusive_lock(job_dir / WRITE_LOCK_FILE):
        record = read_record(job_dir, new)
        yield record
        write_file_atomically(
            JobPaths(job_dir).job_file, (record.model_dump_json(indent=2) + "\n").encode()
        )


def read_facts(job_dir: Path) -> JsonObject:
    return read_record(job_dir).facts


def record_facts(job_dir: Path, **facts: Any) -> None:
    """Merge ``facts`` into the job's facts; None removes a key."""
    with changing_record(job_dir) as record:
        record.facts = {
            key: value for key, value in {**record.facts, **facts}.items() if value is not None
        }


def counts_text(files: Iterable[FileEntry]) -> str:
    """Say what the files hold, e.g. ``3 resources, 2 Bundles holding 19 resources``."""
    totals: Counter[str] = Counter()
    for each in files:
        totals.update(each.counts)
    parts = []
    if totals["resources"] or ("resources" in totals and not totals["Bundles"]):
        parts.append(counted(totals["resources"], "resource"))
    if totals["Bundles"]:
        parts.append(
            f"{counted(totals['Bundles'], 'Bundle')} holding "
            f"{counted(totals['bundled'], 'resource')}"
        )
    parts += [
        counted(totals[unit], unit[:-1]) for unit in ("rows", "Parquet rows") if unit in totals
    ]
    return ", ".join(parts) or "0 resources"
