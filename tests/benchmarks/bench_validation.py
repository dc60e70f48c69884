"""Throughput and memory of the validation step's file loop against the fake validator.

    python -m tests.benchmarks.bench_validation [--throughput-mb 100] [--latency 0.05] [--memory-gb 2] [--skip-memory]

Throughput: a file of varied (seeded random) Patients, Encounters and Observations (about 0.5-2 KB each) is
validated in 1 MB chunks by ``validate_path`` (the step's per-file loop: real HTTP through the client layer, report
written with zstd) at ``max_concurrent_requests`` 1 and 4, against the fake in its own process answering after a
fixed latency (50 ms) in shallow mode (entries counted, no model validation: the client is measured, not
fhir.resources). Printed: chunks/s, resources/s, and the ratio of the rate at 4 to four times the rate at 1.
Anchors on the same bytes: parsing them with orjson (the floor of any JSON pipeline), and the latency bound
(concurrency / latency chunks/s).

Memory: the same loop over a file of ``--memory-gb`` GB with the default 10 MB chunks and 4 requests in flight,
and over a file a tenth of that size, each in a fresh process; printed is the peak RSS and its growth over the
process's baseline after imports. Flat means both peaks are about the same. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks.fakes import fake_in_own_process, peak_rss_mb
from tests.benchmarks.runs import load

MB = 1024 * 1024
POOL_SIZE = 5000


def varied_resources(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Patients, Encounters and Observations with random values and text of random length."""
    resources: list[dict[str, Any]] = []
    for i in range(count):
        kind = i % 3
        note = f"{rng.getrandbits(4096):x}"[: rng.randint(100, 1000)]
        if kind == 0:
            resources.append(
                {
                    "resourceType": "Patient",
                    "id": f"p{i}",
                    "gender": rng.choice(["male", "female", "other", "unknown"]),
                    "birthDate": f"{rng.randint(1920, 2020)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                    "name": [{"family": note[:30], "given": [note[30:45]]}],
                    "identifier": [{"system": "http://example.org/mrn", "value": f"{rng.getrandbits(40):x}"}],
                }
            )
        elif kind == 1:
            resources.append(
                {
                    "resourceType": "Encounter",
                    "id": f"e{i}",
                    "status": "finished",
                    "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "IMP"},
                    "subject": {"reference": f"Patient/p{i - 1}"},
                    "period": {"start": f"2024-01-{rng.randint(1, 28):02d}"},
                    "text": {"status": "generated", "div": f"<div>{note}</div>"},
                }
            )
        else:
            resources.append(
                {
                    "resourceType": "Observation",
                    "id": f"o{i}",
                    "status": "final",
                    "code": {"coding": [{"system": "http://loinc.org", "code": rng.choice(["718-7", "2160-0"])}]},
                    "subject": {"reference": f"Patient/p{i - 2}"},
                    "valueQuantity": {"value": round(rng.uniform(0, 200), 2), "unit": "g/dL"},
                    "note": [{"text": note}],
                }
            )
    return resources


def write_input(path: Path, size_bytes: int, seed: int = 20260101) -> tuple[int, int]:
    """Write about ``size_bytes`` of NDJSON from a pool of random resources, each line with a unique id.

    Returns (resources, bytes)."""
    pool = [orjson.dumps(r) for r in varied_resources(random.Random(seed), POOL_SIZE)]
    written = count = 0
    with open(path, "wb", buffering=8 * MB) as out:
        while written < size_bytes:
            template = pool[count % POOL_SIZE]
            line = template.replace(b'"id":"', b'"id":"r%d-' % count, 1) + b"\n"
            out.write(line)
            written += len(line)
            count += 1
    return count, written


