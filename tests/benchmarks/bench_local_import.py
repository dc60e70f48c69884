"""local_import throughput and memory: ``python -m tests.benchmarks.bench_local_import [MB ...]``.

For each size, writes an NDJSON file of synthetic patient bundles, imports it with the step's own
function at every compression level, and prints MB/s and the peak RSS of a fresh child process (with the
worker processes a large plain file is checked in), so memory can be compared across file sizes (it must stay
flat).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tests.benchmarks.bench_compression import patient_bundle


def write_source(path: Path, megabytes: int) -> None:
    rng = random.Random(3)
    block = b"".join(orjson.dumps(patient_bundle(rng, ["lab", "value", "high", "low"])) + b"\n" for _ in range(400))
    with open(path, "wb") as f:
        for _ in range(max(1, megabytes * 1024 * 1024 // len(block))):
            f.write(block)


def import_once(source: str, level: str) -> None:
    """Child process: one import, then report seconds and peak RSS (its own plus its worker processes')."""
    from tasks.local_import import import_file
    from tests.benchmarks.memory import tree_peak_mb
    from tests.steps import step_input

    overrides = {"compression.enabled": "false"} if level == "off" else {"compression.level": level}
    step = step_input(Path(tempfile.mkdtemp()) / "bench", "local_import", **overrides)
    start = time.perf_counter()
    record = import_file.fn(step, source, "out.ndjson.zst", [])
    seconds = time.perf_counter() - start
    peak_mb = tree_peak_mb(os.getpid())
    print(f"{seconds} {peak_mb} {record.size}")


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [256, 2048]
    print("size MB  level    MB/s  ratio  peak RSS MB")
    with tempfile.TemporaryDirectory() as tmp:
        for megabytes in sizes:
            source = Path(tmp) / f"{megabytes}.ndjson"
            write_source(source, megabytes)
            size = source.stat().st_size
            for level in ("off", "fastest", "default", "better", "best"):
                out = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        f"from tests.benchmarks.bench_local_import import import_once; "
                        f"import_once({str(source)!r}, {level!r})",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                seconds, peak, written = float(out[0]), float(out[1]), int(out[2])
                print(f"{size / 1e6:7.0f}  {level:<7} {size / 1e6 / seconds:6.0f}  {size / written:5.1f}x  {peak:8.0f}")
            source.unlink()


if __name__ == "__main__":
    main()
