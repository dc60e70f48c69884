"""A cohort end to end through the command line, each step beside its floor on the same bytes.

    python -m tests.benchmarks.bench_cohort [--mb 1024] [--patients 500] [--runs 2]
                                            [--no-pseudonymizer] [--bare-requests 1000]

Data: TORCH's result files for a cohort of at least ``--mb`` MB, seeded and varied
(``dataset.torch_bundle``: every line a transaction Bundle for one patient, with one Provenance per
attribute group), in batch files of ``--patients`` patients each (TORCH's ``torch.batchsize``
default, 500: about 5.5 MB a file) named by batch id, then ``core.ndjson`` (one Bundle of 200
Medications).

Services, each a process of its own whose CPU over each job is printed apart: the fake extraction
server serving the folder (``--serve-dir``: the job it is sent ends with those files), the fake
pseudonymizer (no latency, its own config) and the local Prefect server (``flows.run server start``
in a temporary ``PREFECT_HOME``).

The job, ``--runs`` times: ``python -m flows.run start CONFIG CRTDL`` as a user runs it, with the
shared example's CRTDL and lookup; steps extractor, pseudonymizer (unless ``--no-pseudonymizer``)
and flattening; compression at its default (zstd ``default``, level 5). Its CPU is the command's
process tree's (the command and the worker processes it waited for: ``wait4``). The tree's CPU is
also sampled every 0.5 s, and split by step at the start and end of each step's task run as the
server recorded them; "outside the steps" is the command's start, the flow's own work and its end.

Floors on the same bytes (the served files, the last job's folders), CPU seconds, the least of
``--runs`` runs each; the ratio is the command's CPU over their sum:

- extractor: ``curl --parallel`` of the served files (as many at a time as the step), then
  ``sync``; ``zstd -5 -T1`` of them;
- pseudonymizer: ``zstd -d`` of its input; orjson parsing its lines (the client's own work on the
  data); ``zstd -5 -T1`` of its output;
- flattening: ``zstd -d`` of its input; orjson parsing its lines.

Beside the pseudonymizer, in no floor: a bare ``http.client`` loop sending the first
``--bare-requests`` of its lines to the same fake one after the other, its CPU per request (the
least one HTTP exchange costs in Python), next to the step's CPU per request; then a bare
``httpx.Client().post`` loop sending the same lines (what a user of httpx can hope for).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import orjson

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.bench_startup import cli, clean_environment
from tests.benchmarks.compare_download import curl_command
from tests.benchmarks.dataset import MB, torch_bundle
from tests.benchmarks.memory import cpu_seconds
from tests.benchmarks.runs import REPO_ROOT, fresh, load

CRTDL = EXAMPLE / "example-crtdl.json"
ZSTD = ["zstd", "-q", "-5", "-T1"]
SAMPLE_SECONDS = 0.5
OUTSIDE = "outside the steps"
PARSE = """
import orjson, resource, sys, zstandard
from pathlib import Path
cpu = 0.0
for path in sorted(Path(sys.argv[1]).iterdir()):
    with path.open("rb") as raw:  # decompressed apart: zstd -d is a floor of its own
        lines = zstandard.ZstdDecompressor().stream_reader(raw).read().splitlines()
    before = resource.getrusage(resource.RUSAGE_SELF)
    for line in lines:
        orjson.loads(line)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu += after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
print(cpu)
"""
BARE = """
import http.client, httpx, resource, sys, zstandard
from pathlib import Path
from urllib.parse import urlsplit
folder, url, limit = Path(sys.argv[1]), urlsplit(sys.argv[2]), int(sys.argv[3])
lines = []
for path in sorted(folder.iterdir()):
    with path.open("rb") as raw:
        lines += zstandard.ZstdDecompressor().stream_reader(raw).read().splitlines()
    if len(lines) >= limit:
        break
headers = {"Content-Type": "application/fhir+json", "Accept": "application/fhir+json"}
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
connection = http.client.HTTPConnection(url.hostname, url.port)
before = cpu()
for line in lines[:limit]:
    connection.request("POST", "/fhir/$de-identify", body=line, headers=headers)
    connection.getresponse().read()
