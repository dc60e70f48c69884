"""One comparison: each step's throughput next to its physical anchor on the same bytes, in one table.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.compare [--size 256] [--files 8] [--runs 3] [--no-startup] [--only import,download]
    python -m tests.benchmarks.compare --only views [--view-mb 55]

Data: ``--size`` MB of seeded, varied TORCH-shaped batch files (one transaction Bundle per patient: Patient,
Conditions, Procedures, Encounters and Provenance shaped for the shared flattening example, plus Observations
with random ids, LOINC codes, values and dates), in ``--files`` files. Nothing repeats line for line, so zstd
cannot look faster than it is on real data.

Each step runs its plain code (no Prefect), ``--runs`` times in a fresh child process (its peak RSS: its own plus
its worker processes'); the best run is kept, and so for every anchor (the machine is shared: the best run is the
least disturbed):

- import:     ``local_import``'s per-file copy (``AtomicNdjsonWriter.copy``, one file per core, the step's pool),
              plain and zstd ``default``, next to ``cp`` and ``zstd -5 -T1`` of the same files;
- download:   ``download_ndjson`` from the fake extraction server serving the files (its own process),
              ``DOWNLOAD_CONCURRENCY`` at a time as the extractor step, next to ``curl --parallel`` (for plain files
              also followed by ``sync``: on disk, as a download leaves them) and a plain parallel httpx fetch into
              files, in the download's 1 MiB socket reads;
- pseudonymization: ``pseudonymize_path`` against the fake service (its own process, fixed latency) at the
              default ``max_concurrent_requests``, next to latency x requests / concurrency;
- flattening: the step's ``flatten_one`` per file (embedded engine, the shared example's CRTDL and lookup; no
              Prefect task) and the ``flattening`` step, next to orjson parsing the same bytes alone;
- views:      ``view run``'s CSV path (``flows.view_cli.write_csv``) for each of the three views the example's CRTDL
              gives, over ``--view-mb`` MB of the data's resources one per line, and the engine's own reading
              (``read_resources``: lines of other types unparsed, rows written in batches), next to orjson parsing
              the same bytes alone, one core; both CSVs must be the same bytes. The Patient view also next to a
              hand-written DuckDB query (``bench_views.duckdb_patient_csv``: ``read_json`` of its fields, the file to
              a CSV, DuckDB's threads), whose CSV must be the same bytes as ours. Beside them, in a table of their
              own, fhir4ds (DuckDB; no dependency: ``fhir4ds_views.py`` in its own ``uv run --with`` environment)
              from the same file to rows in hand, a round of each in turn; its rows checked against ours;
- start-up:   ``flows.run start`` of the embedded tiny job, with no server (cold) and with the local server
              running (warm), and the peak RSS of the process tree (the flow process plus the server);
- memory:     a ``--job-size`` MB job (local_import + flattening of these data, plain and zstd ``default``)
              through ``flows.run start`` with the local server running: the peak RSS of the command's process
              tree (the flow process and its worker processes, sampled), the reused server's apart (its RSS at
              rest before the job, its peak), and the most both held at one time (their RSS summed per sample;
              their PSS summed, which counts a page they share once).

The ratio column is ours / anchor for rates (higher is better) and anchor / ours for times.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import httpx
import orjson
import zstandard

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.bench_views import duckdb_patient_csv
from tests.benchmarks.machine import load
from tests.benchmarks.memory import descendants, pss_mb, tree_peak_mb, vm_hwm_mb, vm_rss_mb
from tests.benchmarks.bench_flattening import patient_bundle as flattening_bundle

REPO_ROOT = Path(__file__).resolve().parents[2]
MB = 1_000_000
MAX_LINE_BYTES = 64 << 20
LATENCY_SECONDS = 0.01
PSEUDONYMIZED_BUNDLES = 1000
FLATTENED_MB = 16
VIEW_MB = 55


@dataclass
class Row:
    step: str
    ours: str
    ours_rate: float
    anchor: str
    anchor_rate: float
    unit: str
    peak_mb: float | None = None
    lower_is_better: bool = False

    @property
    def ratio(self) -> float:
        if self.lower_is_better:
            return self.anchor_rate / self.ours_rate
        return self.ours_rate / self.anchor_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MB of data for import and download (default 256)")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the best is kept")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--no-startup", action="store_true", help="skip the start-up rows (about a minute)")
    parser.add_argument("--job-size", type=int, default=2048, help="MB of data for the memory job (default 2048)")
    parser.add_argument("--view-mb", type=int, default=VIEW_MB, help=f"MB of resources for views (default {VIEW_MB})")
    parser.add_argument(
        "--only",
        type=sections,
        default=SECTIONS,
        help=f"sections to run, comma-separated (default all: {','.join(SECTIONS)})",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](**json.loads(sys.stdin.read()))))
        return
    print(
        f"{os.cpu_count()} cores, load average {load()}, "
        f"Python {platform.python_version()}, best of {args.runs} runs each"
    )
    with tempfile.TemporaryDirectory(prefix="dupflow-compare-", dir=scratch_root()) as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        files = write_dataset(root / "data", args.size, args.files, args.seed)
        total = sum(p.stat().st_size for p in files)
        print(f"data: {len(files)} files, {total / MB:,.0f} MB, written in {time.perf_counter() - started:.0f} s")
        rows = import_rows(root, files, args.runs) if "import" in args.only else []
        if "download" in args.only:
            rows += download_rows(root, files, args.runs)
        if "pseudonymization" in args.only:
            rows += pseudonymization_rows(root, files[0], args.runs)
        if "flattening" in args.only:
            rows += flattening_rows(root, files, args.runs)
        views = []
        if "views" in args.only:
            view_table, views = view_rows(root, files, args.view_mb, args.runs)
            rows += view_table
        tree = None
        if "startup" in args.only and not args.no_startup:
            startup, tree = startup_rows(root, args.runs)
            rows += startup
        memory = memory_lines(root, args.job_size, args.files, args.seed) if "memory" in args.only else []
    print_table(rows)
    for line in views + memory:
        print(line)
    if tree:
        flow_mb, server_mb = tree
        print(
            f"peak RSS, tiny job with the server running: flow process {flow_mb:,.0f} MB; the reused server (a "
            f"long-lived process of its own, not in the command's tree) {server_mb:,.0f} MB"
        )


SECTIONS = ("import", "download", "pseudonymization", "flattening", "views", "startup", "memory")


def sections(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    if unknown := set(chosen) - set(SECTIONS):
        raise argparse.ArgumentTypeError(f"unknown sections {', '.join(sorted(unknown))}; choose from {SECTIONS}")
    return chosen


def scratch_root() -> str | None:
    """/dev/shm would make the disk anchors unfair; the default temporary directory is on the job's disk."""
    return os.environ.get("DUPFLOW_BENCH_DIR")


