"""The job's own file, ``job.json``: what Prefect cannot hold durably, in one file behind this one module.

Prefect's flow-run and task-run states (with the cached results in ``.prefect/results/``) say what ran; the
job-record artifact is their picture. ``job.json`` keeps what must survive a lost or changed server, and is what
``status``, ``list``, the job-record artifact, the ``wait`` gate and ``continue`` all read:

- the frozen inputs (``job_id``, ``config_path``, ``job_input``, ``overrides``, ``enabled_steps``, ``created_at``);
- the job's state: that of its latest flow run (``state``, ``state_message``, ``flow_run_ids``), written by the
  flow itself at every transition (started, awaiting inspection, suspended, ended) and by nothing else;
- ``facts``: what the job learned that later steps and people need (the effective CRTDL, the extraction handle
  and a submission in flight), merged key by key the moment they are known;
- ``steps``: per position (``"00"``, ``"01"``, …) the finished step's result as the flow saw it;
- ``gates``: per wait-step position, when the gate paused the job, resumes without confirmation, and its release
  with the inspection note.

**The one rule (Prefect vs this file).** The file is the job's state; the server shows it. When they disagree,
the file wins, corrected by the job's lock: a file that says Running while no process holds the lock is
Crashed (its process was killed). One exception: a file that says Suspended (a deployment run waiting for the UI's
form, with no process of ours behind it) defers to the server's state of that flow run, since only the server
sees it resumed or cancelled. A UI Resume of a *local* paused run therefore changes nothing: no process runs it;
the job stays AwaitingInspection until ``continue``, whose flow run closes the old run as ``Continued``.

Not in it, on purpose: a step's working files inside its own folder (``send/progress/<file>.json``, the S3
upload manifest, the flattening's ``.parts``) say how far the step got *within* a file, so that a resumed step never
repeats work a server already did; they never decide whether a step is done (Prefect's cached result and this
file's ``steps`` do).

Every write is a read-modify-write under a lock (a thread lock, and an ``flock`` on ``.job.json.lock`` beside the
file for other processes), written atomically (temporary name, fsync, rename), so readers never lock. Job
directories of older versions (``facts.json``, ``steps/``, ``wait-NN`` markers) are not migrated: finish or
discard them with the version that made them. Import-light on purpose (no Prefect): ``status`` and ``list`` use it.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.job.layout import JobPaths

from tasks.streams.files import exclusive_lock, write_file_atomically

WRITE_LOCK_FILE = ".job.json.lock"

# Job states: Prefect's state names, the same in every view (CLI with or without a server, job.json, README).
RUNNING, COMPLETED, FAILED, CRASHED, CANCELLED = "Running", "Completed", "Failed", "Crashed", "Cancelled"
PENDING = "Pending"  # a job made and not yet started by a flow run (nothing ran; continue starts it)
AWAITING_INSPECTION = "AwaitingInspection"
SUSPENDED = "Suspended"  # a deployment run at a wait step, waiting for the inspection form
CONTINUED = "Continued"  # the final state of a paused flow run whose job a later flow run continued

_thread_lock = threading.Lock()


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- reading and writing the file ------------------------------------------------------------------------------


def read_record(job_dir: Path) -> dict[str, Any]:
    """The whole record; empty when the job has none (yet)."""
    try:
        return json.loads(JobPaths(job_dir).job_file.read_text())
    except FileNotFoundError:
        return {}


def update_record(job_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to the record in place and write it back, as one step against every other writer."""
    with _write_lock(job_dir):
        record = read_record(job_dir)
        change(record)
        record["updated_at"] = now_iso()
        write_file_atomically(JobPaths(job_dir).job_file, (json.dumps(record, indent=2, default=str) + "\n").encode())
        return record


@contextmanager
def _write_lock(job_dir: Path) -> Iterator[None]:
    with _thread_lock:
        job_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(job_dir / WRITE_LOCK_FILE):
            yield


# --- facts -----------------------------------------------------------------------------------------------------


def read_facts(job_dir: Path) -> dict[str, Any]:
    return dict(read_record(job_dir).get("facts") or {})


def record_facts(job_dir: Path, **facts: Any) -> dict[str, Any]:
    """Merge ``facts`` into the job's facts (a value of None removes the key); returns the merged facts."""

    def merge(record: dict[str, Any]) -> None:
        merged = record.setdefault("facts", {})
        for key, value in facts.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value

    return dict(update_record(job_dir, merge)["facts"])


# --- the flow run's state --------------------------------------------------------------------------------------


def record_state(job_dir: Path, state: str, message: str = "", flow_run_id: str | None = None) -> None:
    """The job's latest flow-run state (``message`` must already be redacted); only the flow writes it."""

    def write(record: dict[str, Any]) -> None:
        record["state"], record["state_message"] = state, message
        runs = record.setdefault("flow_run_ids", [])
        if flow_run_id and flow_run_id not in runs:
            runs.append(flow_run_id)

    update_record(job_dir, write)


