"""The ``send`` step: deliver the last data-producing step's files.

Note: in the mode ``services.send.send_as`` names (docs/steps.md). See docs/development.md#steps.
"""

import logging
import re
import time
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ValidationError

from config.settings import Settings
from tasks.clients.errors import BODY_LIMIT, ServiceError
from tasks.clients.fhir_server import AUTH_REFUSALS, FhirServer, TransactionRejected
from tasks.clients.transaction_bundles import Batch, iter_batches
from tasks.clients.transfer import SentBinary, binary_id, put_document_reference, send_binary
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.core.names import show_text
from tasks.job.contract import (
    DataFile,
    StepInput,
    StepResult,
    batch_task,
    commit_each,
    file_task,
    settings_of,
    step_task,
)
from tasks.job.filework import FileToDo, map_batches
from tasks.streams.fanout import raise_if_cancelled
from tasks.streams.files import write_file_atomically

log = logging.getLogger("dupflow.send")

DEFAULT_BATCH_SIZE = 100
STATUS_HINTS = {  # what a refusal of the whole transaction asks of the user
    **AUTH_REFUSALS,
    413: "the transaction is larger than the server accepts; lower services.send.batch_size or "
    f"raise {BODY_LIMIT}",
}


@step_task("send")
def send(step: StepInput) -> StepResult:
    settings = settings_of(step)
    mode = settings.services.send.send_as
    step.output_dir.mkdir(parents=True, exist_ok=True)
    files = step.input_files()
    to_do = [FileToDo(f.name, f.size, (f.name,), f) for f in files]
    if mode == "direct_resource_load":
        refuse_csv_input(files)
        reports = map_batches(send_files_direct, step, to_do)  # core first, as listed
        summary = {
            "transactions": sum(r["batches"] for r in reports),
            "entries": sum(r["entries"] for r in reports),
        }
    elif mode == "transfer_load":
        binaries = [r["binary"] for r in map_batches(send_files_binary, step, to_do)]
        document = commit_each(send_document_reference, step, binaries)
        summary = {"document_reference": document, "binaries": binaries}
    else:  # s3_upload: the configuration requires send_as for the send step
        reports = map_batches(send_files_s3, step, to_do)
        summary = {
            "bucket": settings.services.send.s3.bucket,
            "objects": [r["key"] for r in reports],
        }
    return step.result(files, folder=step.input_dir, mode=mode, files_sent=len(files), **summary)


def fhir_server(step: StepInput) -> FhirServer:
    settings = settings_of(step)
    return FhirServer.connect(settings.services.send, settings.tls, settings.retry)


def send_file_direct(step: StepInput, name: str) -> JsonObject:
    settings = settings_of(step)
    with fhir_server(step) as server:
        report = send_resources(
            server,
            step.input_path(name),
            step.output_dir,
            job_id=step.job_id,
            batch_size=settings.services.send.batch_size,
            max_line_bytes=settings.pipeline.max_ndjson_line_size_bytes,
        )
    return asdict(report)


def send_file_binary(step: StepInput, name: str) -> dict[str, SentBinary]:
    with fhir_server(step) as server:
        binary = send_binary(
            server, step.input_path(name), binary_id(step.job_id, name), step.output_dir
        )
    return {"binary": binary}


send_files_direct = batch_task("send-files-direct", "send", send_file_direct)
send_files_binary = batch_task("send-files-binary", "send", send_file_binary)


@file_task("send-document-reference", "send[DocumentReference]")
def send_document_reference(step: StepInput, binaries: list[SentBinary]) -> str:
    with fhir_server(step) as server:
        return put_document_reference(
            server,
            step.output_dir / "transfer.json",
            step.job_id,
            binaries,
            settings_of(step).services.send.transfer,
        )


