"""zstd speed and ratio per level on FHIR NDJSON: the measurement behind tasks.streams.ndjson.ZSTD_LEVELS.

Run on demand: ``python -m tests.benchmarks.bench_compression [MB]``. The data are the bundled real
TORCH/aether bundles, repeated with varied ids and dates so zstd cannot just match whole lines.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import orjson
import zstandard

from tasks.streams.ndjson import ZSTD_LEVELS

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "sample-data"


def fhir_ndjson(megabytes: int) -> bytes:
    """Patient bundles shaped like TORCH output, with random ids, dates, codes and values."""
    rng = random.Random(7)
    words = [w.decode() for f in SAMPLES.glob("*.ndjson") for w in f.read_bytes().replace(b'"', b" ").split()][:4000]
    lines, size = [], 0
    while size < megabytes * 1024 * 1024:
        line = orjson.dumps(patient_bundle(rng, words)) + b"\n"
        lines.append(line)
        size += len(line)
    return b"".join(lines)


def patient_bundle(rng: random.Random, words: list[str]) -> dict:
    def uid() -> str:
        return f"{rng.getrandbits(128):032x}"

    def date() -> str:
        day = f"20{rng.randint(10, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        return f"{day}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00+01:00"

    patient = uid()
    resources = [
        {
            "resourceType": "Patient",
            "id": patient,
            "gender": rng.choice(["male", "female"]),
            "birthDate": date()[:10],
            "identifier": [{"system": "https://example.org/mrn", "value": uid()[:10]}],
        }
    ]
    for _ in range(rng.randint(5, 30)):
        resources.append(
            {
                "resourceType": "Observation",
                "id": uid(),
                "status": "final",
                "meta": {
                    "profile": [
                        "https://www.medizininformatik-initiative.de/fhir/core/modul-labor/StructureDefinition/ObservationLab"
                    ]
                },
                "code": {
                    "coding": [
                        {
                            "system": "http://loinc.org",
                            "code": f"{rng.randint(1000, 99999)}-{rng.randint(0, 9)}",
                            "display": " ".join(rng.choices(words, k=3)),
                        }
                    ]
                },
                "subject": {"reference": f"Patient/{patient}"},
                "effectiveDateTime": date(),
                "valueQuantity": {
                    "value": round(rng.uniform(0, 500), 2),
                    "unit": rng.choice(["mg/dL", "mmol/L", "g/L"]),
                    "system": "http://unitsofmeasure.org",
                },
            }
        )
    return {
        "resourceType": "Bundle",
        "type": "transaction",
        "id": uid(),
        "entry": [
            {"resource": r, "request": {"method": "PUT", "url": f"{r['resourceType']}/{r['id']}"}} for r in resources
        ],
    }


def measure(data: bytes, level: int, runs: int = 3) -> tuple[float, float]:
    """(MB/s, ratio), the best of ``runs`` (the machine is shared; the best run is the least disturbed)."""
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        compressed = zstandard.ZstdCompressor(level=level).compress(data)
        seconds.append(time.perf_counter() - start)
    return len(data) / min(seconds) / 1e6, len(data) / len(compressed)


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    data = fhir_ndjson(megabytes)
    chosen = {level: name for name, level in ZSTD_LEVELS.items()}
    print(f"{len(data) / 1e6:.0f} MB of FHIR NDJSON, one core")
    print("level  MB/s   ratio  dupflow level")
    for level in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15):
        speed, ratio = measure(data, level)
        print(f"{level:>5}  {speed:5.0f}  {ratio:5.1f}x  {chosen.get(level, '')}")


if __name__ == "__main__":
    main()
