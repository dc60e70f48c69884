"""Throughput and memory of the send step's FHIR modes.

    python -m tests.benchmarks.bench_send [--resources 20000] [--batch-size 100] [--big-mb 200] [--runs 3]

1. direct_resource_load against the real sekmet-fhir server: resources/s of ``send_resources`` (read, batch,
   POST, check every entry, record progress) next to a bare httpx loop POSTing the same transaction Bundles,
   built beforehand (the anchor: what the server allows). Fresh ids per run, best of ``--runs``.
2. Peak memory: ``send_resources`` and ``send_binary`` (zip through a temporary file, streamed base64) on an input
   of ``--big-mb`` MB (zstd), each in a fresh process against the fake FHIR server in its own process (it discards
   bodies), printed as peak RSS above the process's baseline next to the input's size; and transfer MB/s next to
   the speed of reading and decompressing the same file alone.

Varied data (seeded random values). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import orjson
import zstandard

from tests.conftest import REPO_ROOT

MB = 1024 * 1024


def resources(count: int, prefix: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        out.append(
            {
                "resourceType": "Observation",
                "id": f"{prefix}-o{i}",
                "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": f"{rng.randint(1000, 99999)}-{i % 10}"}]},
                "subject": {"reference": f"Patient/{prefix}-p{i // 5}"},
                "effectiveDateTime": f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
                "valueQuantity": {"value": round(rng.uniform(0, 500), 3), "unit": "mg/dL"},
                "note": [{"text": "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(10, 120)))}],
            }
        )
    return out


def write_file(path: Path, items: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in items))
    return path


def settings(url: str, batch_size: int):
    from config.settings import Settings

    from tests.sekmet import PASSWORD, USERNAME

    return Settings.model_validate(
        {
            "pipeline": {"enabled_steps": ["local_import"]},
            "services": {
                "send": {
                    "send_as": "direct_resource_load",
                    "url": url,
                    "batch_size": batch_size,
                    "auth": {"username": USERNAME, "password": PASSWORD},
                    "transfer": {"project_identifier": "BENCH", "organization_identifier": "bench.org"},
                }
            },
        }
    )


def run_step(url: str, source: Path, records: Path, batch_size: int) -> float:
    from tasks.clients.fhir_server import FhirServer
    from tasks.send import send_resources

    s = settings(url, batch_size)
    with FhirServer.connect(s.services.send, s.tls, s.retry) as server:
        started = time.perf_counter()
        send_resources(server, source, records, job_id="bench", batch_size=batch_size, max_line_bytes=64 * MB)
        return time.perf_counter() - started


def run_bare(url: str, source: Path, batch_size: int) -> float:
    from tasks.clients.transaction_bundles import iter_batches

    from tests.sekmet import PASSWORD, USERNAME

    bodies = [b.body() for b in iter_batches(source, batch_size, tag_prefix="bare", max_line_bytes=64 * MB)]
    headers = {"Content-Type": "application/fhir+json", "Accept": "application/fhir+json"}
    with httpx.Client(base_url=f"{url}/fhir", auth=(USERNAME, PASSWORD), timeout=600) as client:
        started = time.perf_counter()
        for body in bodies:
            client.post("", content=body, headers=headers).raise_for_status()
        return time.perf_counter() - started


def direct_load(count: int, batch_size: int, runs: int, work: Path) -> None:
    from tests.sekmet import start_sekmet

    server = start_sekmet(work / "sekmet")
    try:
        step_times, bare_times = [], []
        for run in range(runs):
            bare = write_file(work / f"bare-{run}.ndjson", resources(count, f"b{run}", seed=run))
            ours = write_file(work / f"step-{run}.ndjson", resources(count, f"s{run}", seed=run))
            bare_times.append(run_bare(server.url, bare, batch_size))
            step_times.append(run_step(server.url, ours, work / f"records-{run}", batch_size))
        step, bare = count / min(step_times), count / min(bare_times)
        print(f"direct_resource_load, {count} resources, batch_size {batch_size}, sekmet-fhir on loopback:")
        print(f"  send step     {step:8.0f} resources/s")
        print(
            f"  bare httpx    {bare:8.0f} resources/s   (same Bundles, prebuilt)   step/bare = {bare / step:.2f}x time"
        )
    finally:
        server.stop()


# --- memory ------------------------------------------------------------------------------------------------------


def big_input(path: Path, megabytes: int) -> Path:
    """About ``megabytes`` MB of varied NDJSON, zstd-compressed, written in pieces."""
    compressor = zstandard.ZstdCompressor(level=1)
    written, index = 0, 0
    with open(path, "wb") as raw, compressor.stream_writer(raw) as out:
        while written < megabytes * MB:
            chunk = b"".join(orjson.dumps(r) + b"\n" for r in resources(2000, f"m{index}", seed=index))
            out.write(chunk)
            written, index = written + len(chunk), index + 1
    return path


def baseline_rss() -> int:
    import tasks.send  # noqa: F401  (the imports are the baseline)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure_direct(url: str, source: str, records: str) -> tuple[int, int, float]:
    base = baseline_rss()
    seconds = run_step(url, Path(source), Path(records), 1000)
    return base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, seconds


def measure_transfer(url: str, source: str, records: str) -> tuple[int, int, float]:
    from tasks.clients.fhir_server import FhirServer
    from tasks.clients.transfer import send_binary

    base = baseline_rss()
    s = settings(url, 100)
    with FhirServer.connect(s.services.send, s.tls, s.retry) as server:
        started = time.perf_counter()
        send_binary(server, Path(source), "bench-binary", Path(records))
        seconds = time.perf_counter() - started
    return base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, seconds


def measure_read(source: str) -> float:
    from tasks.streams.ndjson import iter_chunks

    started = time.perf_counter()
    for _ in iter_chunks(Path(source)):
        pass
    return time.perf_counter() - started


def memory(megabytes: int, work: Path) -> None:
    from tests.sekmet import free_port

    source = big_input(work / "big.ndjson.zst", megabytes)
    plain = megabytes * MB
    port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fhir_server", "--port", str(port)], cwd=REPO_ROOT, stdout=subprocess.PIPE
    )
    try:
        fake.stdout.readline()  # "… listening on …"
        url = f"http://127.0.0.1:{port}"
        with ProcessPoolExecutor(1, max_tasks_per_child=1) as pool:
            base_d, peak_d, direct_s = pool.submit(measure_direct, url, str(source), str(work / "rd")).result()
        with ProcessPoolExecutor(1, max_tasks_per_child=1) as pool:
            base_t, peak_t, transfer_s = pool.submit(measure_transfer, url, str(source), str(work / "rt")).result()
        with ProcessPoolExecutor(1, max_tasks_per_child=1) as pool:
            read_s = pool.submit(measure_read, str(source)).result()
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    print(f"peak memory, input {plain / MB:.0f} MB NDJSON ({source.stat().st_size / MB:.0f} MB zstd), fake server:")
    for label, base, peak, seconds in (
        ("direct_resource_load (batch_size 1000)", base_d, peak_d, direct_s),
        ("transfer_load (zip + base64 stream)   ", base_t, peak_t, transfer_s),
    ):
        print(f"  {label}  +{(peak - base) / 1024:6.0f} MB RSS, {plain / MB / seconds:6.1f} MB/s")
    print(f"  anchor: reading + decompressing alone    {plain / MB / read_s:6.1f} MB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--big-mb", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        direct_load(args.resources, args.batch_size, args.runs, Path(tmp))
        memory(args.big_mb, Path(tmp))


if __name__ == "__main__":
    main()