def send_file_s3(step: StepInput, name: str) -> JsonObject:
    from tasks.clients.s3 import S3Uploader

    settings = settings_of(step)
    manifest = step.output_dir / "s3-manifest.json"
    with closing(
        S3Uploader(settings.services.send, settings.tls, settings.retry, manifest)
    ) as uploader:
        uploaded = uploader.upload(step.input_path(name), f"{step.job_id}/{name}")
    return {"key": uploaded.key, "size": uploaded.size, "etag": uploaded.etag}


send_files_s3 = batch_task("send-files-s3", "send", send_file_s3)


def refuse_csv_input(files: list[DataFile]) -> None:
    if csv := [f.name for f in files if not f.name.endswith((".ndjson", ".ndjson.zst"))]:
        raise StepError(
            "send_as direct_resource_load loads FHIR resources (NDJSON) into a server, but the "
            f"input holds {', '.join(csv)}; put send before flattening in pipeline.enabled_steps, "
            "or send the CSV files with send_as transfer_load or s3_upload"
        )


@dataclass
class DirectReport:
    file: str
    batches: int = 0
    entries: int = 0
    resumed_at_batch: int | None = None
    seconds: float = 0.0


class BatchProgress(BaseModel):
    """Where sending a file stands: ``send/progress/<file>.json``, rewritten per batch.

    Note: a record of another input or server is ignored: the file is sent from the start (PUTs and
    conditional creates do not duplicate); so is a damaged one.
    Why: the position counts entries, so a changed batch size (as a 413 asks for) goes on where the
    last confirmed batch ended; the batch size an earlier version recorded is passed over.
    """

    identity: JsonObject
    batches: int = 0
    entries: int = 0
    next_line: int = 0
    next_entry: int = 0
    complete: bool = False

    @classmethod
    def read(cls, path: Path, identity: JsonObject) -> Self:
        """Return the record at ``path`` if it is of ``identity``, else a new one."""
        try:
            stored = cls.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return cls(identity=identity)
        if {k: v for k, v in stored.identity.items() if k != "batch_size"} == identity:
            return stored.model_copy(update={"identity": identity})
        log.warning(
            "%s: progress record is for another input or server; sending from the start",
            path.name,
        )
        return cls(identity=identity)

    def record(self, path: Path, batch: Batch | None) -> None:
        """Record where the batch after confirmed ``batch`` starts; None: the file is done."""
        if batch is None:
            self.complete = True
        else:
            self.entries += len(batch.entries)
            self.batches = batch.number
            self.next_line = batch.next_line
            self.next_entry = batch.next_entry
        write_file_atomically(path, self.model_dump_json().encode())


def send_resources(
    server: FhirServer,
    source: Path,
    records: Path,
    *,
    job_id: str,
    batch_size: int,
    max_line_bytes: int,
) -> DirectReport:
    """Send ``source`` in transactions, resuming from its progress record.

    Note: the record is in ``records`` (the step's folder); a ``batch_size`` of 0 sends
    ``DEFAULT_BATCH_SIZE`` entries a transaction.
    """
    started = time.monotonic()
    identity = input_identity(source, str(server.http.base_url))
    path = records / "progress" / f"{source.name}.json"
    progress, report = BatchProgress.read(path, identity), DirectReport(source.name)
    if not progress.complete:
        if progress.batches:
            report.resumed_at_batch = progress.batches + 1
            log.info("%s: resuming at batch %d", source.name, report.resumed_at_batch)
        for batch in iter_batches(
            source,
            batch_size or DEFAULT_BATCH_SIZE,
            tag_prefix=f"{job_id}:{source.name}",
            max_line_bytes=max_line_bytes,
            start_line=progress.next_line,
            start_entry=progress.next_entry,
            first_number=progress.batches + 1,
        ):
            raise_if_cancelled()
            send_batch(server, source.name, batch, records / "failed")
            progress.record(path, batch)
        progress.record(path, None)
        report.seconds = round(time.monotonic() - started, 3)
        log.info(
            "%s: %d entries sent in %d transactions",
            source.name,
            progress.entries,
            progress.batches,
        )
    report.batches, report.entries = progress.batches, progress.entries
    return report