# --- data ----------------------------------------------------------------------------------------------------


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
    patient["id"] = f"{rng.getrandbits(128):032x}"
    for entry in bundle["entry"][1:]:
        resource = entry["resource"]
        if "subject" in resource:
            resource["subject"] = {"reference": f"Patient/{patient['id']}"}
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


# --- running and timing --------------------------------------------------------------------------------------


def in_child(name: str, **arguments) -> dict:
    """Run ``CHILDREN[name](**arguments)`` in a fresh interpreter; its JSON answer plus its peak RSS."""
    command = [sys.executable, "-m", "tests.benchmarks.compare", "--child", name]
    done = subprocess.run(
        command, cwd=REPO_ROOT, input=json.dumps(arguments), capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_seconds(work: Callable[[], object], runs: int, before: Callable[[], object] = lambda: None) -> float:
    seconds = []
    for _ in range(runs):
        before()
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def peak_rss_mb() -> float:
    """This process's peak RSS plus its live children's (the worker processes a large plain file is checked in)."""
    return tree_peak_mb(os.getpid())


def run_command(command: list[str]) -> None:
    """Run a command quietly (curl --parallel draws its progress meter even with -s); fail on its failure."""
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fresh(folder: Path) -> Callable[[], None]:
    def clear() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    return clear


def settled(folder: Path, data: list[Path]) -> Path:
    """``folder`` emptied, and nothing left for the disk to write: what one measurement wrote is neither deleted nor
    written back while the next is timed (the copy of a round's first measurement paid for the last round's files).
    Then twice the size of ``data`` (the measured files: the page cache a measurement fills, and its processes'
    memory) is written and freed (``back_memory``), so that the next measurement does not pay for memory the host took
    back."""
    fresh(folder)()
    os.sync()
    back_memory(2 * sum(path.stat().st_size for path in data))
    return folder


def back_memory(size: int) -> None:
    """Have ``size`` bytes of fresh memory written and freed (by ``dd``, whose buffer is its memory: in this process the
    peak would pass to every child's ``ru_maxrss``). On a virtual machine whose balloon driver reports free pages to
    the host (virtio_balloon's free page reporting, as here), memory left free for about two seconds goes back to the
    host, and the next measurement to fill it pays the host's faults: here a 1 GiB ``cp`` took 1.7 s after 3 s idle,
    0.25 s right after another, and 0.26 s after 3 GiB were written and freed. Whichever measurement came first after
    a pause paid it (the first ``cp`` of every ``bench_local_import`` round: 2.0 s, then 0.3 s with this). At most half
    the memory free now is written: a large ``--mb`` must not make ``dd`` fail."""
    size = min(size, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    run_command(["dd", "if=/dev/zero", "of=/dev/null", f"bs={size}", "count=1", "iflag=fullblock", "status=none"])


# --- import --------------------------------------------------------------------------------------------------


def import_rows(root: Path, files: list[Path], runs: int) -> list[Row]:
    total = sum(p.stat().st_size for p in files) / MB
    out = root / "anchor-out"
    cp = total / best_seconds(lambda: run_command(["cp", *map(str, files), str(out)]), runs, fresh(out))
    zstd_label, zstd_seconds = zstd_anchor(files, out, runs)
    rows = []
    for level, anchor, rate in ((None, "cp", cp), ("default", zstd_label, total / zstd_seconds)):
        result = in_child("import", files=list(map(str, files)), out=str(root / "import"), level=level, runs=runs)
        ours = total / result["seconds"]
        label = f"import, {'plain' if level is None else 'zstd ' + level}, {len(files)} files"
        rows.append(Row(label, "local_import copy", ours, anchor, rate, "MB/s", result["peak_mb"]))
    shutil.rmtree(out, ignore_errors=True)
    return rows


def zstd_anchor(files: list[Path], out: Path, runs: int) -> tuple[str, float]:
    """``zstd -5 -T1`` over the files, one after the other; python-zstandard, one thread, without the command."""
    if shutil.which("zstd"):
        command = ["zstd", "-q", "-f", "-5", "-T1", "--output-dir-flat", str(out), *map(str, files)]
        return "zstd -5 -T1", best_seconds(lambda: run_command(command), runs, fresh(out))

    def compress_all() -> None:
        for path in files:
            with open(path, "rb") as source, open(out / (path.name + ".zst"), "wb") as dest:
                zstandard.ZstdCompressor(level=5).copy_stream(source, dest)

    print("the zstd command is missing: the zstd anchor is python-zstandard, level 5, one thread")
    return "python-zstandard 5, 1 thread", best_seconds(compress_all, runs, fresh(out))


def child_import(files: list[str], out: str, level: str | None, runs: int) -> dict:
    from tasks.streams.fanout import results_or_raise, run_bounded
    from tasks.streams.ndjson_writer import AtomicNdjsonWriter
    from tasks.streams.processes import worker_pool

    folder = Path(out)

    def copy(source: Path) -> None:
        # The body of tasks.local_import.import_file without its progress display and cancellation check.
        name = source.name + (".zst" if level else "")
        size = source.stat().st_size
        with AtomicNdjsonWriter(folder / name, level, MAX_LINE_BYTES, str(source), expected_size=size) as writer:
            for _ in writer.copy(source):
                pass

    def import_all() -> None:  # as the step: one file per core, the line checks in the step's worker pool
        calls = [lambda path=Path(p): copy(path) for p in files]
        with worker_pool():
            results_or_raise(run_bounded(calls, workers=os.cpu_count() or 1))

    seconds = best_seconds(import_all, runs, fresh(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "peak_mb": peak_rss_mb()}


# --- download ------------------------------------------------------------------------------------------------


def download_rows(root: Path, files: list[Path], runs: int) -> list[Row]:
    from tasks.extractor import DOWNLOAD_CONCURRENCY

    total = sum(p.stat().st_size for p in files) / MB
    out = root / "anchor-out"
    with serving(files[0].parent) as urls:
        curl = curl_command(urls, out)
        curl_rate = total / best_seconds(lambda: run_command(curl), runs, fresh(out))
        synced_rate = total / best_seconds(lambda: (run_command(curl), os.sync()), runs, fresh(out))
        plain = in_child("fetch", urls=urls, out=str(out), runs=runs, concurrency=DOWNLOAD_CONCURRENCY)
        rows = [
            Row(
                "download, plain httpx fetch",
                "httpx threads, 1 MiB reads",
                total / plain["seconds"],
                "curl --parallel",
                curl_rate,
                "MB/s",
                plain["peak_mb"],
            )
        ]
        for level in (None, "default"):
            result = in_child("download", urls=urls, out=str(root / "download"), level=level, runs=runs)
            rows.append(
                Row(
                    f"download, {'plain' if level is None else 'zstd ' + level}, {DOWNLOAD_CONCURRENCY} at a time",
                    "download_ndjson",
                    total / result["seconds"],
                    "curl --parallel",
                    curl_rate,
                    "MB/s",
                    result["peak_mb"],
                )
            )
            if level is None:  # its files synced as a download's are: the same work on disk
                rows.append(replace(rows[-1], anchor="curl --parallel, sync", anchor_rate=synced_rate))
    shutil.rmtree(out, ignore_errors=True)
    return rows


def curl_command(urls: list[str], out: Path) -> list[str]:
    """``curl --parallel`` of ``urls`` into numbered files in ``out``, as many at a time as the extractor step."""
    from tasks.extractor import DOWNLOAD_CONCURRENCY

    command = ["curl", "-s", "--fail", "--parallel", "--parallel-max", str(DOWNLOAD_CONCURRENCY)]
    for number, url in enumerate(urls):
        command += ["-o", str(out / f"{number}.ndjson"), url]
    return command


class serving:
    """The fake extraction server serving ``folder`` from its own process; yields the result file URLs."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.urls: list[str] = []

    def cpu_seconds(self) -> float:
        """The serving process's CPU time so far (user and system, from ``/proc``)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> list[str]:
        from tests.support.ports import free_port

        port = free_port()
        command = [sys.executable, "-m", "tests.fakes.extraction_server", "--port", str(port), "--serve-dir"]
        self.process = subprocess.Popen([*command, str(self.folder)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        status_url = None
        for line in self.process.stdout:
            if line.startswith("completed job serving"):
                status_url = line.rsplit(": ", 1)[1].strip()
                break
        if status_url is None:
            raise SystemExit("the fake extraction server did not start")
        self.urls = [item["url"] for item in httpx.get(status_url, timeout=60).json()["output"]]
        return self.urls

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(10)


def child_fetch(urls: list[str], out: str, runs: int, concurrency: int) -> dict:
    from tasks.clients.downloads import read_in_large_pieces

    folder = Path(out)

    def fetch(client: httpx.Client, number: int, url: str) -> None:
        with client.stream("GET", url) as response, open(folder / f"{number}.ndjson", "wb") as dest:
            read_in_large_pieces(response)
            for chunk in response.iter_bytes():
                dest.write(chunk)

    def fetch_all() -> None:
        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda item: fetch(client, *item), enumerate(urls)))

    seconds = best_seconds(fetch_all, runs, fresh(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "peak_mb": peak_rss_mb()}


def child_download(urls: list[str], out: str, level: str | None, runs: int) -> dict:
    """``download_ndjson`` over ``urls``, ``DOWNLOAD_CONCURRENCY`` at a time in threads, as the extractor step."""
    from tasks.extractor import DOWNLOAD_CONCURRENCY

    folder = Path(out)
    seconds = best_seconds(lambda: download_group(urls, out, level, DOWNLOAD_CONCURRENCY), runs, fresh(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "peak_mb": peak_rss_mb()}


def download_group(urls: list[str], out: str, level: str | None, threads: int) -> None:
    """``download_ndjson`` for each URL, ``threads`` at a time on one client, as the extractor step does."""
    from config.settings import RetrySettings
    from tasks.clients.downloads import download_ndjson, target_names
    from tasks.streams.fanout import results_or_raise, run_bounded

    names = target_names(urls, compress=level is not None)

    def download(client: httpx.Client, url: str) -> None:
        download_ndjson(
            client,
            url,
            Path(out) / names[url],
            level=level,
            max_line_bytes=MAX_LINE_BYTES,
            stall_timeout=timedelta(minutes=1),
            retry=RetrySettings(),
        )

    with httpx.Client(timeout=60) as client:  # as the extractor step: its bounded threads on one client
        results_or_raise(run_bounded([lambda url=url: download(client, url) for url in urls], threads))


# --- pseudonymization ----------------------------------------------------------------------------------------


def pseudonymization_rows(root: Path, source: Path, runs: int) -> list[Row]:
    from config.services import PseudonymizerSettings
    from tests.benchmarks.fakes import fake_in_own_process

    concurrency = PseudonymizerSettings().max_concurrent_requests
    subset = root / "pseudonymize.ndjson"
    with source.open("rb") as lines, subset.open("wb") as out:
        for _, line in zip(range(PSEUDONYMIZED_BUNDLES), lines, strict=False):
            out.write(line)
    with fake_in_own_process(
        "tests.fakes.pseudonymizer:start_pseudonymizer", latency_seconds=LATENCY_SECONDS
    ) as base_url:
        result = in_child(
            "pseudonymize",
            base_url=base_url,
            source=str(subset),
            out=str(root / "pseudonymized"),
            runs=runs,
            concurrency=concurrency,
        )
    ideal = LATENCY_SECONDS * result["requests"] / concurrency
    anchor = f"{LATENCY_SECONDS * 1000:.0f} ms x {result['requests']} req / {concurrency}"
    rate, anchor_rate = result["resources"] / result["seconds"], result["resources"] / ideal
    return [
        Row(
            "pseudonymization, zstd default", "pseudonymize_path", rate, anchor, anchor_rate, "res/s", result["peak_mb"]
        )
    ]


def child_pseudonymize(base_url: str, source: str, out: str, runs: int, concurrency: int) -> dict:
    from config.services import AuthSettings
    from config.settings import RetrySettings, TlsSettings
    from tasks.clients.http import ServiceEndpoint, build_async_client
    from tasks.clients.pseudonymizer import Pseudonymizer
    from tasks.streams.progress import use_display
    from tasks.pseudonymizer import pseudonymize_path, window_size

    use_display("none")
    counts = []

    async def pseudonymize() -> None:
        endpoint = ServiceEndpoint("pseudonymizer", base_url, AuthSettings())
        async with build_async_client(endpoint, TlsSettings()) as client:
            service = Pseudonymizer(client, RetrySettings(), max_concurrent_requests=concurrency)
            counts.append(
                await pseudonymize_path(
                    Path(source),
                    Path(out) / "out.ndjson.zst",
                    service,
                    level="default",
                    max_line_bytes=MAX_LINE_BYTES,
                    window=window_size(concurrency),
                )
            )

    seconds = best_seconds(lambda: asyncio.run(pseudonymize()), runs, fresh(Path(out)))
    return {
        "seconds": seconds,
        "resources": counts[-1].resources_out,
        "requests": counts[-1].requests,
        "peak_mb": peak_rss_mb(),
    }


# --- flattening ----------------------------------------------------------------------------------------------


def flattening_rows(root: Path, files: list[Path], runs: int) -> list[Row]:
    """The first ``FLATTENED_MB`` of the data as four batch files (TORCH writes several), flattened by the engine
    alone in one process and by the product's ``flattening`` step."""
    subsets = [root / f"flatten-{number}.ndjson" for number in range(4)]
    for number, subset in enumerate(subsets):
        with files[number % len(files)].open("rb") as lines, subset.open("wb") as out:
            for line in lines:
                out.write(line)
                if out.tell() >= FLATTENED_MB * MB / len(subsets):
                    break
    size = sum(subset.stat().st_size for subset in subsets) / MB
    result = in_child("flatten", sources=[str(s) for s in subsets], out=str(root / "flattened"), runs=runs)
    anchor = size / result["parse_seconds"]
    return [
        Row(
            f"flattening, {size:.0f} MB",
            "flatten_one per file, 1 process",
            size / result["seconds"],
            "orjson parse alone",
            anchor,
            "MB/s",
            result["peak_mb"],
        ),
        Row(
            f"flattening, {size:.0f} MB",
            f"flattening step, {result['processes']} process(es)",
            size / result["parallel_seconds"],
            "orjson parse alone",
            anchor,
            "MB/s",
            result["parallel_peak_mb"],
        ),
    ]


def child_flatten(sources: list[str], out: str, runs: int) -> dict:
    """The embedded engine alone in this process, then the product's path: the ``flattening`` task on a job whose
    import folder holds the same files (worker processes where the step uses them), each on a fresh job."""
    import shutil

    from tasks.flattening import plan_views
    from tests.benchmarks.bench_flattening import run_step
    from tests.flattening_runs import flatten_files

    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    paths = [Path(source) for source in sources]

    def parse() -> None:
        for path in paths:
            with path.open("rb") as lines:
                for line in lines:
                    orjson.loads(line)

    parse_seconds = best_seconds(parse, runs)
    folder = Path(out)
    seconds = best_seconds(
        lambda: flatten_files(paths, folder, views, skipped, max_line_bytes=MAX_LINE_BYTES), runs, fresh(folder)
    )
    peak_mb = peak_rss_mb()
    resources = sum(1 for path in paths for _ in path.open("rb"))
    steps = []
    for run in range(runs):
        job_dir = folder.parent / f"flatten-job-{run}"
        (job_dir / "import").mkdir(parents=True)
        copies = [Path(shutil.copy(path, job_dir / "import" / path.name)) for path in paths]
        steps.append(run_step(job_dir, copies, resources))
        shutil.rmtree(job_dir)
    best = min(steps, key=lambda step: step["seconds"])
    return {
        "seconds": seconds,
        "parallel_seconds": best["seconds"],
        "processes": best["processes"],
        "parse_seconds": parse_seconds,
        "peak_mb": peak_mb,
        "parallel_peak_mb": max(step["peak_mb"] + sum(step["workers_peak_mb"]) for step in steps),
    }


# --- views ---------------------------------------------------------------------------------------------------


FHIR4DS = "fhir4ds==0.5.1"
FHIR4DS_SCRIPT = Path(__file__).with_name("fhir4ds_views.py")


def view_rows(root: Path, files: list[Path], megabytes: int, runs: int) -> tuple[list[Row], list[str]]:
    """The data's Bundles opened into one resource per line (as a FHIR bulk export gives them), ``megabytes`` MB,
    each of the example's three views run over it by dupflow and by fhir4ds, one round of each in turn (best of
    ``runs``): the rows for the table and the side-by-side table's lines."""
    from tasks.flattening import plan_views

    resources = write_resources(root / "resources.ndjson", files, megabytes)
    definitions = root / "views.json"
    definitions.write_text(json.dumps([group.view for group in plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)[0]]))
    ours, theirs = [], []
    for _ in range(runs):
        ours.append(in_child("views", source=str(resources), out=str(root / "views")))
        if not theirs or "error" not in theirs[-1]:
            theirs.append(fhir4ds_round(definitions, resources, root / "fhir4ds"))
    size = resources.stat().st_size / MB
    parse_seconds = min(round_["parse_seconds"] for round_ in ours)
    anchor = size / parse_seconds
    best = best_views(ours)
    rows = []
    for view in best:
        step = f"view {view['resource']}, {size:.0f} MB"
        rows.append(Row(step, "view run (write_csv)", size / view["seconds"], "orjson parse alone", anchor, "MB/s"))
        rows.append(
            Row(step, "engine, lines by type", size / view["engine_seconds"], "orjson parse alone", anchor, "MB/s")
        )
        if "duckdb_seconds" in view:  # DuckDB as a peer: rate against rate, above 1 dupflow is faster
            duckdb = size / view["duckdb_seconds"]
            rows.append(
                Row(step, "view run (write_csv)", size / view["seconds"], "DuckDB by hand (CSV)", duckdb, "MB/s")
            )
    table = SideBySide(size, runs, parse_seconds, root / "views", root / "fhir4ds")
    return rows, table.lines(best, theirs)


def write_resources(path: Path, files: list[Path], megabytes: int) -> Path:
    """The batch files' Bundles as one resource per line, the first ``megabytes`` MB of them."""
    with path.open("wb") as out:
        for line in (line for batch in files for line in batch.open("rb")):
            for entry in orjson.loads(line)["entry"]:
                out.write(orjson.dumps(entry["resource"]) + b"\n")
            if out.tell() >= megabytes * MB:
                break
    return path


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def child_views(source: str, out: str) -> dict:
    """One round in this process: each view through ``view run``'s CSV writer and through the engine's own
    reading (both CSVs must be the same bytes), then orjson parsing the same bytes alone."""
    from flows.view_cli import write_csv
    from tasks.flattening import plan_views
    from tasks.streams.ndjson import iter_lines
    from tasks.sof.view import compile_view
    from tasks.sof.output import CsvWriter
    from tests.support.sof import read_resources

    path, folder = Path(source), Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def parse() -> None:
        with path.open("rb") as lines:
            for line in lines:
                orjson.loads(line)

    def engine_csv(view, target: Path) -> None:
        with target.open("w", encoding="utf-8", newline="") as stream:
            writer = CsvWriter(stream)
            writer.writerow(view.columns)
            resources = read_resources(path, iter_lines(path, MAX_LINE_BYTES), [view.resource])
            writer.writerows(row for resource in resources for row in view.rows(resource))

    def command_csv(view, target: Path) -> None:
        with target.open("w", encoding="utf-8", newline="") as stream:
            write_csv(view, path, stream)

    measured = []
    for group in plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)[0]:
        view = compile_view(group.view)
        command, engine = our_csv(folder, view.resource), folder / f"{view.resource}-engine.csv"
        seconds, cpu = timed(partial(command_csv, view, command))
        engine_seconds, _ = timed(partial(engine_csv, view, engine))
        if command.read_bytes() != engine.read_bytes():
            raise SystemExit(f"view {view.resource}: view run and the engine wrote different CSVs")
        measured.append({"resource": view.resource, "seconds": seconds, "cpu": cpu, "engine_seconds": engine_seconds})
        if view.resource == "Patient":  # the hand-written DuckDB query, the same file to a CSV
            duckdb_csv = folder / "Patient-duckdb.csv"
            measured[-1]["duckdb_seconds"] = timed(partial(duckdb_patient_csv, path, duckdb_csv))[0]
            if duckdb_csv.read_bytes() != command.read_bytes():
                raise SystemExit("view Patient: view run and the hand-written DuckDB query wrote different CSVs")
    return {"parse_seconds": timed(parse)[0], "views": measured}


def our_csv(folder: Path, resource: str) -> Path:
    return folder / f"{resource}-command.csv"


def fhir4ds_round(views: Path, resources: Path, out: Path) -> dict:
    """One round of fhir4ds in its own environment (``fhir4ds_views.py``): its figures per view, or its error."""
    out.mkdir(exist_ok=True)
    command = ["uv", "run", "--no-project", "--with", FHIR4DS, "python", "-P", str(FHIR4DS_SCRIPT)]
    done = subprocess.run(
        [*command, str(views), str(resources), str(out)], capture_output=True, text=True, cwd=out, timeout=1800
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-400:] or f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_views(rounds: list[dict]) -> list[dict]:
    """Per view, each timing of its least disturbed round (the lowest); a view that failed, as it failed first."""
    best = []
    for runs_of_view in zip(*(round_["views"] for round_ in rounds), strict=True):
        first = runs_of_view[0]
        if "error" in first:
            best.append(first)
            continue
        best.append(
            {
                key: min(run[key] for run in runs_of_view) if isinstance(value, float) else value
                for key, value in first.items()
            }
        )
    return best


@dataclass
class SideBySide:
    """The issue's comparison, one line per view: dupflow's ``view run`` (the file to a CSV), fhir4ds (the same file
    to rows in hand: its DuckDB load plus its query), their ratio, orjson parsing alone, and whether the rows agree."""

    size: float
    runs: int
    parse_seconds: float
    ours: Path
    theirs: Path

    def lines(self, ours: list[dict], theirs: list[dict]) -> list[str]:
        if "error" in theirs[-1]:
            return [self.title("fhir4ds"), *map(self.line, ours), f"fhir4ds did not run: {theirs[-1]['error']}"]
        first = theirs[0]
        engine = f"fhir4ds {first['fhir4ds']} on DuckDB {first['duckdb']} ({first['threads']} threads)"
        return [self.title(engine), *map(self.compared, ours, best_views(theirs), itertools.count())]

    def title(self, engine: str) -> str:
        return (
            f"\nviews, {self.size:.0f} MB of resources one per line, best of {self.runs} rounds taken in turn, seconds "
            f"wall / CPU: dupflow's `view run` (one core) from the file to a CSV; {engine} from the same file to rows "
            "in hand (its load into DuckDB + its query, each its best); ratio: fhir4ds / dupflow wall (above 1: "
            "dupflow is faster)\n"
            f"{'view':<10} {'dupflow':>13} {'fhir4ds':>13} {'load + query':>13} {'ratio':>6} {'orjson parse':>12}  rows"
        )

    def compared(self, view: dict, their: dict, number: int) -> str:
        if "error" in their:
            return self.line(view, note=f"fhir4ds could not run this view: {their['error']}")
        return self.line(
            view,
            f"{their['seconds']:.2f} / {their['cpu']:.2f}",
            f"{their['load_seconds']:.2f} + {their['query_seconds']:.2f}",
            f"{their['seconds'] / view['seconds']:.2f}x",
            rows_agree(our_csv(self.ours, view["resource"]), self.theirs / f"{number}.json"),
        )

    def line(self, view: dict, theirs: str = "-", apart: str = "-", ratio: str = "-", note: str = "") -> str:
        ours = f"{view['seconds']:.2f} / {view['cpu']:.2f}"
        return (
            f"{view['resource']:<10} {ours:>13} {theirs:>13} {apart:>13} {ratio:>6} {self.parse_seconds:>12.2f}  {note}"
        )


def rows_agree(ours: Path, theirs: Path) -> str:
    """Our CSV's rows against fhir4ds's (JSON values as our CSV writes them), in any order."""
    from tasks.sof.output import csv_cells

    with ours.open(encoding="utf-8", newline="") as stream:
        our_rows = sorted(list(csv.reader(stream))[1:])
    their_rows = sorted(csv_cells(row) for row in json.loads(theirs.read_text(), parse_float=Decimal))
    if our_rows == their_rows:
        return f"{len(our_rows):,}, the same"
    if len(our_rows) != len(their_rows):
        return f"differ: dupflow {len(our_rows):,}, fhir4ds {len(their_rows):,}"
    mine, other = next(pair for pair in zip(our_rows, their_rows, strict=True) if pair[0] != pair[1])
    return f"{len(our_rows):,}, values differ: dupflow {mine} vs fhir4ds {other}"


# --- start-up ------------------------------------------------------------------------------------------------


def startup_rows(root: Path, runs: int) -> tuple[list[Row], tuple[float, float]]:
    """The cold and warm tiny job next to a command that never imports Prefect; the flow's and server's peak RSS."""
    from flows.prefect_server import ensure_server, server_status, stop_server
    from tests.benchmarks.bench_startup import cli, clean_environment

    home = root / "prefect-home"
    env = clean_environment(home, root / "jobs")
    os.environ.pop("PREFECT_API_URL", None)  # ensure_server here must find the same local server
    anchor = min(timed_tree(cli("list"), env)[0] for _ in range(runs))
    try:
        ensure_server(home)  # migrates a fresh database: not part of any later command's start-up
        stop_server(home)
        cold, _ = timed_tree(cli("start", "--no-progress"), env)
        ensure_server(home)
        warm = [timed_tree(cli("start", "--no-progress"), env) for _ in range(runs)]
        status = server_status(home) or {}
        server_mb = tree_peak_mb(status["pid"]) if status.get("pid") else 0.0
    finally:
        stop_server(home)
    seconds, flow_mb = min(warm)
    return [
        Row("start-up, tiny job, no server", "flows.run start", cold, "flows.run list", anchor, "s", flow_mb, True),
        Row(
            "start-up, tiny job, server runs", "flows.run start", seconds, "flows.run list", anchor, "s", flow_mb, True
        ),
    ], (flow_mb, server_mb)


MEMORY_JOBS = (
    ("compression.enabled=false",),
    ("compression.level=default",),
    ("compression.enabled=false", "services.flattening.formats=csv,parquet"),
)


def memory_lines(root: Path, megabytes: int, files: int, seed: int) -> list[str]:
    """A large job through the command line with the local server running: the command's process tree (flow
    process plus worker processes, each pid's peak summed: an upper bound) and the server's peak, apart."""
    from flows.prefect_server import ensure_server, server_status, stop_server
    from tests.benchmarks.bench_startup import cli, clean_environment

    data = write_dataset(root / "job-data", megabytes, files, seed + 1)
    size = sum(p.stat().st_size for p in data) / MB
    config = root / "memory-job.yaml"
    config.write_text(
        json.dumps(
            {
                "pipeline": {"enabled_steps": ["local_import", "flattening"]},
                "services": {"flattening": {"lookup_path": str(LOOKUP)}},
            }
        )
    )
    home = root / "prefect-home"
    env = clean_environment(home, root / "jobs")
    os.environ.pop("PREFECT_API_URL", None)
    lines = []
    try:
        ensure_server(home)
        server_pid = (server_status(home) or {})["pid"]
        for settings in MEMORY_JOBS:
            options = [part for setting in settings for part in ("--set", setting)]
            command = cli(
                "start",
                str(config),
                str(EXAMPLE / "example-crtdl.json"),
                "--dir",
                str(data[0].parent),
                *options,
                "--no-progress",
            )
            resting = vm_rss_mb(server_pid)
            seconds, tree_mb, flow_mb, together, shared = sampled_tree(command, env, server_pid)
            lines.append(
                f"memory, {size:,.0f} MB job (local_import + flattening, {', '.join(settings)}, {seconds:.0f} s): "
                f"command tree {tree_mb:,.0f} MB (flow process {flow_mb:,.0f} MB); reused server "
                f"{tree_peak_mb(server_pid):,.0f} MB (at rest before the job {resting:,.0f} MB); tree and server "
                f"together at most {sum(together.values()):,.0f} MB ("
                + ", ".join(f"{role} {mb:,.0f}" for role, mb in together.items())
                + f"); their proportional set sizes (PSS: shared pages counted once) together at most {shared:,.0f} MB"
            )
            shutil.rmtree(root / "jobs", ignore_errors=True)
    finally:
        stop_server(home)
    shutil.rmtree(root / "job-data", ignore_errors=True)
    return lines


def sampled_tree(
    command: list[str], env: dict[str, str], server_pid: int
) -> tuple[float, float, float, dict[str, float], float]:
    """Seconds, the sum of every tree member's peak RSS (sampled every 0.1 s), the flow process's own peak, the
    sample at which the tree and the server held the most together (their RSS summed), by role, and the most their
    PSS summed at one sample, in MB. The flow's peak is its own high-water mark, sampled: wait4's ru_maxrss would be
    the largest of it and every child it waited for (the Parquet worker's peak was taken for the flow process's)."""
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=output)
        peaks: dict[int, float] = {}
        together: dict[str, float] = {}
        shared = 0.0
        while (ended := os.wait4(process.pid, os.WNOHANG))[0] == 0:
            members = descendants(process.pid)
            for pid in members:
                peaks[pid] = max(peaks.get(pid, 0.0), vm_hwm_mb(pid))
            roles = {"server": vm_rss_mb(server_pid)}
            for pid in members:
                role = "flow" if pid == process.pid else process_role(pid)
                roles[role] = roles.get(role, 0.0) + vm_rss_mb(pid)
            together = max(together, roles, key=lambda held: sum(held.values()))
            shared = max(shared, sum(map(pss_mb, [server_pid, *members])))
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(ended[1])
        if process.returncode != 0:
            output.seek(0)
            raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}): {output.read()[-3000:]!r}")
    flow_mb = peaks.pop(process.pid, 0.0)
    return seconds, flow_mb + sum(peaks.values()), flow_mb, together, shared