bare = cpu() - before
with httpx.Client() as client:
    before = cpu()
    for line in lines[:limit]:
        client.post(sys.argv[2] + "/fhir/$de-identify", content=line, headers=headers).read()
    print(len(lines[:limit]), bare, cpu() - before)
"""


@dataclass
class Services:
    """The running services: the URLs the job is given, each one's pid, the jobs' environment."""

    extractor: str
    pseudonymizer: str
    prefect: str
    pids: dict[str, int]
    env: dict[str, str]


@dataclass
class Job:
    """One job: wall and CPU seconds of the command's tree, in all and by step; services' CPU."""

    wall: float
    cpu: float
    steps: dict[str, tuple[float, float]]  # step (or OUTSIDE): (wall, CPU) seconds
    services: dict[str, float]
    job_dir: Path
    load: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of result files, at least (1024)")
    parser.add_argument("--patients", type=int, default=500, help="patients per batch file (500)")
    parser.add_argument("--runs", type=int, default=2, help="jobs, and runs of each floor (2)")
    parser.add_argument("--no-pseudonymizer", action="store_true", help="extractor, flattening")
    parser.add_argument("--bare-requests", type=int, default=1000, help="of the bare loop (1000)")
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    steps = ["extractor", *([] if args.no_pseudonymizer else ["pseudonymizer"]), "flattening"]
    print(f"{os.cpu_count()} cores, load average {load()}; steps {', '.join(steps)}", flush=True)
    scratch = os.environ.get("DUPFLOW_BENCH_DIR")
    with tempfile.TemporaryDirectory(prefix="bench-cohort-", dir=scratch) as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        cohort = write_cohort(root / "cohort", args.mb, args.patients, args.seed)
        size, bundles = sum(p.stat().st_size for p in cohort), lines_in(cohort)
        took = time.perf_counter() - started
        files = f"{len(cohort) - 1} batch files of {args.patients} patients, core.ndjson"
        print(f"cohort: {files}; ", end="")
        print(f"{bundles:,} Bundles, {size / MB:,.0f} MB, written in {took:.0f} s", flush=True)
        with services(root) as running:
            jobs = [run_job(root, running, steps, run) for run in range(args.runs)]
            floors = floor_cpu(root, jobs[-1].job_dir, steps, args.runs)
            bare, sent = None, jobs[-1].job_dir / "import"
            if "pseudonymizer" in steps:
                bare = bare_loop(sent, running.pseudonymizer, args.bare_requests)
    report(jobs, floors, steps, size)
    if bare is not None:
        with_http(jobs, floors, bundles, bare)


def with_http(jobs: list[Job], floors: Floors, requests: int, bare: tuple[int, float, float]) -> None:
    """The pseudonymizer's CPU per request beside the bare loop's, and the ratios again with the
    bare loop's CPU for each of its requests (one a Bundle) added to its floors."""
    each, cpus = bare[1] / bare[0], [job.steps["pseudonymizer"][1] for job in jobs]
    ours = 1000 * min(cpus) / requests
    print(f"\nthe pseudonymizer's CPU per request (a Bundle): {ours:.2f} ms; ", end="")
    print(f"a bare http.client loop's ({bare[0]:,} requests): {1000 * each:.2f} ms")
    print(f"a bare httpx.Client().post loop's (the same requests): {1000 * bare[2] / bare[0]:.2f} ms")
    floor = sum(floors["pseudonymizer"].values()) + each * requests
    total = sum(sum(parts.values()) for parts in floors.values()) + each * requests
    print(f"with the bare loop's {each * requests:.1f} s for its requests in the floors: ", end="")
    commands = [job.cpu for job in jobs]
    print(f"pseudonymizer {ratio(cpus, floor)}, the command {ratio(commands, total)}")


# --- the data ---------------------------------------------------------------------------------


