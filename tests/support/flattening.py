"""Inputs for the flattening tests (the shared example, TORCH batches, bare NDJSON files of chosen patients) and the
step run as the pipeline runs it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
from prefect import flow

from config.settings import RetrySettings, TlsSettings
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.flattening import flattening
from tasks.job.contract import stored_in_job
from tests.benchmarks.bench_flattening import GROUP_SYSTEM, patient_bundle
from tests.conftest import TESTDATA

EXAMPLE = TESTDATA / "flattening" / "example"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def group_ids() -> dict[str, str]:
    crtdl = orjson.loads((EXAMPLE / "example-crtdl.json").read_bytes())
    ids = [g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]]
    return dict(zip(("Patient", "Condition", "Procedure"), ids, strict=True))


def torch_batches(folder: Path, files: int, patients: int, seed: int = 5) -> list[Path]:
    rng, groups, paths = random.Random(seed), group_ids(), []
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        lines = b"".join(orjson.dumps(patient_bundle(rng, number * 1000 + i, groups)) + b"\n" for i in range(patients))
        path = folder / f"batch-{number:04d}.ndjson"
        path.write_bytes(lines)
        paths.append(path)
    return paths


def bare_file(path: Path, groups: dict[str, str]) -> Path:
    """Bare resources routed by bare Provenance lines of the same file (one resource in two groups)."""
    resources = [
        {"resourceType": "Patient", "id": "bare-1", "gender": "female", "birthDate": "1970-01-01"},
        {"resourceType": "Condition", "id": "bare-c", "subject": {"reference": "Patient/bare-1"}},
        {"resourceType": "Encounter", "id": "bare-e", "subject": {"reference": "Patient/bare-1"}},
    ]
    provenance = {
        "resourceType": "Provenance",
        "id": "bare-prov",
        "target": [{"reference": "Patient/bare-1"}, {"reference": "Condition/bare-c"}],
        "entity": [
            {"what": {"identifier": {"system": GROUP_SYSTEM, "value": groups["Patient"]}}},
            {"what": {"identifier": {"system": GROUP_SYSTEM, "value": groups["Condition"]}}},
        ],
    }
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*resources, provenance]))
    return path


@flow
def run_step(step, refresh: bool = False):
    task = flattening.with_options(refresh_cache=True) if refresh else flattening
    return stored_in_job(task, step)(step)


def open_service(server: Any, **retry: Any) -> ServiceClient:
    """A client of the flattening service ``server`` (a fake), retrying at once: ``retry`` overrides."""
    endpoint = ServiceEndpoint("flattening", server.base_url)
    return ServiceClient(endpoint, TlsSettings(), RetrySettings(initial_backoff_ms=1, max_backoff_ms=5, **retry))