def process_role(pid: int) -> str:
    """What a process under a job's command is, by its command line: a worker, a resource tracker, or another."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    return "workers" if b"LokyProcess" in command else "trackers" if b"resource_tracker" in command else "other"


def timed_tree(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock seconds and the command's peak RSS in MB (os.wait4: the largest of it and of the processes it
    waited for, its workers, if any: a tiny job starts none)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}): {process.stderr.read()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


# --- table ---------------------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'step':<36} {'ours':<26} {'':>9} {'anchor':<28} {'':>9} {'unit':<6} {'ratio':>6} {'peak RSS':>9}")
    for row in rows:
        peak = f"{row.peak_mb:,.0f} MB" if row.peak_mb is not None else ""
        print(
            f"{row.step:<36} {row.ours:<26} {figure(row.ours_rate):>9} {row.anchor:<28} {figure(row.anchor_rate):>9} "
            f"{row.unit:<6} {row.ratio:>5.2f}x {peak:>9}"
        )


def figure(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


CHILDREN: dict[str, Callable[..., dict]] = {
    "import": child_import,
    "fetch": child_fetch,
    "download": child_download,
    "pseudonymize": child_pseudonymize,
    "flatten": child_flatten,
    "views": child_views,
}


if __name__ == "__main__":
    main()