def input_identity(source: Path, to: str) -> JsonObject:
    """Name what a progress record is of: the file as it is now and its destination.

    Why: a file sent to one server is not taken as sent to another (``shaped_settings``); a file
    written anew to the same size (another import, new pseudonyms) is another input.
    """
    found = source.stat()
    return {"file": source.name, "size": found.st_size, "modified_ns": found.st_mtime_ns, "to": to}


def send_batch(server: FhirServer, name: str, batch: Batch, failed_dir: Path) -> None:
    """Send one transaction; a rejection stops the step, its batch kept.

    Note: the error names file, batch and first failing entry; the request and the answer
    (credentials blanked) are kept in ``failed_dir``.
    """
    body = batch.body()
    try:
        server.transaction(body, len(batch.entries))
    except ServiceError as exc:
        answer = (
            exc.response_text if isinstance(exc, TransactionRejected) else f"no answer: {exc}\n"
        )
        message = rejection_message(name, batch, exc) + keep_failed_batch(
            failed_dir, name, batch.number, body, answer
        )
        raise StepError(message, status_code=exc.status_code, transient=exc.transient) from exc


def rejection_message(name: str, batch: Batch, exc: ServiceError) -> str:
    where = f"{name}: batch {batch.number} ({len(batch.entries)} entries)"
    if not isinstance(exc, TransactionRejected):
        return f"{where} could not be sent: {exc}"
    outcome = exc.outcome or exc.message
    entry = failing_entry(batch.labels, exc.failed_entry, outcome)
    hint = f": {text}" if (text := STATUS_HINTS.get(exc.status_code or 0)) else ""
    return (
        # a rejection has an answer's status (``TransactionRejected``)
        f"{where} was rejected (HTTP {exc.status_code}){hint}; first failing entry: {entry}; the "
        f"server says: {outcome}"
    )


def failing_entry(labels: list[str], index: int | None, outcome: str) -> str:
    """Name the failing entry as the server did: by index, else by Type/id or type."""
    # a resource id from the data, shown as itself or escaped
    labels = [show_text(label) for label in labels]
    if index is not None and 0 <= index < len(labels):
        return f"entry {index + 1} ({labels[index]})"
    named = [i for i, label in enumerate(labels) if label in outcome]
    if not named:  # the entries of each resource type the text names
        kinds = [label.split("/")[0].split(" ")[0] for label in labels]
        named = [i for i, kind in enumerate(kinds) if re.search(rf"\b{re.escape(kind)}\b", outcome)]
    if len(named) == 1:
        return f"entry {named[0] + 1} ({labels[named[0]]})"
    if named:
        listed = ", ".join(f"entry {i + 1} ({labels[i]})" for i in named[:5])
        return f"one of {listed}" + (", …" if len(named) > 5 else "")
    return "not named by the server"


def keep_failed_batch(failed_dir: Path, name: str, number: int, body: bytes, answer: str) -> str:
    """Write the rejected request and the answer; return where (or why not), in words."""
    stem = failed_dir / f"{name}-batch-{number}"
    try:
        write_file_atomically(Path(f"{stem}.request.json"), body)
        write_file_atomically(Path(f"{stem}.response.txt"), answer.encode())
    except OSError as exc:
        log.warning("could not keep the rejected batch in %s: %s", failed_dir, exc)
        return f". (The request could not be kept in {failed_dir}: {exc.strerror or exc})"
    return f". The request and the answer are in {stem}.request.json and {stem.name}.response.txt"


def shaped_settings(settings: Settings) -> JsonObject:
    """Return where the step delivers: mode and destination, never credentials.

    Why: a changed destination is sent to anew.
    """
    send = settings.services.send
    return {
        "send_as": send.send_as,
        "url": send.url,
        "s3": [send.s3.bucket, send.s3.endpoint, send.s3.region],
        "transfer": [send.transfer.project_identifier, send.transfer.organization_identifier],
    }
