"""Seeded, varied TORCH-shaped data for the benchmarks: nothing repeats line for line, so zstd cannot look faster
than it is on real data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson

from tests.benchmarks.bench_flattening import EXAMPLE
from tests.benchmarks.bench_flattening import patient_bundle as flattening_bundle

MB = 1_000_000
MAX_LINE_BYTES = 64 << 20


def write_dataset(folder: Path, megabytes: int, files: int, seed: int) -> list[Path]:
    """``files`` NDJSON files of about ``megabytes / files`` MB each, every line a different patient."""
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    ids = [g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]]
    groups = dict(zip(("Patient", "Condition", "Procedure"), ids, strict=True))
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    paths, index = [], 0
    for number in range(1, files + 1):
        path = folder / f"batch-{number:04d}.ndjson"
        size = 0
        with path.open("wb") as out:
            while size < megabytes * MB / files:
                line = orjson.dumps(torch_bundle(rng, index, groups)) + b"\n"
                out.write(line)
                size, index = size + len(line), index + 1
        paths.append(path)
    return paths


def torch_bundle(rng: random.Random, index: int, groups: dict[str, str]) -> dict:
    """The flattening example's patient Bundle with random ids, plus Observations as TORCH returns them."""
    bundle = flattening_bundle(rng, index, groups)
    patient = bundle["entry"][0]["resource"]
    was, patient["id"] = f"Patient/{patient['id']}", f"{rng.getrandbits(128):032x}"
    bundle["entry"][0]["request"]["url"] = f"Patient/{patient['id']}"
    for entry in bundle["entry"][1:]:
        resource = entry["resource"]
        if "subject" in resource:
            resource["subject"] = {"reference": f"Patient/{patient['id']}"}
        for target in resource.get("target", []):  # the Patient group's Provenance: the Patient reaches its CSV
            if target["reference"] == was:
                target["reference"] = f"Patient/{patient['id']}"
    for _ in range(rng.randint(3, 20)):
        observation = {
            "resourceType": "Observation",
            "id": f"{rng.getrandbits(128):032x}",
            "meta": {
                "profile": [
                    "https://www.medizininformatik-initiative.de/fhir/core/modul-labor/StructureDefinition/ObservationLab"
                ]
            },
            "status": "final",
            "code": {
                "coding": [{"system": "http://loinc.org", "code": f"{rng.randint(1000, 99999)}-{rng.randint(0, 9)}"}]
            },
            "subject": {"reference": f"Patient/{patient['id']}"},
            "effectiveDateTime": f"20{rng.randint(10, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00+01:00",
            "valueQuantity": {
                "value": round(rng.uniform(0, 500), 2),
                "unit": rng.choice(["mg/dL", "mmol/L", "g/L", "U/L"]),
                "system": "http://unitsofmeasure.org",
            },
        }
        bundle["entry"].append(
            {"resource": observation, "request": {"method": "PUT", "url": f"Observation/{observation['id']}"}}
        )
    return bundle