def measure(base_url: str, source: str, dest: str, concurrency: int, chunk_mb: int) -> dict[str, float]:
    """Runs in a fresh process: one pass of the step's file loop."""
    from config.settings import RetrySettings, TlsSettings
    from tasks.clients.http import ServiceClient, ServiceEndpoint
    from tasks.clients.validator import Validator
    from tasks.streams.progress import use_display
    from tasks.validation import validate_path

    use_display("none")

    def run():
        endpoint = ServiceEndpoint("validation", base_url)
        with ServiceClient(endpoint, TlsSettings(), RetrySettings()) as client:
            return validate_path(
                Path(source),
                Path(dest),
                Validator(client),
                chunk_bytes=chunk_mb * MB,
                concurrency=concurrency,
                level="default",
                max_line_bytes=100 * MB,
            )

    baseline = peak_rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    result = run()
    seconds = time.perf_counter() - started
    return {
        "cpu_seconds": time.process_time() - cpu_started,
        "resources": result.resources,
        "chunks": result.chunks,
        "seconds": seconds,
        "baseline_mb": baseline,
        "peak_mb": peak_rss_mb(),
    }


def in_fresh_process(*args: Any) -> dict[str, float]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def orjson_rate(path: Path) -> float:
    """Anchor: resources/s of parsing the same lines with orjson (file in the page cache)."""
    lines = path.read_bytes().splitlines()
    started = time.perf_counter()
    for line in lines:
        orjson.loads(line)
    return len(lines) / (time.perf_counter() - started)


def throughput(tmp: Path, size_mb: int, latency: float) -> None:
    source = tmp / "throughput.ndjson"
    resources, size = write_input(source, size_mb * MB)
    print(f"throughput input: {resources} resources, {size / MB:.1f} MB; 1 MB chunks; latency {latency * 1000:.0f} ms")
    print(f"  anchor: orjson parse of the same bytes: {orjson_rate(source):,.0f} resources/s")
    rates: dict[int, float] = {}
    with fake_in_own_process(
        "tests.fakes.validator:start_validator", latency_seconds=latency, shallow=True
    ) as base_url:
        for concurrency in (1, 4):
            r = in_fresh_process(base_url, str(source), str(tmp / f"report-{concurrency}.ndjson.zst"), concurrency, 1)
            rates[concurrency] = r["chunks"] / r["seconds"]
            print(
                f"  max_concurrent_requests={concurrency}: {r['chunks']} chunks in {r['seconds']:.2f} s = "
                f"{rates[concurrency]:.1f} chunks/s, {r['resources'] / r['seconds']:,.0f} resources/s "
                f"(latency bound {concurrency / latency:.0f} chunks/s); client CPU "
                f"{r['cpu_seconds'] / r['chunks'] * 1000:.1f} ms per chunk",
                flush=True,
            )
    print(f"  rate at 4 / (4 x rate at 1) = {rates[4] / (4 * rates[1]):.2f} (goal: at least 1/1.3 = 0.77)")
    print(f"  load average during the run: {load()} on {os.cpu_count()} CPUs (others' work slows both)")


def memory(tmp: Path, size_gb: float, latency: float) -> None:
    with fake_in_own_process(
        "tests.fakes.validator:start_validator", latency_seconds=latency, shallow=True
    ) as base_url:
        for fraction in (0.1, 1.0):
            source = tmp / "memory.ndjson"
            resources, size = write_input(source, int(size_gb * fraction * 1024 * MB))
            r = in_fresh_process(base_url, str(source), str(tmp / "memory-report.ndjson.zst"), 4, 10)
            print(
                f"memory: {size / MB:,.0f} MB ({resources:,} resources) in {r['chunks']} chunks of 10 MB, 4 in flight: "
                f"{r['seconds']:.0f} s, {size / MB / r['seconds']:.0f} MB/s; peak RSS {r['peak_mb']:.0f} MB "
                f"({r['peak_mb'] - r['baseline_mb']:+.0f} MB over the {r['baseline_mb']:.0f} MB after imports)",
                flush=True,
            )
            source.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--throughput-mb", type=int, default=100, help="size of the throughput input (default 100)")
    parser.add_argument("--latency", type=float, default=0.05, help="fake latency per request in seconds")
    parser.add_argument("--memory-gb", type=float, default=2.0, help="size of the memory input (default 2)")
    parser.add_argument("--skip-memory", action="store_true", help="measure throughput only")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        throughput(Path(tmp), args.throughput_mb, args.latency)
        if not args.skip_memory:
            memory(Path(tmp), args.memory_gb, args.latency)


if __name__ == "__main__":
    main()
