"""The local Prefect server's memory with Prefect's defaults, as dupflow starts it and two variants of that, in
interleaved rounds.

Run on demand (not collected by pytest):

    python -m tests.benchmarks.bench_server [--rounds 5] [--jobs 2] [--files 40] [--settle 20]

Each round starts the command line's local server (``flows.prefect_server.ensure_server``) in a temporary
PREFECT_HOME of its own per variant: once with Prefect's defaults (every service on, glibc's 8 malloc arenas per
core: ``SERVER_DEFAULTS`` overridden through the environment, which wins over them), once as dupflow starts it,
once as dupflow starts it without the database's migration check at start-up (the home's database is migrated by
its first start), once with every server service off, and a new home's first start (it migrates the database); the
variants take turns, so all see the same machine load.
For each start:

- at rest: the server's RSS (``VmRSS`` of its process tree) ``--settle`` seconds after it answers;
- during a small job: the highest RSS sampled (every 0.1 s) while ``--jobs`` jobs run one after the other, and the
  server's peak (``VmHWM``) after. A job is the embedded sample job's configuration over ``--files`` files (copies
  of the bundled sample's two NDJSON files): ``local_import`` and flattening, a task run per file and step.

Apart from that last variant, the first start of each home is not counted. Figures go to stdout: min and median per
variant over the rounds, in MB, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from prefect.settings.models.server.services import ServerServicesSettings

from flows.prefect_server import SERVER_DEFAULTS, ensure_server, server_status, stop_server
from tests.benchmarks.runs import load
from tests.benchmarks.memory import descendants, tree_peak_mb

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = REPO_ROOT / "config" / "sample-data"
GLIBC_ARENAS = str(8 * (os.cpu_count() or 1))  # glibc's default MALLOC_ARENA_MAX on 64-bit
SERVICES = ServerServicesSettings.model_fields  # each turned off by PREFECT_SERVER_SERVICES_<NAME>_ENABLED=false
FIRST_START = "a home's first start"
VARIANTS = {
    "Prefect's defaults": {name: GLIBC_ARENAS if name == "MALLOC_ARENA_MAX" else "true" for name in SERVER_DEFAULTS},
    "as dupflow starts it": {},
    "no migration check": {"PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "false"},
    FIRST_START: {},
    "every service off": {f"PREFECT_SERVER_SERVICES_{name.upper()}_ENABLED": "false" for name in SERVICES},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts of each variant")
    parser.add_argument("--jobs", type=int, default=2, help="jobs per start")
    parser.add_argument("--files", type=int, default=40, help="files per job")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after start-up before the rest figure")
    args = parser.parse_args()
    for name in [name for name in os.environ if name.startswith("APP_") or name in SERVER_DEFAULTS]:
        del os.environ[name]
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.pop("PREFECT_SERVER_API_PORT", None)
    print(f"load average: {load()} on {os.cpu_count()} CPUs; dupflow's server settings: {SERVER_DEFAULTS}")
    figures: dict[str, list[tuple[float, float, float]]] = {label: [] for label in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-server-") as scratch:
        data = job_data(Path(scratch) / "data", args.files)
        homes = {label: Path(scratch) / f"home-{number}" for number, label in enumerate(VARIANTS)}
        for label, home in homes.items():  # the first start migrates the home's database: counted on its own
            if label != FIRST_START:
                ensure_server(home)
                stop_server(home)
        for round_number in range(args.rounds):
            homes[FIRST_START] = Path(scratch) / f"first-{round_number}"
            for label, home in homes.items():
                with variant(label):
                    figures[label].append(measure(home, Path(scratch) / "jobs", data, args.jobs, args.settle))
                rest, during, peak = figures[label][-1]
                print(f"round {round_number + 1} {label:<20} rest {rest:4.0f}, job {during:4.0f}, peak {peak:4.0f} MB")
    print(f"load average: {load()}")
    print(f"{'server RSS, MB':<21} {'at rest':>16} {'during a job':>16} {'peak (VmHWM)':>16}   (min / median)")
    for label, measured in figures.items():
        columns = [[row[index] for row in measured] for index in range(3)]
        print(f"{label:<21} " + " ".join(f"{min(c):7.0f} / {statistics.median(c):6.0f}" for c in columns))


class variant:
    """The environment of one variant while the block runs."""

    def __init__(self, label: str):
        self.settings = VARIANTS[label]

    def __enter__(self) -> None:
        os.environ.update(self.settings)

    def __exit__(self, *exc: object) -> None:
        for name in self.settings:
            os.environ.pop(name, None)


def job_data(folder: Path, files: int) -> Path:
    """``files`` NDJSON files in ``folder``: copies of the sample's, in turn."""
    folder.mkdir()
    sample = sorted(SAMPLE.glob("*.ndjson"))
    for number in range(files):
        (folder / f"{number:04d}.ndjson").write_bytes(sample[number % len(sample)].read_bytes())
    return folder


def measure(home: Path, jobs_dir: Path, data: Path, jobs: int, settle: float) -> tuple[float, float, float]:
    """(at rest, highest during the jobs, VmHWM) of a fresh start of the server in ``home``, in MB."""
    ensure_server(home)
    pid = server_status(home)["pid"]
    time.sleep(settle)
    rest = tree_rss_mb(pid)
    highest, done = [rest], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            highest.append(tree_rss_mb(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        env = {**os.environ, "PREFECT_HOME": str(home), "APP_JOBS_DIR": str(jobs_dir), "PYTHONPATH": str(REPO_ROOT)}
        for _ in range(jobs):
            command = [sys.executable, "-m", "flows.run", "start", str(SAMPLE.parent / "default.yaml")]
            command += [str(SAMPLE / "crtdl.json"), "--dir", str(data), "--no-progress"]
            subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, check=True)
    finally:
        done.set()
        sampler.join()
    peak = tree_peak_mb(pid)
    stop_server(home)
    return rest, max(highest), peak


def tree_rss_mb(pid: int) -> float:
    """The current RSS (``VmRSS``) of ``pid`` and its descendants, summed."""
    total = 0.0
    for member in descendants(pid):
        try:
            lines = Path(f"/proc/{member}/status").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) / 1024 for line in lines if line.startswith("VmRSS:"))
    return total


if __name__ == "__main__":
    main()
