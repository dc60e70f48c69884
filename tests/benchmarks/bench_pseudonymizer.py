"""Throughput and memory of the pseudonymizer step's file loop against the fake service.

    python -m tests.benchmarks.bench_pseudonymizer [--bundles 20000] [--concurrency 1 8] [--latency 0.02]

Writes a file of small collection Bundles (Patient, Encounter, Observation; about 1 KB each), starts the fake
pseudonymization service in its own process with a fixed latency per request, and runs ``pseudonymize_path`` (the
step's per-file loop, real HTTP through the client layer, zstd output) once per concurrency, each in a fresh
process so that its peak RSS is its own. Prints resources/s, the client's CPU per request and the peak
RSS above the process's baseline (interpreter and imports). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks.fakes import fake_in_own_process, peak_rss_mb

MB = 1024 * 1024


def bundle(i: int) -> dict[str, Any]:
    patient = {
        "resourceType": "Patient",
        "id": f"p{i}",
        "name": [{"family": f"Doe{i}", "given": ["Jane"]}],
        "gender": "female",
        "birthDate": "1980-01-01",
        "identifier": [{"system": "http://example.org/mrn", "value": f"MRN{i:08d}"}],
    }
    encounter = {
        "resourceType": "Encounter",
        "id": f"e{i}",
        "status": "finished",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"},
        "subject": {"reference": f"Patient/p{i}"},
        "period": {"start": "2024-01-01", "end": "2024-01-05"},
    }
    observation = {
        "resourceType": "Observation",
        "id": f"o{i}",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "718-7"}]},
        "subject": {"reference": f"Patient/p{i}"},
        "encounter": {"reference": f"Encounter/e{i}"},
        "valueQuantity": {"value": 13.2, "unit": "g/dL"},
    }
    return {
        "resourceType": "Bundle",
        "id": f"b{i}",
        "type": "collection",
        "entry": [
            {"fullUrl": f"urn:uuid:{r['resourceType']}-{i}", "resource": r} for r in (patient, encounter, observation)
        ],
    }


def write_bundles(path: Path, count: int) -> Path:
    with open(path, "wb") as out:
        for i in range(count):
            out.write(orjson.dumps(bundle(i)) + b"\n")
    return path


def measure(base_url: str, source: str, dest: str, concurrency: int) -> dict[str, float]:
    """Runs in a fresh process: one pass of the step's file loop."""
    from config.services import AuthSettings
    from config.settings import RetrySettings, TlsSettings
    from tasks.clients.http import ServiceClient, ServiceEndpoint
    from tasks.clients.pseudonymizer import Pseudonymizer
    from tasks.streams.progress import use_display
    from tasks.pseudonymizer import pseudonymize_path

    use_display("none")

    def run():
        endpoint = ServiceEndpoint("pseudonymizer", base_url, AuthSettings())
        with ServiceClient(endpoint, TlsSettings(), RetrySettings()) as client:
            return pseudonymize_path(
                Path(source),
                Path(dest),
                Pseudonymizer(client),
                level="default",
                max_line_bytes=100 * MB,
                concurrency=concurrency,
            )

    baseline = peak_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    counts = run()
    seconds = time.perf_counter() - started
    return {
        "cpu_seconds": time.process_time() - cpu_started,
        "resources": counts.resources_out,
        "requests": counts.requests,
        "seconds": seconds,
        "baseline_mb": baseline,
        "peak_mb": peak_rss_mb(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundles", type=int, default=20_000, help="Bundles in the input file (default 20000)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 1], help="max_concurrent_requests values")
    parser.add_argument("--latency", type=float, default=0.02, help="fake latency per request in seconds")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        source = write_bundles(Path(tmp) / "core.ndjson", args.bundles)
        size_mb = source.stat().st_size / MB
        print(f"input: {args.bundles} Bundles, {size_mb:.1f} MB; fake latency {args.latency * 1000:.0f} ms")
        with fake_in_own_process(
            "tests.fakes.pseudonymizer:start_pseudonymizer", latency_seconds=args.latency
        ) as base_url:
            for concurrency in args.concurrency:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    dest = str(Path(tmp) / f"out-{concurrency}.ndjson.zst")
                    r = pool.submit(measure, base_url, str(source), dest, concurrency).result()
                print(
                    f"max_concurrent_requests={concurrency}: {r['resources']} resources in {r['seconds']:.1f} s "
                    f"= {r['resources'] / r['seconds']:.0f} resources/s ({r['requests']} requests; client CPU "
                    f"{r['cpu_seconds'] / r['requests'] * 1000:.2f} ms a request); "
                    f"peak RSS {r['peak_mb']:.0f} MB ({r['peak_mb'] - r['baseline_mb']:+.0f} MB over the "
                    f"{r['baseline_mb']:.0f} MB after imports)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