def write_cohort(folder: Path, megabytes: int, patients: int, seed: int) -> list[Path]:
    """TORCH's result files for ``megabytes`` MB or a little more: batch files of ``patients``
    patient Bundles each, named by batch id, then ``core.ndjson``."""
    crtdl = json.loads(CRTDL.read_text())
    ids = [g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]]
    groups = dict(zip(("Patient", "Condition", "Procedure"), ids, strict=True))
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    paths, size, index = [], 0, 0
    while size < megabytes * MB:
        path = folder / f"{uuid.UUID(int=rng.getrandbits(128), version=4)}.ndjson"
        with path.open("wb") as out:
            for _ in range(patients):
                line = orjson.dumps(torch_bundle(rng, index, groups)) + b"\n"
                out.write(line)
                size, index = size + len(line), index + 1
        paths.append(path)
    core = folder / "core.ndjson"
    core.write_bytes(orjson.dumps(core_bundle(rng)) + b"\n")
    return [*paths, core]


def core_bundle(rng: random.Random, resources: int = 200) -> dict:
    """TORCH's ``core.ndjson`` line: a transaction Bundle of resources no patient owns."""
    entries = []
    for _ in range(resources):
        atc = "http://fhir.de/CodeSystem/bfarm/atc"
        code = {"system": atc, "code": f"N02BE0{rng.randint(1, 9)}"}
        ident = f"{rng.getrandbits(128):032x}"
        medication = {"resourceType": "Medication", "id": ident, "code": {"coding": [code]}}
        request = {"method": "PUT", "url": f"Medication/{ident}"}
        entries.append({"resource": medication, "request": request})
    bundle_id = f"{rng.getrandbits(128):032x}"
    return {"resourceType": "Bundle", "id": bundle_id, "type": "transaction", "entry": entries}


def lines_in(paths: list[Path]) -> int:
    count = 0
    for path in paths:
        with path.open("rb") as data:
            count += sum(1 for _ in data)
    return count


# --- the services -----------------------------------------------------------------------------


@contextmanager
def services(root: Path) -> Iterator[Services]:
    """The two fakes and the local Prefect server, each a process of its own."""
    served = str(root / "cohort")
    torch = [sys.executable, "-m", "tests.fakes.extraction_server", "--port", "0"]
    torch += ["--serve-dir", served]
    fake = [sys.executable, "-m", "tests.fakes.pseudonymizer", "--port", "0", "--latency", "0"]
    home = root / "prefect-home"
    env = clean_environment(home, root / "jobs")
    with own_process(torch) as (torch_pid, torch_url), own_process(fake) as (fake_pid, fake_url):
        start = cli("server", "start")
        subprocess.run(start, cwd=REPO_ROOT, env=env, check=True, capture_output=True)
        try:
            server = json.loads((home / "dupflow-server.json").read_text())
            pids = {"extraction server": torch_pid, "pseudonymizer": fake_pid}
            pids["Prefect server"] = server["pid"]
            yield Services(torch_url, fake_url, server["url"], pids, env)
        finally:
            stop = cli("server", "stop")
            subprocess.run(stop, cwd=REPO_ROOT, env=env, check=False, capture_output=True)


@contextmanager
def own_process(command: list[str]) -> Iterator[tuple[int, str]]:
    """A fake in a process of its own: its pid and the URL ending its first line of output."""
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not (found := re.search(r"(https?://\S+)\s*$", line)):
            raise SystemExit(f"{command[2]} did not start: {line!r}")
        yield process.pid, found.group(1)
    finally:
        process.terminate()
        process.wait(10)


# --- the job ----------------------------------------------------------------------------------


def run_job(root: Path, running: Services, steps: list[str], run: int) -> Job:
    """The job through the command line: its tree's CPU, in all and by step; the services' CPU."""
    config = root / "job.yaml"
    config.write_text(json.dumps(job_config(running, steps)))
    fresh(root / "jobs")()
    before, was = {name: cpu_seconds(pid) for name, pid in running.pids.items()}, load()
    command = cli("start", str(config), str(CRTDL), "--no-progress")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=running.env, **pipes)
    sampler = Sampler(process.pid)
    _, status, usage = os.wait4(process.pid, 0)
    wall, cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
    sampler.stop(cpu)
    out, err = process.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the job failed:\n{err.decode()[-3000:]}")
    used = {name: cpu_seconds(pid) - before[name] for name, pid in running.pids.items()}
    job_dir = Path(out.decode().split("\n", 1)[0].split(": ", 1)[1])
    spans = step_spans(running.prefect, job_dir.name, steps)
    job = Job(wall, cpu, sampler.split(spans, wall), used, job_dir, f"{was} / {load()}")
    by_step = ", ".join(f"{step} {seconds:.1f}" for step, (_, seconds) in job.steps.items())
    theirs = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in used.items())
    print(f"job {run + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s ({by_step}); services' CPU {theirs}")
    print(f"  load average before / after: {job.load}", flush=True)
    return job


