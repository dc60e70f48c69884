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
              files, read as the download reads a body (``body_pieces``);
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
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import zstandard

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.compare_download import child_download, child_fetch, download_rows
from tests.benchmarks.compare_startup import memory_lines, startup_rows
from tests.benchmarks.compare_views import VIEW_MB, child_views, view_rows
from tests.benchmarks.dataset import MAX_LINE_BYTES, MB, write_dataset
from tests.benchmarks.runs import Row, best_seconds, fresh, in_child, load, peak_rss_mb, run_command

LATENCY_SECONDS = 0.01
PSEUDONYMIZED_BUNDLES = 1000
FLATTENED_MB = 16


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
    from tasks.clients.http import ServiceClient, ServiceEndpoint
    from tasks.clients.pseudonymizer import Pseudonymizer
    from tasks.streams.progress import use_display
    from tasks.pseudonymizer import pseudonymize_path

    use_display("none")
    counts = []

    def pseudonymize() -> None:
        endpoint = ServiceEndpoint("pseudonymizer", base_url, AuthSettings())
        with ServiceClient(endpoint, TlsSettings(), RetrySettings()) as client:
            counts.append(
                pseudonymize_path(
                    Path(source),
                    Path(out) / "out.ndjson.zst",
                    Pseudonymizer(client),
                    level="default",
                    max_line_bytes=MAX_LINE_BYTES,
                    concurrency=concurrency,
                )
            )

    seconds = best_seconds(pseudonymize, runs, fresh(Path(out)))
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
