"""Throughput and memory of the pseudonymizer step's file loop against the fake service.

    python -m tests.benchmarks.bench_pseudonymizer [--bundles 20000] [--concurrency 1 8] [--latency 0.02]
                                                   [--rounds 1] [--against DIR]

Writes a file of small collection Bundles (Patient, Encounter, Observation; about 1 KB each), starts the fake
pseudonymization service in its own process with a fixed latency per request, and runs ``pseudonymize_path`` (the
step's per-file loop, real HTTP through the client layer, zstd output) once per concurrency, each in a fresh
process so that its peak RSS is its own. Prints resources/s, the client's CPU per request and the peak
RSS above the process's baseline (interpreter and imports). ``--against DIR`` runs another checkout's code (the one
measured before a change, with this checkout's Python environment) beside this one's in each of ``--rounds`` rounds,
the two in turn; then the client's CPU a request, min / median over the rounds, per checkout and concurrency. Not
collected by pytest.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from tests.benchmarks.fakes import fake_in_own_process, peak_rss_mb
from tests.benchmarks.runs import REPO_ROOT, load

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
    parser.add_argument("--rounds", type=int, default=1, help="runs of each checkout and concurrency (1)")
    parser.add_argument("--against", type=Path, help="a checkout whose code runs beside, in the same rounds")
    args = parser.parse_args()
    trees = [REPO_ROOT, *([args.against.resolve()] if args.against else [])]
    cpus: dict[tuple[Path, int], list[float]] = {}

    with tempfile.TemporaryDirectory() as tmp:
        source = write_bundles(Path(tmp) / "core.ndjson", args.bundles)
        size_mb = source.stat().st_size / MB
        print(f"input: {args.bundles} Bundles, {size_mb:.1f} MB; fake latency {args.latency * 1000:.0f} ms")
        with fake_in_own_process(
            "tests.fakes.pseudonymizer:start_pseudonymizer", latency_seconds=args.latency
        ) as base_url:
            for round_number in range(args.rounds):
                print(f"round {round_number + 1}, load average {load()}", flush=True)
                for tree in trees:
                    for concurrency in args.concurrency:
                        dest = str(Path(tmp) / f"out-{concurrency}.ndjson.zst")
                        r = measured(tree, base_url, str(source), dest, concurrency)
                        cpus.setdefault((tree, concurrency), []).append(r["cpu_seconds"] / r["requests"])
                        print(f"  {tree.name}: " if args.against else "  ", end="")
                        print(described(r, concurrency), flush=True)
    if args.rounds > 1 or args.against:
        print("client CPU a request, min / median over the rounds:")
        for (tree, concurrency), each in cpus.items():
            shown = f"{1000 * min(each):.3f} / {1000 * statistics.median(each):.3f} ms"
            print(f"  {tree}, max_concurrent_requests={concurrency}: {shown}")


def described(r: dict[str, float], concurrency: int) -> str:
    return (
        f"max_concurrent_requests={concurrency}: {r['resources']} resources in {r['seconds']:.1f} s "
        f"= {r['resources'] / r['seconds']:.0f} resources/s ({r['requests']} requests; client CPU "
        f"{r['cpu_seconds'] / r['requests'] * 1000:.2f} ms a request); "
        f"peak RSS {r['peak_mb']:.0f} MB ({r['peak_mb'] - r['baseline_mb']:+.0f} MB over the "
        f"{r['baseline_mb']:.0f} MB after imports)"
    )


def measured(tree: Path, base_url: str, source: str, dest: str, concurrency: int) -> dict[str, float]:
    """``measure`` in a fresh process running ``tree``'s code: its folder first on the module path, no bytecode
    written there (another checkout is only read)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=use_tree, initargs=(str(tree),)) as pool:
        return pool.submit(measure, base_url, source, dest, concurrency).result()


def use_tree(tree: str) -> None:
    sys.path.insert(0, tree)
    sys.dont_write_bytecode = tree != str(REPO_ROOT)
    os.chdir(tree)


if __name__ == "__main__":
    main()
