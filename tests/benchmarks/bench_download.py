"""Download throughput of the extractor's downloader over loopback, next to what the wire and zstd allow.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_download [--megabytes 512] [--files 8] [--level default] [--rounds 5]

Writes ``--megabytes`` of seeded, varied TORCH-shaped NDJSON in ``--files`` files (``tests.benchmarks.compare``'s
data), serves them from the fake extraction server's directory mode in its own process, and measures in
``--rounds`` rounds, each measurement once a round in turn (the downloads each in a fresh child process, so that its
peak RSS is its own), each on an emptied and synced output folder, right after twice the data's size of memory was
written and freed (``runs.back_memory``: none pays for memory the host took back; a child does
it again after its imports, which take longer than the host waits):

- curl:     ``curl --parallel`` into files, ``DOWNLOAD_CONCURRENCY`` at a time (the anchor), and the same followed by
            ``sync`` (the files on disk, as a download leaves them: the plain download's anchor);
- zstd:     ``zstd -T1`` at ``--level`` of the served files (from the page cache) into files,
            then ``sync``: the zstd download's anchor, zstd alone on the same bytes;
- raw:      httpx streaming every file to nowhere, read as the download reads a body
            (``body_pieces``): the ceiling of httpx on this wire;
- synced:   the same into a file, written back to the disk as it grows and synced when complete (a download
            without its line check);
- plain:    ``tasks.clients.downloads.download_ndjson`` with compression off (NDJSON check of every line, line
            count, in the downloading thread; temporary file + fsync + rename), ``DOWNLOAD_CONCURRENCY`` files at a
            time on one client (``compare_download.download_group``, as the extractor);
- dupflow:  the same at zstd ``--level``.

Then the line check alone on the same bytes, one core, from memory
(``tasks.streams.line_check.LineChecker``: simdjson per line). Printed: each round's seconds, then
per measurement MB/s and its ratio to curl's, to curl-then-sync's and to zstd's in the same round
(min and median), the CPU seconds per GB (median; on a shared machine the steadier figure) of each
measurement and of the serving fake beside it, and the load average before and after. A
measurement's CPU is its child's and any process the child started, or curl's and zstd's own (curl:
one thread, nearly all of it the kernel's copies off the socket and into the page cache, which
every measurement that writes pays too; no row counts the kernel's writeback after a sync). The two
CPU columns together, over the cores, are the least time a measurement can take on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import resource
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tasks.clients.body_reads import body_pieces
from tasks.clients.downloads import target_names
from tasks.extractor import DOWNLOAD_CONCURRENCY
from tasks.streams.ndjson import ZSTD_LEVELS, CompressionLevel
from tasks.streams.files import start_writeback
from tasks.streams.line_check import LineChecker
from tasks.streams.ndjson_writer import WRITEBACK_BYTES
from tests.benchmarks.compare_download import curl_command, download_group, serving
from tests.benchmarks.dataset import MAX_LINE_BYTES, MB, write_dataset
from tests.benchmarks.runs import REPO_ROOT, back_memory, best_seconds, load, run_command, settled


LABELS = {
    "curl": "curl --parallel into files",
    "curl, sync": "curl --parallel into files, then sync",
    "zstd": "zstd -T1 {level} of the files, then sync",
    "raw": "raw httpx stream to /dev/null",
    "synced": "httpx stream into files, each synced",
    "plain": "dupflow download_ndjson, no compression",
    "dupflow": "dupflow download_ndjson, zstd {level}",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--level", choices=list(ZSTD_LEVELS), default="default")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=["raw", "synced", "dupflow", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--arguments", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, level=args.level, **json.loads(args.arguments))))
        return
    run_benchmark(args.megabytes, args.files, args.level, args.rounds)


def run_benchmark(megabytes: int, files: int, level: CompressionLevel, rounds: int) -> None:
    print(f"load average before: {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-download-") as scratch:
        root = Path(scratch)
        paths = write_dataset(root / "data", megabytes, files, seed=14)
        total = sum(p.stat().st_size for p in paths) / MB
        print(f"{len(paths)} files, {total:,.0f} MB over loopback, {DOWNLOAD_CONCURRENCY} at a time, {rounds} rounds")
        server = serving(root / "data")
        with server:
            found = [one_round(server, root / "out", level, paths) for _ in range(rounds)]
        check_rate = line_check_rate(paths)
    report(found, total, level)
    print(f"{'line check alone (simdjson per line), 1 core':<44} {check_rate:>8,.0f} MB/s")
    print(f"load average after: {load()}")


def one_round(server: serving, out: Path, level: str, paths: list[Path]) -> dict[str, dict]:
    """Every measurement once, in turn, each on an emptied and synced output folder and memory the host backs
    (``settled`` for the served ``paths``): seconds and the serving fake's CPU seconds (and, for a child, its CPU
    seconds and peak RSS). Each download runs right after its anchor (curl then sync, zstd), under
    the same load."""
    curl = curl_command(server.urls, out)
    zstd = ["zstd", "-q", "-f", "-T1", f"-{ZSTD_LEVELS[level]}", "--output-dir-flat", str(out)]
    zstd += map(str, paths)
    anchors = {
        "curl": lambda: run_command(curl),
        "curl, sync": lambda: (run_command(curl), os.sync()),
        "zstd": lambda: (run_command(zstd), os.sync()),
    }
    found: dict[str, dict] = {}
    backed = 2 * sum(path.stat().st_size for path in paths)
    for name in ("raw", "synced", "curl", "curl, sync", "plain", "zstd", "dupflow"):
        settled(out, paths)
        served, ended = server.cpu_seconds(), ended_children_cpu()
        if name in anchors:
            seconds = best_seconds(anchors[name], 1)
            found[name] = {"seconds": seconds, "cpu": ended_children_cpu() - ended}
        else:
            arguments = {"urls": server.urls, "out": str(out), "backed": backed}
            found[name] = in_child(name, arguments, level)
        found[name]["server_cpu"] = server.cpu_seconds() - served
    print("  ".join(f"{name} {result['seconds']:.2f} s" for name, result in found.items()), flush=True)
    return found


def report(found: list[dict[str, dict]], total: float, level: str) -> None:
    """Per measurement: MB/s min / median over the rounds, its ratio to curl's, to curl-then-sync's
    and to zstd's in the same round (min / median), its own and the server's CPU seconds per GB
    (median) and peak RSS."""
    anchors = ("curl", "curl, sync", "zstd")
    head = f"{'measurement':<44} {'MB/s':>13} " + " ".join(f"{'x ' + name:>13}" for name in anchors)
    print(f"{head} {'CPU s/GB':>9} {'server':>7} {'peak RSS':>9}")
    spreads = " ".join(f"{'min / median':>13}" for _ in range(4))
    print(f"{'':<44} {spreads} {'median':>9} {'s/GB':>7}")
    for name in found[0]:
        rates = [total / one[name]["seconds"] for one in found]
        ratios = [[one[to]["seconds"] / one[name]["seconds"] for one in found] for to in anchors]
        cpu = [one[name]["cpu"] / total * 1000 for one in found if "cpu" in one[name]]
        served = statistics.median(one[name]["server_cpu"] / total * 1000 for one in found)
        peak = max((one[name]["maxrss_kb"] / 1024 for one in found if "maxrss_kb" in one[name]), default=None)
        cpu_text = f"{statistics.median(cpu):.2f}" if cpu else ""
        peak_text = f"{peak:,.0f} MB" if peak else ""
        print(
            f"{LABELS[name].format(level=level):<44} {spread(rates, '{:,.0f}'):>13} "
            + " ".join(f"{spread(ratio):>13}" for ratio in ratios)
            + f" {cpu_text:>9} {served:>7.2f} {peak_text:>9}"
        )


def spread(values: list[float], form: str = "{:.2f}") -> str:
    return f"{form.format(min(values))} / {form.format(statistics.median(values))}"


def in_child(mode: str, arguments: dict, level: str) -> dict:
    """``measure(mode, **arguments)`` in a fresh interpreter: its JSON answer."""
    command = [sys.executable, "-m", "tests.benchmarks.bench_download", "--child", mode]
    command += ["--arguments", json.dumps(arguments)]
    command += ["--level", level]
    output = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(mode: str, urls: list[str], out: str, backed: int, level: CompressionLevel) -> dict:
    """One download of ``urls`` into ``out`` as ``mode``, right after ``backed`` bytes of memory
    were written and freed: the imports took seconds, and the host had taken back what
    ``settled`` backed (512 MB written into the page cache then took 1.5 s, not 0.3)."""
    folder = Path(out)
    names = target_names(urls, compress=False)

    def all_files() -> None:
        if mode in ("plain", "dupflow"):  # the extractor's way: its bounded threads on one client
            download_group(urls, out, level if mode == "dupflow" else None, DOWNLOAD_CONCURRENCY)
            return
        with httpx.Client(timeout=httpx.Timeout(60)) as client, ThreadPoolExecutor(DOWNLOAD_CONCURRENCY) as pool:
            list(pool.map(lambda url: stream_to(client, url, folder / names[url] if mode == "synced" else None), urls))

    back_memory(backed)
    cpu_before = cpu_seconds()
    seconds = best_seconds(all_files, 1)
    cpu = cpu_seconds() - cpu_before
    return {"seconds": seconds, "cpu": cpu, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def ended_children_cpu() -> float:
    """The CPU time of this process's ended children (curl's: its own, the sync's is this process's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds() -> float:
    """This process's CPU time and its ended children's (none for a download; kept so that one would count)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime + ended_children_cpu()


def stream_to(client: httpx.Client, url: str, path: Path | None) -> None:
    """The body, read as the download reads it, to nowhere (``path`` None), else into ``path``,
    its writing to the disk started every ``WRITEBACK_BYTES`` as the download's, synced when
    complete."""
    written_back = 0
    with client.stream("GET", url, headers={"Accept": "application/fhir+ndjson"}) as response:
        if path is None:
            for _ in body_pieces(response, 60):
                pass
            return
        with open(path, "wb") as out:
            for chunk in body_pieces(response, 60):
                out.write(chunk)
                if out.tell() - written_back >= WRITEBACK_BYTES:
                    out.flush()
                    start_writeback(out.fileno())
                    written_back = out.tell()
            out.flush()
            os.fsync(out.fileno())


def line_check_rate(paths: list[Path]) -> float:
    """MB/s of ``LineChecker`` alone over the first file, fed 1 MiB chunks from memory, best of 3."""
    data = paths[0].read_bytes()
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]

    def check() -> None:
        checker = LineChecker(str(paths[0]), MAX_LINE_BYTES)
        for chunk in chunks:
            checker.feed(chunk)
        checker.finish()

    return len(data) / MB / best_seconds(check, 3)


if __name__ == "__main__":
    main()