def job_config(running: Services, steps: list[str]) -> dict:
    polling = {"polling_interval": "1s", "max_polling_interval": "1s"}
    return {
        "pipeline": {"enabled_steps": steps},
        "services": {
            "extractor": {"base_url": running.extractor, **polling},
            "pseudonymizer": {"url": running.pseudonymizer},
            "flattening": {"lookup_path": str(LOOKUP)},
        },
    }


class Sampler:
    """The CPU seconds of a process tree every ``SAMPLE_SECONDS``, by time (``time.time``)."""

    def __init__(self, pid: int):
        self.pid, self.samples, self.done = pid, [(time.time(), 0.0)], threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.done.wait(SAMPLE_SECONDS):
            self.samples.append((time.time(), cpu_seconds(self.pid)))

    def stop(self, total: float) -> None:
        """Stop sampling; ``total``, the tree's CPU as ``wait4`` gave it, is the last sample."""
        self.done.set()
        self.thread.join()
        self.samples.append((time.time(), total))

    def at(self, moment: float) -> float:
        """The tree's CPU seconds at ``moment``, between the samples either side."""
        for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False):
            if t0 <= moment <= t1:
                return c0 + (c1 - c0) * (moment - t0) / max(t1 - t0, 1e-9)
        return self.samples[-1][1] if moment > self.samples[-1][0] else 0.0

    def span(self, start: float, end: float) -> tuple[float, float]:
        return end - start, self.at(end) - self.at(start)

    def split(self, spans: dict[str, tuple[float, float]], wall: float) -> dict[str, tuple]:
        """(wall, CPU) seconds of each step's span; the rest of the command's as ``OUTSIDE``."""
        steps = {name: self.span(start, end) for name, (start, end) in spans.items()}
        walls, cpus = zip(*steps.values(), strict=True)
        return steps | {OUTSIDE: (wall - sum(walls), self.samples[-1][1] - sum(cpus))}


def step_spans(api: str, job_id: str, steps: list[str]) -> dict[str, tuple[float, float]]:
    """Each step's task run's start and end (epoch seconds) as the server recorded them (they
    arrive as events, so they are waited for)."""
    body = {"flow_runs": {"tags": {"all_": [f"job-{job_id}"]}}, "limit": 200}
    names = {f"{step}[{number}]": step for number, step in enumerate(steps, 1)}
    found: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = httpx.post(f"{api}/task_runs/filter", json=body, timeout=60).json()
        found = {names[r["name"]]: r for r in runs if r["name"] in names and r.get("end_time")}
        if len(found) == len(steps):
            return {step: span_of(found[step]) for step in steps}
        time.sleep(1)
    raise SystemExit(f"the server holds no finished task run of each step: {sorted(found)}")


def span_of(task_run: dict) -> tuple[float, float]:
    """A task run's start and end as epoch seconds."""
    start, end = (datetime.fromisoformat(task_run[key]) for key in ("start_time", "end_time"))
    return start.timestamp(), end.timestamp()


# --- the floors -------------------------------------------------------------------------------


Floors = dict[str, dict[str, float]]  # by step, by floor: CPU seconds


