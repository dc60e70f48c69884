"""S3 upload throughput of the send step's uploader against moto over loopback, next to boto3's upload_file alone.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_send_s3 [--gigabytes 1] [--runs 3]

It starts moto in server mode in its own process (path style, region eu-central-1), writes one file of
``--gigabytes`` of seeded random bytes, and then measures, each in a fresh child process (so its peak RSS is
its own) and best of ``--runs``:

- boto3:    ``client.upload_file`` with boto3's default transfer configuration (the goal's reference);
- dupflow:  ``tasks.clients.s3.S3Uploader.upload`` (the same transfer manager, plus the check for incomplete
            uploads, a HEAD for the ETag and the manifest write).

Next to them the physical anchor on the same bytes: reading the file from the page cache. Each uploaded object is
deleted after its run so moto's memory stays bounded. Figures go to stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-central-1"
BUCKET = "bench"
ACCESS_KEY_ID = "AKIDBENCH"
SECRET_ACCESS_KEY = "bench-secret"
MB = 1024 * 1024
SEED = 20240917


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=["boto3", "dupflow"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.endpoint, Path(args.file))))
        return
    run_benchmark(args.gigabytes, args.runs)


def run_benchmark(gigabytes: float, runs: int) -> None:
    with tempfile.TemporaryDirectory() as folder, MotoServer() as endpoint:
        source = write_random_file(Path(folder) / "batch-0001.ndjson", round(gigabytes * 1024 * MB))
        size_mb = source.stat().st_size / MB
        store(endpoint).create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        read_rate = best_read_rate(source, runs)
        results = {mode: best_of(runs, mode, endpoint, source) for mode in ("boto3", "dupflow")}
    print(f"\none file of {size_mb:,.0f} MB to moto over loopback (best of {runs}; peak RSS of the uploading process)")
    print(f"{'measurement':<52} {'MB/s':>8} {'seconds':>8} {'peak RSS':>10}")
    print(f"{'read the file from the page cache (anchor)':<52} {read_rate:>8,.0f}")
    labels = {"boto3": "boto3 client.upload_file, default TransferConfig", "dupflow": "dupflow S3Uploader.upload"}
    for mode, result in results.items():
        print(
            f"{labels[mode]:<52} {size_mb / result['seconds']:>8,.0f} {result['seconds']:>8.1f} "
            f"{result['maxrss_kb'] / 1024:>7,.0f} MB"
        )
    ratio = results["dupflow"]["seconds"] / results["boto3"]["seconds"]
    print(f"dupflow takes {ratio:.2f}x the time of boto3's upload_file (goal: within 1.1x)")


class MotoServer:
    """moto in server mode in a child process on a free loopback port; the endpoint URL while open."""

    def __enter__(self) -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{endpoint}/moto-api/", timeout=1)
                return endpoint
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("moto did not start within 60 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(30)


def store(endpoint: str):
    return boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )


def write_random_file(path: Path, size: int) -> Path:
    """``size`` bytes of seeded random data, written one MB at a time."""
    rng = random.Random(SEED)
    with open(path, "wb") as out:
        for offset in range(0, size, MB):
            out.write(rng.randbytes(min(MB, size - offset)))
    return path


def best_read_rate(path: Path, runs: int) -> float:
    size, best = path.stat().st_size, float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        with open(path, "rb") as source:
            while source.read(8 * MB):
                pass
        best = min(best, time.perf_counter() - started)
    return size / MB / best


def best_of(runs: int, mode: str, endpoint: str, source: Path) -> dict:
    results = []
    for _ in range(runs):
        command = [sys.executable, "-m", "tests.benchmarks.bench_send_s3", "--child", mode]
        command += ["--endpoint", endpoint, "--file", str(source)]
        output = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(output.strip().splitlines()[-1]))
        store(endpoint).delete_object(Bucket=BUCKET, Key=results[-1]["key"])
    return min(results, key=lambda result: result["seconds"])


def measure(mode: str, endpoint: str, source: Path) -> dict:
    from config.services import SendSettings
    from config.settings import RetrySettings, TlsSettings
    from tasks.clients.s3 import S3Uploader
    from tasks.clients.s3_client import make_s3_client

    send = SendSettings(
        send_as="s3_upload",
        s3={
            "bucket": BUCKET,
            "region": REGION,
            "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY,
            "endpoint": endpoint,
            "use_path_style": True,
        },
    )
    key = f"{mode}/{source.name}"
    with tempfile.TemporaryDirectory() as folder:
        if mode == "boto3":
            client = make_s3_client(send, TlsSettings(), RetrySettings(), Path(folder) / "ca.pem")
            started = time.perf_counter()
            client.upload_file(str(source), BUCKET, key)
        else:
            uploader = S3Uploader(send, TlsSettings(), RetrySettings(), Path(folder) / "s3-manifest.json")
            started = time.perf_counter()
            uploader.upload(source, key)
        seconds = time.perf_counter() - started
    return {"key": key, "seconds": seconds, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


if __name__ == "__main__":
    main()