def settled_state(recorded: str, *, locked: bool, server: str | None = None) -> str:
    """The job's state by the module's one rule: the file's, Crashed for a Running that no process holds, and the
    server's for a Suspended run (``server``: the state name of the job's newest flow run, if a server answered)."""
    if recorded == RUNNING and not locked:
        return CRASHED
    if recorded == SUSPENDED and server:
        return server
    return recorded


# --- steps -----------------------------------------------------------------------------------------------------


def record_step(job_dir: Path, position: int, result: dict[str, Any]) -> None:
    """A step's result as the flow saw it (also when served from the cache); a step after it is forgotten, since
    its input may have changed (a corrected file at a gate)."""

    def write(record: dict[str, Any]) -> None:
        steps = record.setdefault("steps", {})
        for later in [key for key in steps if int(key) > position]:
            del steps[later]
        steps[position_key(position)] = result

    update_record(job_dir, write)


def step_results(job_dir: Path) -> dict[int, dict[str, Any]]:
    """The recorded step results by position."""
    return {int(key): result for key, result in (read_record(job_dir).get("steps") or {}).items()}


def position_key(position: int) -> str:
    return f"{position:02d}"


def file_counts(file: Mapping[str, Any]) -> dict[str, int]:
    """What a recorded data file holds, by unit: ``rows`` of a CSV file, ``Parquet rows`` of a Parquet file (the
    same rows again, so never added to the CSVs'); of an NDJSON file its bare ``resources`` and its ``Bundles``
    with the resources their entries hold (``bundled``), or only ``lines`` when the file was counted before
    Bundles were (an older job's record has no ``bundles``: its lines may be Bundles or resources)."""
    name, count = file["name"], file["resources"]
    if name.endswith(".parquet"):
        return {"Parquet rows": count}
    if name.endswith(".csv"):
        return {"rows": count}
    bundles = file.get("bundles")
    if bundles is None:
        return {"lines": count}
    return {"resources": count - bundles, "Bundles": bundles, "bundled": file.get("bundled") or 0}


def counts_text(counts: Iterable[Mapping[str, int]]) -> str:
    """Files' ``file_counts`` in words: ``12 resources``, ``2 Bundles holding 19 resources``, ``4 rows``, or
    several of them for a mixed folder (``3 resources, 2 Bundles holding 19 resources``)."""
    totals: Counter[str] = Counter()
    for each in counts:
        totals.update(each)
    parts = []
    if totals["resources"] or ("resources" in totals and not totals["Bundles"]):
        parts.append(f"{totals['resources']} resources")
    if totals["Bundles"]:
        bundles = "Bundle" if totals["Bundles"] == 1 else "Bundles"
        parts.append(f"{totals['Bundles']} {bundles} holding {totals['bundled']} resources")
    parts += [f"{totals[unit]} {unit}" for unit in ("lines", "rows", "Parquet rows") if unit in totals]
    return ", ".join(parts) or "0 resources"


# --- gates -----------------------------------------------------------------------------------------------------


def gate(job_dir: Path, position: int) -> dict[str, Any]:
    """The wait gate at ``position``: ``paused_at`` once it paused the job, ``released`` with its note."""
    return dict((read_record(job_dir).get("gates") or {}).get(position_key(position)) or {})


def mark_gate_paused(job_dir: Path, position: int) -> None:
    """Note when the gate first paused the job, once its instructions are published (``continue`` releases the
    gates that paused)."""

    def write(record: dict[str, Any]) -> None:
        record.setdefault("gates", {}).setdefault(position_key(position), {}).setdefault("paused_at", now_iso())

    update_record(job_dir, write)


def release_gate(job_dir: Path, position: int, note: str) -> None:
    """Open the gate at ``position`` (``continue``, or a confirmed resume of a deployment run), with its note."""

    def write(record: dict[str, Any]) -> None:
        entry = record.setdefault("gates", {}).setdefault(position_key(position), {})
        entry.update(released=True, released_at=now_iso(), note=note)

    update_record(job_dir, write)


def release_awaiting_gates(job_dir: Path, note: str) -> list[int]:
    """Open every gate that paused the job and is not open yet; returns their positions."""
    opened: list[int] = []

    def write(record: dict[str, Any]) -> None:
        for key, entry in (record.get("gates") or {}).items():
            if entry.get("paused_at") and not entry.get("released"):
                entry.update(released=True, released_at=now_iso(), note=note)
                opened.append(int(key))

    update_record(job_dir, write)
    return opened


def count_unconfirmed_resume(job_dir: Path, position: int) -> int:
    """One more resume of the gate without the confirmation; returns how many there were."""

    def write(record: dict[str, Any]) -> None:
        entry = record.setdefault("gates", {}).setdefault(position_key(position), {})
        entry["unconfirmed_resumes"] = int(entry.get("unconfirmed_resumes", 0)) + 1

    return int(update_record(job_dir, write)["gates"][position_key(position)]["unconfirmed_resumes"])
