"""``compare``'s download rows: ``download_ndjson`` from the fake extraction server next to curl and httpx."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import httpx

from tests.benchmarks.dataset import MAX_LINE_BYTES, MB
from tests.benchmarks.runs import REPO_ROOT, Row, best_seconds, fresh, in_child, peak_rss_mb, run_command


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
                "httpx threads, read as a download",
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
        # Port 0: the system gives a free port at the bind, and the status URL the fake prints names it.
        command = [sys.executable, "-m", "tests.fakes.extraction_server", "--port", "0", "--serve-dir"]
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
    from tasks.clients.body_reads import body_pieces

    folder = Path(out)

    def fetch(client: httpx.Client, number: int, url: str) -> None:
        with client.stream("GET", url) as response, open(folder / f"{number}.ndjson", "wb") as dest:
            for chunk in body_pieces(response, 60):
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
