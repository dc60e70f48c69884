"""Sending to a real FHIR server (sekmet): resources to send, the send and the DSF transfer run as the step runs
them, and what the server stored, read back."""

from __future__ import annotations

import base64
import io
import random
import zipfile
from pathlib import Path
from typing import Any

import orjson
import zstandard

from config.settings import Settings
from tasks.clients.fhir_server import FhirServer
from tasks.clients.transfer import PROJECT_IDENTIFIER_SYSTEM, binary_id, put_document_reference, send_binary
from tasks.send import send_resources
from tests.sekmet import PASSWORD, USERNAME, without_meta

MB = 1024 * 1024


def send_config(url: str, *, basic: bool = True, password: str = PASSWORD, **send: Any) -> dict[str, Any]:
    """The configuration tree of a direct send to ``url``."""
    auth = {"username": USERNAME, "password": password} if basic else {}
    return {
        "pipeline": {"enabled_steps": ["local_import"]},
        "services": {"send": {"send_as": "direct_resource_load", "url": url, "auth": auth, **send}},
        "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 50},
    }


def send_file(
    url: str,
    source: Path,
    records: Path,
    *,
    batch_size: int = 100,
    job_id: str = "job-1",
    tls: dict[str, Any] | None = None,
    **options: Any,
):
    """``source`` sent to ``url`` as the step sends it; ``tls`` the configuration's ``tls`` (for an https URL)."""
    settings = Settings.model_validate(send_config(url, **options) | {"tls": tls or {}})
    with FhirServer.connect(settings.services.send, settings.tls, settings.retry) as server:
        return send_resources(server, source, records, job_id=job_id, batch_size=batch_size, max_line_bytes=16 * MB)


def write_ndjson(path: Path, resources: list[dict], *, zstd: bool = False) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in resources)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if zstd else data)
    return path


def generated(count: int, prefix: str, seed: int = 7) -> list[dict]:
    """Patients and their Observations with varied content; ids start with ``prefix``."""
    rng = random.Random(seed)
    resources: list[dict] = []
    for i in range(count):
        if i % 3 == 0:
            resources.append(
                {"resourceType": "Patient", "id": f"{prefix}-p{i}", "gender": rng.choice(["male", "female"])}
            )
        else:
            patient = f"{prefix}-p{i - i % 3}"
            resources.append(
                {
                    "resourceType": "Observation",
                    "id": f"{prefix}-o{i}",
                    "status": "final",
                    "code": {"coding": [{"system": "http://loinc.org", "code": f"{rng.randint(1000, 9999)}-{i % 10}"}]},
                    "subject": {"reference": f"Patient/{patient}"},
                    "valueQuantity": {"value": round(rng.uniform(0, 200), 2), "unit": "mg/dL"},
                }
            )
    return resources


def stored_as_sent(sekmet, resources: list[dict]) -> dict[str, dict]:
    """Every resource is on the server as it was sent; returns what the server holds, by Type/id."""
    stored = sekmet.stored(resources)
    for resource in resources:
        label = f"{resource['resourceType']}/{resource['id']}"
        assert label in stored, f"{label} is not on the server"
        assert without_meta(stored[label]) == without_meta(resource)
    return stored


PROJECT = "Test_PROJECT_Transfer"
ORGANIZATION = "medizininformatik-initiative.de"


def settings_for(url: str, project: str = PROJECT, tls: dict[str, Any] | None = None) -> Settings:
    """The settings of a transfer_load send to ``url``; ``tls`` the configuration's ``tls`` (for an https URL)."""
    return Settings.model_validate(
        {
            "pipeline": {"enabled_steps": ["local_import", "send"]},
            "services": {
                "send": {
                    "send_as": "transfer_load",
                    "url": url,
                    "auth": {"username": USERNAME, "password": PASSWORD},
                    "transfer": {"project_identifier": project, "organization_identifier": ORGANIZATION},
                }
            },
            "retry": {"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 50},
            "tls": tls or {},
        }
    )


def transfer(
    url: str, job_id: str, inputs: list[Path], records: Path, project: str = PROJECT, tls: dict[str, Any] | None = None
) -> str:
    """What the step does for a job: one Binary per file, then the DocumentReference."""
    settings = settings_for(url, project, tls)
    with FhirServer.connect(settings.services.send, settings.tls, settings.retry) as server:
        binaries = [send_binary(server, path, binary_id(job_id, path.name), records) for path in inputs]
        return put_document_reference(
            server, records / "transfer.json", job_id, binaries, settings.services.send.transfer
        )


def plain_content(path: Path) -> bytes:
    data = path.read_bytes()
    return zstandard.ZstdDecompressor().decompressobj().decompress(data) if path.name.endswith(".zst") else data


def read_back_as_the_dsf(sekmet, project: str) -> dict[str, bytes]:
    """Find the DocumentReference by project identifier, resolve each Binary, unzip: entry name -> content."""
    documents = sekmet.search("DocumentReference", identifier=f"{PROJECT_IDENTIFIER_SYSTEM}|{project}")
    assert len(documents) == 1, f"{len(documents)} DocumentReferences for the project"
    document = documents[0]
    assert document["masterIdentifier"] == {"system": PROJECT_IDENTIFIER_SYSTEM, "value": project}
    assert (document["status"], document["docStatus"]) == ("current", "final")
    assert document["author"] == [
        {
            "type": "Organization",
            "identifier": {"system": "http://dsf.dev/sid/organization-identifier", "value": ORGANIZATION},
        }
    ]
    files: dict[str, bytes] = {}
    for content in document["content"]:
        attachment = content["attachment"]
        assert attachment["contentType"] == "application/zip"
        binary = sekmet.read(*attachment["url"].split("/"))
        assert binary["contentType"] == "application/zip"
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(binary["data"]))) as archive:
            (entry,) = archive.namelist()
            files[entry] = archive.read(entry)
    return files
