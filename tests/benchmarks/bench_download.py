"""Download throughput of the extractor's downloader over loopback, next to what the wire and zstd allow.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_download [--gigabytes 1] [--files 8] [--level default]

It starts the fake extraction server, runs an extraction whose result is about ``--gigabytes`` in ``--files``
batch files, and then measures, each in a fresh child process (so its peak RSS is its own):

- raw:      httpx streaming every file to nowhere (the ceiling of the wire and the fake server);
- dupflow:  ``tasks.clients.downloads.download_ndjson`` (NDJSON check, line counting, zstd at ``--level``,
            temporary file + rename), ``DOWNLOAD_CONCURRENCY`` files at a time, as the extractor step does;
- plain:    the same with compression off.

Then the single-thread zstd compression rate at ``--level`` on the same bytes. Figures go to stdout.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import zstandard

from config.settings import ExtractorSettings, RetrySettings, TlsSettings
from tasks.clients.downloads import download_ndjson, target_names
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.extractor import DOWNLOAD_CONCURRENCY
from tasks.ndjson import ZSTD_LEVELS, CompressionLevel

REPO_ROOT = Path(__file__).resolve().parents[2]
CRTDL = REPO_ROOT.parent / "shared" / "testdata" / "crtdl" / "CRTDL_diagnosis_basic.json"
RESOURCES_PER_PATIENT = 40  # about 28 KB per patient bundle line, a realistic size
MB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--level", choices=list(ZSTD_LEVELS), default="default")
    parser.add_argument("--child", choices=["raw", "dupflow", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, json.loads(args.urls), args.level)))
        return
    run_benchmark(args.gigabytes, args.files, args.level)


def run_benchmark(gigabytes: float, files: int, level: CompressionLevel) -> None:
    from tests.fakes.extraction_server import start_extraction_server

    per_patient = bytes_per_patient()
    patients_per_file = max(1, round(gigabytes * 1024 * MB / files / per_patient))
    with start_extraction_server(
        cohort_size=patients_per_file * files, batch_size=patients_per_file, resources_per_patient=RESOURCES_PER_PATIENT
    ) as server:
        urls = [u for u in extraction_urls(server.base_url) if not u.endswith("/core.ndjson")]
        started = time.perf_counter()
        sizes = materialize(urls)
        print(
            f"fake server wrote {len(urls)} files, {sum(sizes) / MB:,.0f} MB, in {time.perf_counter() - started:.1f} s"
        )
        results = {mode: in_child(mode, urls, level) for mode in ("raw", "dupflow", "plain")}
        zstd_rate = zstd_compression_rate(server.state.workdir, level)
    total = sum(sizes) / MB
    print(f"\n{len(urls)} files, {total:,.0f} MB over loopback, {DOWNLOAD_CONCURRENCY} at a time, zstd level {level}")
    print(f"{'measurement':<44} {'MB/s':>8} {'seconds':>8} {'peak RSS':>10}")
    labels = {
        "raw": "raw httpx stream to /dev/null",
        "dupflow": f"dupflow download_ndjson, zstd {level}",
        "plain": "dupflow download_ndjson, no compression",
    }
    for mode, result in results.items():
        rate = total / result["seconds"]
        print(f"{labels[mode]:<44} {rate:>8,.0f} {result['seconds']:>8.1f} {result['maxrss_kb'] / 1024:>8,.0f} MB")
    print(f"{f'zstd {level} compression, 1 thread':<44} {zstd_rate:>8,.0f}")


def bytes_per_patient() -> float:
    """Calibrate the size of one patient bundle line for this CRTDL on a small job."""
    from tests.fakes.extraction_server import start_extraction_server

    with start_extraction_server(cohort_size=50, batch_size=50, resources_per_patient=RESOURCES_PER_PATIENT) as server:
        (url,) = [u for u in extraction_urls(server.base_url) if not u.endswith("/core.ndjson")]
        return materialize([url])[0] / 50


def extraction_urls(base_url: str) -> list[str]:
    settings = ExtractorSettings(base_url=base_url, polling_interval="PT1S", max_polling_interval="PT1S")
    with ExtractionServerClient(settings, TlsSettings(), RetrySettings()) as client:
        return client.poll_until_complete(client.submit(CRTDL.read_bytes()))


def materialize(urls: list[str]) -> list[int]:
    """HEAD every file: the fake writes it on first request, outside the timed runs. Returns the sizes."""
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(DOWNLOAD_CONCURRENCY) as pool:
        return list(pool.map(lambda u: int(client.head(u).headers["Content-Length"]), urls))


def in_child(mode: str, urls: list[str], level: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "tests.benchmarks.bench_download",
        "--child",
        mode,
        "--urls",
        json.dumps(urls),
        "--level",
        level,
    ]
    output = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(mode: str, urls: list[str], level: CompressionLevel) -> dict:
    with tempfile.TemporaryDirectory() as folder, httpx.Client(timeout=httpx.Timeout(60)) as client:
        if mode == "raw":
            work = lambda url: stream_to_nowhere(client, url)  # noqa: E731
        else:
            names = target_names(urls, compress=mode == "dupflow")
            work = lambda url: download_ndjson(  # noqa: E731
                client,
                url,
                Path(folder) / names[url],
                level=level if mode == "dupflow" else None,
                max_line_bytes=100 * MB,
                stall_timeout=timedelta(minutes=1),
                retry=RetrySettings(),
            )
        started = time.perf_counter()
        with ThreadPoolExecutor(DOWNLOAD_CONCURRENCY) as pool:
            list(pool.map(work, urls))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def stream_to_nowhere(client: httpx.Client, url: str) -> int:
    received = 0
    with client.stream("GET", url, headers={"Accept": "application/fhir+ndjson"}) as response:
        for chunk in response.iter_bytes():
            received += len(chunk)
    return received


def zstd_compression_rate(workdir: Path, level: CompressionLevel) -> float:
    """MB/s of one zstd stream at ``level`` over the served files (read from disk, output discarded)."""
    files = [p for p in workdir.rglob("*.ndjson") if p.name != "core.ndjson"]
    total, started = 0, time.perf_counter()
    for path in files:
        stream = zstandard.ZstdCompressor(level=ZSTD_LEVELS[level]).compressobj()
        with open(path, "rb") as source:
            while chunk := source.read(MB):
                stream.compress(chunk)
                total += len(chunk)
        stream.flush()
    return total / MB / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
