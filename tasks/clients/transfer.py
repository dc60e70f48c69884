"""The job's files as one MII data transfer through the DSF (``transfer_load``).

See docs/development.md#service-clients.
"""

import base64
import logging
import time
import uuid
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import orjson

from config.services import TransferSettings
from tasks.clients.fhir_server import FhirServer
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.streams.files import write_file_atomically
from tasks.streams.ndjson import CHUNK_SIZE, NdjsonError, iter_chunks

log = logging.getLogger("dupflow.send")

PROJECT_IDENTIFIER_SYSTEM = "http://medizininformatik-initiative.de/sid/project-identifier"
ORGANIZATION_IDENTIFIER_SYSTEM = "http://dsf.dev/sid/organization-identifier"
ZIP_CONTENT_TYPE = "application/zip"
TRANSFER_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://dupflow/send/transfer_load")
BASE64_CHUNK = 3 * CHUNK_SIZE  # a multiple of 3, so chunks encode without padding in between


def binary_id(job_id: str, name: str) -> str:
    return str(uuid.uuid5(TRANSFER_NAMESPACE, f"{job_id}/Binary/{name}"))


def document_reference_id(job_id: str) -> str:
    return str(uuid.uuid5(TRANSFER_NAMESPACE, f"{job_id}/DocumentReference"))


def zip_entry_name(name: str) -> str:
    return name.removesuffix(".zst")


class SentBinary(TypedDict):
    """A data file sent as ``Binary/<id>``: its attachment and report row."""

    file: str
    id: str
    title: str
    zip_size: int
    seconds: float


def send_binary(server: FhirServer, source: Path, resource_id: str, work_dir: Path) -> SentBinary:
    """PUT ``Binary/<id>`` holding ``source`` zipped.

    Why: zipped through a temporary file whose base64 is streamed into the request, so memory stays
    flat whatever the file size.
    """
    started = time.monotonic()
    temporary = work_dir / f".{source.name}.zip.part"
    try:
        zip_data_file(source, temporary)
        body, length = binary_body(resource_id, temporary)
        server.put("Binary", resource_id, body, length=length)
        zip_size = temporary.stat().st_size
    finally:
        temporary.unlink(missing_ok=True)
    log.info("%s: sent as Binary/%s (%d bytes zipped)", source.name, resource_id, zip_size)
    return SentBinary(
        file=source.name,
        id=resource_id,
        title=zip_entry_name(source.name),
        zip_size=zip_size,
        seconds=round(time.monotonic() - started, 3),
    )


def zip_data_file(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        with archive.open(zip_entry_name(source.name), "w", force_zip64=True) as entry:
            try:
                entry.writelines(iter_chunks(source))
            except NdjsonError as exc:
                raise StepError(str(exc)) from exc


def binary_body(resource_id: str, zip_path: Path) -> tuple[Any, int]:
    """Return a function streaming the Binary's JSON, and its length in bytes.

    Note: the zip's base64 is encoded on the fly.
    """
    head = orjson.dumps(
        {"resourceType": "Binary", "id": resource_id, "contentType": ZIP_CONTENT_TYPE}
    )
    prefix, suffix = head[:-1] + b',"data":"', b'"}'
    size = zip_path.stat().st_size

    def stream() -> Iterator[bytes]:
        yield prefix
        with open(zip_path, "rb") as data:
            while chunk := data.read(BASE64_CHUNK):
                yield base64.b64encode(chunk)
        yield suffix

    return stream, len(prefix) + 4 * ((size + 2) // 3) + len(suffix)


def document_reference(
    resource_id: str, binaries: list[SentBinary], transfer: TransferSettings, date: str
) -> JsonObject:
    """Make the job's one DocumentReference: one attachment per Binary.

    Note: the fields protocols.md lists.
    """
    project = {"system": PROJECT_IDENTIFIER_SYSTEM, "value": transfer.project_identifier}
    organization = {
        "system": ORGANIZATION_IDENTIFIER_SYSTEM,
        "value": transfer.organization_identifier,
    }
    return {
        "resourceType": "DocumentReference",
        "id": resource_id,
        "masterIdentifier": project,
        # also an identifier: some servers search ``identifier`` only over it (the DSF's HAPI covers
        # both)
        "identifier": [project],
        "status": "current",
        "docStatus": "final",
        "date": date,
        "author": [{"type": "Organization", "identifier": organization}],
        "content": [
            {
                "attachment": {
                    "contentType": ZIP_CONTENT_TYPE,
                    "url": f"Binary/{b['id']}",
                    "title": b["title"],
                }
            }
            for b in binaries
        ],
    }


def put_document_reference(
    server: FhirServer,
    record: Path,
    job_id: str,
    binaries: list[SentBinary],
    transfer: TransferSettings,
) -> str:
    """PUT the job's DocumentReference; return ``DocumentReference/<id>``.

    Why: the same id and date on every run, kept in ``record`` with whether it was written.
    """
    resource_id = document_reference_id(job_id)
    try:
        state = orjson.loads(record.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        state = {}
    if state.get("id") != resource_id:
        state = {
            "id": resource_id,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "written": False,
        }
    state["binaries"] = [b["id"] for b in binaries]
    write_file_atomically(record, orjson.dumps(state))
    resource = document_reference(resource_id, binaries, transfer, state["date"])
    server.put("DocumentReference", resource_id, orjson.dumps(resource))
    state["written"] = True
    write_file_atomically(record, orjson.dumps(state))
    log.info("DocumentReference/%s written with %d attachments", resource_id, len(binaries))
    return f"DocumentReference/{resource_id}"