def floor_cpu(root: Path, job_dir: Path, steps: list[str], runs: int) -> Floors:
    """Each step's floors on the same bytes (the served files, the job's folders): CPU seconds, the
    least of ``runs``, by step and floor."""
    status_url = json.loads((job_dir / "job.json").read_text())["facts"]["extraction_status_url"]
    files = [item["url"] for item in httpx.get(status_url, timeout=60).json()["output"]]
    out, served = root / "floor-out", sorted((root / "cohort").iterdir())
    download, clear = curl_command(files, out), fresh(out)
    floors = {
        "extractor": {
            "curl + sync": least(runs, lambda: child_cpu(download) + child_cpu(["sync"]), clear),
            "zstd -5 -T1": least(runs, lambda: compressed_cpu(served, out), clear),
        }
    }
    folders = {step: job_dir / ("import" if step == "extractor" else step) for step in steps}
    for before, step in zip(steps, steps[1:], strict=False):
        source = sorted(folders[before].iterdir())
        floors[step] = {
            "zstd -d": least(runs, lambda s=source: child_cpu(["zstd", "-qdc", *map(str, s)])),
            "orjson": least(runs, lambda f=folders[before]: parsed_cpu(f)),
        }
    if "pseudonymizer" in steps:
        plain = root / "pseudonymized"
        fresh(plain)()
        written = map(str, sorted(folders["pseudonymizer"].iterdir()))
        subprocess.run(["zstd", "-qd", "--output-dir-flat", str(plain), *written], check=True)
        compress = lambda: compressed_cpu(sorted(plain.iterdir()), out)  # noqa: E731
        floors["pseudonymizer"]["zstd -5 -T1"] = least(runs, compress, clear)
    return floors


def least(
    runs: int,
    measure: Callable[[], float],
    before: Callable[[], None] = lambda: None,
) -> float:
    values = []
    for _ in range(runs):
        before()
        values.append(measure())
    return min(values)


def compressed_cpu(files: list[Path], out: Path) -> float:
    return child_cpu([*ZSTD, "-f", "--output-dir-flat", str(out), *map(str, files)])


def child_cpu(command: list[str]) -> float:
    """CPU seconds (user and system) of ``command`` and what it waited for; its output dropped."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed: {process.stderr.read()[-2000:]!r}")
    return usage.ru_utime + usage.ru_stime


def parsed_cpu(folder: Path) -> float:
    """CPU seconds of orjson parsing every line of the zstd files in ``folder``."""
    command = [sys.executable, "-c", PARSE, str(folder)]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def bare_loop(folder: Path, url: str, requests: int) -> tuple[int, float, float]:
    """The bare ``http.client`` loop, then the bare httpx one, over the first ``requests`` lines of
    ``folder``: requests sent, each loop's CPU seconds."""
    command = [sys.executable, "-c", BARE, str(folder), url, str(requests)]
    done = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
    return int(done[0]), float(done[1]), float(done[2])


# --- the report -------------------------------------------------------------------------------


def report(jobs: list[Job], floors: Floors, steps: list[str], size: int) -> None:
    print(f"\n{size / MB:,.0f} MB, {len(jobs)} jobs: seconds, min / median over the jobs\n")
    print(f"{'':<20}{'wall':>14}{'CPU':>14}{'floor CPU':>11}{'ratio':>15}  floors")
    for step in [*steps, OUTSIDE]:
        walls, cpus = [job.steps[step][0] for job in jobs], [job.steps[step][1] for job in jobs]
        parts = floors.get(step, {})
        floor = sum(parts.values())
        shown = ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts.items())
        print(f"{step:<20}{pair(walls):>14}{pair(cpus):>14}{floor:11.2f}", end="")
        print(f"{ratio(cpus, floor):>15}", end="")
        print(f"  {shown}")
    floor = sum(sum(parts.values()) for parts in floors.values())
    walls, cpus = [job.wall for job in jobs], [job.cpu for job in jobs]
    print(f"{'the command':<20}{pair(walls):>14}{pair(cpus):>14}{floor:11.2f}", end="")
    print(f"{ratio(cpus, floor):>15}")
    print("\nthe services' CPU seconds per job, in none of the above, min / median:")
    for name in jobs[0].services:
        print(f"  {name}: {pair([job.services[name] for job in jobs])}")
    print("load average (1, 5, 15 min) before / after each job: " + "; ".join(j.load for j in jobs))


def pair(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f}"


def ratio(cpus: list[float], floor: float) -> str:
    return f"{min(cpus) / floor:.2f} / {statistics.median(cpus) / floor:.2f}" if floor else "-"


if __name__ == "__main__":
    main()
