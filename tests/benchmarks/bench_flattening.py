"""Benchmark: resources/s of the ``flattening`` step as the product runs it, beside the engine alone in one
process, orjson parsing alone and the ``sqlonfhir`` package.

Run: ``uv run python -m tests.benchmarks.bench_flattening [--patients N] [--files N] [--reference-sample N]``.

One large file on every core: ``uv run python -m tests.benchmarks.bench_flattening --one-file-mb 100`` (the memory
case: ``--one-file-mb 2000``) writes one file of about that many MB of varied TORCH Bundles, made from the real
ones (the TORCH batch of ``config/sample-data`` and the example-flattening Bundle beside it: every id and reference
made unique per patient, dates, genders and ICD-10 codes drawn at random), and flattens it with the sample's CRTDL
and lookup (five groups) in 1 and in 2 processes (the step's pieces: cut into two spans per process), each run in a
fresh process (``python -m tests.flattening_runs``, the pool's start-up included). Printed side by side: seconds,
resources/s, rows and the peak RSS of the run's process tree; each run's seconds; the speed-up beside the
cores' own at that moment (``cores_speedup``, each round: a pure-Python loop in 1 and in 2 processes, the ceiling
of any split on a shared host); whether the CSVs are identical.

Data: seeded random TORCH-shaped batch lines (one transaction Bundle per patient: a Patient, Conditions with one
to three ICD-10 codings, Procedures with OPS and SNOMED codings, Encounters no group routes, one Provenance per
attribute group) in ``--files`` batch files as TORCH writes them, flattened with the shared example's CRTDL and
lookup (three groups). Figures printed:

- anchor: parsing the same bytes with orjson in one process (resources/s), the floor any JSON pipeline pays;
- the step: the ``flattening`` Prefect task in a flow on a temporary Prefect server (``prefect_test_harness``),
  timed around the task inside the flow: its cached ``flatten[<piece>]`` tasks, in worker processes when the
  product uses them (``tasks.streams.spans.input_pays_for_processes``: at least ``PROCESS_MIN_BYTES`` of input; the
  pool's start-up included), the parts joined into the CSVs; and the peak RSS of this process and of each worker;
- the engine alone, 1 process: the step's ``flatten_one`` per file, then ``join_parts`` (scan, parse, route, rows,
  CSV; no Prefect task: ``tests.flattening_runs``), what the step does in one process, its CSVs checked byte for
  byte against the step's, and the step's speed-up over it;
- reference: ``sqlonfhir`` (the SQL-on-FHIR reference runner on fhirpathpy; it pins an older fhirpathpy, so it
  runs in its own environment through ``uv run --no-project --with sqlonfhir``) evaluating the same three views
  over the same resources, already parsed and grouped by type (so only view evaluation is timed), on the first
  ``--reference-sample`` resources.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import sys
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import orjson
from prefect import flow

from tasks.job.contract import DataFile, StepInput
from tasks.flattening import flattening, plan_views
from tasks.streams.spans import input_pays_for_processes
from tasks.streams.processes import pool_size
from tests.support.processes import worker_pids
from tasks.sof.resources import line_resources
from tests.conftest import REPO_ROOT, TESTDATA
from tests.flattening_runs import flatten_files
from tests.steps import step_input

EXAMPLE = TESTDATA / "flattening" / "example"
SAMPLE = REPO_ROOT / "config" / "sample-data"
REAL_BUNDLES = (
    TESTDATA / "extraction" / "example-result" / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson",
    SAMPLE / "fhir-data.ndjson",
)
DATE = re.compile(r"^\d{4}(?=-\d\d-\d\d)")
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
GROUP_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/attribute_group"
ICD = "http://fhir.de/CodeSystem/bfarm/icd-10-gm"

REFERENCE_SCRIPT = r"""
import json, sys, time
import sqlonfhir
views = json.loads(open(sys.argv[1]).read())
by_type = {}
for line in open(sys.argv[2]):
    resource = json.loads(line)
    by_type.setdefault(resource["resourceType"], []).append(resource)
count = sum(len(v) for v in by_type.values())
started = time.perf_counter()
rows = 0
for view in views:
    rows += len(sqlonfhir.evaluate(by_type.get(view["resource"], []), view))
seconds = time.perf_counter() - started
print(json.dumps({"resources": count, "rows": rows, "seconds": seconds}))
"""


def patient_bundle(rng: random.Random, index: int, groups: dict[str, str]) -> dict:
    pid = f"pat-{index}"
    subject = {"reference": f"Patient/{pid}"}
    entries = [
        {
            "resourceType": "Patient",
            "id": pid,
            "meta": {
                "profile": [
                    "https://www.medizininformatik-initiative.de/fhir/core/modul-person/StructureDefinition/PatientPseudonymisiert"
                ]
            },
            "active": rng.random() < 0.9,
            "gender": rng.choice(["male", "female", "other"]),
            "birthDate": f"{rng.randint(1930, 2020)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            **(
                {"deceasedDateTime": f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"}
                if rng.random() < 0.1
                else {}
            ),
        }
    ]
    conditions = [
        {
            "resourceType": "Condition",
            "id": f"{pid}-cond-{c}",
            "clinicalStatus": {
                "coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical", "code": "active"}]
            },
            "verificationStatus": {
                "coding": [
                    {"system": "http://terminology.hl7.org/CodeSystem/condition-ver-status", "code": "confirmed"}
                ]
            },
            "code": {
                "coding": [
                    {
                        "system": ICD,
                        "version": "2024",
                        "code": f"{rng.choice('ABCDEIJKM')}{rng.randint(0, 99):02d}.{rng.randint(0, 9)}",
                    }
                    for _ in range(rng.randint(1, 3))
                ]
            },
            "subject": subject,
            "recordedDate": f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T10:30:00+01:00",
            "extension": [
                {"url": "http://hl7.org/fhir/StructureDefinition/condition-assertedDate", "valueDateTime": "2024-01-15"}
            ],
        }
        for c in range(rng.randint(1, 4))
    ]
    procedures = [
        {
            "resourceType": "Procedure",
            "id": f"{pid}-proc-{p}",
            "status": "completed",
            "code": {
                "coding": [
                    {
                        "system": "http://fhir.de/CodeSystem/bfarm/ops",
                        "version": "2024",
                        "code": f"{rng.randint(1, 9)}-{rng.randint(100, 999)}",
                    },
                    {"system": "http://snomed.info/sct", "code": str(rng.randint(10**8, 10**9))},
                ]
            },
            "subject": subject,
            "performedPeriod": {"start": "2024-01-15T11:00:00+01:00", "end": "2024-01-17T14:30:00+01:00"},
        }
        for p in range(rng.randint(0, 3))
    ]
    encounters = [
        {"resourceType": "Encounter", "id": f"{pid}-enc-{e}", "status": "finished", "subject": subject}
        for e in range(rng.randint(0, 2))
    ]
    resources = entries + conditions + procedures + encounters
    provenance = [
        {
            "resourceType": "Provenance",
            "id": f"{pid}-prov-{name}",
            "target": [{"reference": f"{r['resourceType']}/{r['id']}"} for r in members],
            "entity": [{"role": "source", "what": {"identifier": {"system": GROUP_SYSTEM, "value": groups[name]}}}],
        }
        for name, members in (("Patient", entries), ("Condition", conditions), ("Procedure", procedures))
        if members
    ]
    return {
        "resourceType": "Bundle",
        "type": "transaction",
        "entry": [
            {"resource": r, "request": {"method": "PUT", "url": f"{r['resourceType']}/{r['id']}"}}
            for r in resources + provenance
        ],
    }


def write_data(folder: Path, patients: int, files: int, seed: int) -> tuple[list[Path], int]:
    """``files`` batch files of ``patients`` Bundles in ``folder``; their paths and resources (no Provenance)."""
    folder.mkdir(parents=True, exist_ok=True)
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    ids = [g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]]
    groups = dict(zip(("Patient", "Condition", "Procedure"), ids, strict=True))
    rng = random.Random(seed)
    paths = [folder / f"batch-{number:04d}.ndjson" for number in range(1, files + 1)]
    count = 0
    for number, path in enumerate(paths):
        with path.open("wb") as out:
            for index in range(number * patients // files, (number + 1) * patients // files):
                bundle = patient_bundle(rng, index, groups)
                count += sum(1 for e in bundle["entry"] if e["resource"]["resourceType"] != "Provenance")
                out.write(orjson.dumps(bundle) + b"\n")
    return paths, count


def anchor(paths: list[Path]) -> float:
    """Resources/s of parsing every line with orjson in this process (Provenance included)."""
    started = time.perf_counter()
    count = 0
    for path in paths:
        with path.open("rb") as lines:
            for line in lines:
                count += len(orjson.loads(line)["entry"])
    return count / (time.perf_counter() - started)


@contextmanager
def workers_peak_mb() -> Iterator[dict[int, float]]:
    """Each worker process's peak RSS (``VmHWM``; Linux), sampled while the block runs: the step's workers end
    with it."""
    peaks: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for pid in worker_pids():
                with suppress(OSError):
                    status = Path(f"/proc/{pid}/status").read_text().splitlines()
                    hwm = [int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:")]
                    peaks[pid] = max([peaks.get(pid, 0.0), *hwm])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peaks
    finally:
        done.set()
        sampler.join()


@flow
def timed_flattening(step: StepInput) -> float:
    """Seconds of the flattening step, timed inside its flow (the flow's own start is not the step's)."""
    started = time.perf_counter()
    flattening(step)
    return time.perf_counter() - started


def flattening_step(job_dir: Path, paths: list[Path], resources: int) -> StepInput:
    """The step's input for a job whose import folder holds ``paths``."""
    per_file = resources // len(paths)
    return step_input(
        job_dir,
        "flattening",
        folder="import",
        files=[DataFile(name=p.name, size=p.stat().st_size, resources=per_file) for p in paths],
        facts={"crtdl_path": str(EXAMPLE / "example-crtdl.json")},
        position=1,
        pipeline__enabled_steps="[local_import, flattening]",
        services__flattening__lookup_path=str(LOOKUP),
    )


def run_step(job_dir: Path, paths: list[Path], resources: int) -> dict:
    """The step once on a fresh job (no cached file results): seconds, whether it used worker processes, and the
    peak RSS of this process and of each worker."""
    from prefect.testing.utilities import prefect_test_harness  # here: it loads Prefect's server (3 s of --help)

    step = flattening_step(job_dir, paths, resources)
    with prefect_test_harness(server_startup_timeout=120), workers_peak_mb() as peaks:
        seconds = timed_flattening(step)
    return {
        "seconds": seconds,
        "processes": pool_size() if input_pays_for_processes(step.input_paths()) else 1,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "workers_peak_mb": list(peaks.values()),
        "out_dir": step.output_dir,
    }


def reference(views: list[dict], path: Path, sample: int, folder: Path) -> dict | None:
    flat = folder / "resources.ndjson"
    taken = 0
    with path.open("rb") as lines, flat.open("wb") as out:
        for line in lines:
            for item in line_resources(orjson.loads(line)):
                if item["resourceType"] != "Provenance" and taken < sample:
                    out.write(orjson.dumps(item) + b"\n")
                    taken += 1
    (folder / "views.json").write_text(json.dumps(views))
    command = [
        "uv",
        "run",
        "--no-project",
        "--with",
        "sqlonfhir",
        "python",
        "-c",
        REFERENCE_SCRIPT,
        str(folder / "views.json"),
        str(flat),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        print(f"sqlonfhir could not run: {done.stderr.strip()[-400:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- one large file on every core --------------------------------------------------------------------------


def varied(value, suffix: str, rng: random.Random, key: str = ""):
    """A real Bundle (or part of it) as another patient's: ids and references made unique with ``suffix``, dates
    moved to a random year, genders and ICD-10 codes drawn at random; everything else as it was."""
    if isinstance(value, dict):
        icd = value.get("system") == ICD
        return {k: random_code(rng) if icd and k == "code" else varied(v, suffix, rng, k) for k, v in value.items()}
    if isinstance(value, list):
        return [varied(item, suffix, rng, key) for item in value]
    if not isinstance(value, str):
        return value
    if key == "id" or (key in ("reference", "url") and value.count("/") == 1 and value[:1].isupper()):
        return value + suffix
    if key == "gender":
        return rng.choice(["male", "female", "other", "unknown"])
    return DATE.sub(lambda _: str(rng.randint(1930, 2024)), value)


def random_code(rng: random.Random) -> str:
    return f"{rng.choice('ABCDEIJKMNRS')}{rng.randint(0, 99):02d}.{rng.randint(0, 9)}"


def write_one_file(path: Path, megabytes: int, seed: int) -> tuple[int, int]:
    """One file of about ``megabytes`` MB of varied real TORCH Bundles (``varied``), written as it is made; its
    Bundles and resources (no Provenance)."""
    templates = [orjson.loads(bundle.read_bytes()) for bundle in REAL_BUNDLES]
    rng = random.Random(seed)
    bundles = resources = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        while out.tell() < megabytes * 1_000_000:
            bundle = varied(rng.choice(templates), f"-{bundles}", rng)
            out.write(orjson.dumps(bundle) + b"\n")
            resources += sum(1 for e in bundle["entry"] if e["resource"]["resourceType"] != "Provenance")
            bundles += 1
    return bundles, resources


def run_fresh(path: Path, out: Path, processes: int) -> dict:
    """``tests.flattening_runs`` on ``path`` in a process of its own: seconds, rows, its tree's peak RSS."""
    command = [sys.executable, "-m", "tests.flattening_runs", str(out), str(processes)]
    command += [str(SAMPLE / "crtdl.json"), str(SAMPLE / "flatten-lookup.json"), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the run with {processes} processes failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spin(loops: int) -> float:
    """Seconds of a pure-Python loop of ``loops`` additions."""
    started = time.perf_counter()
    total = 0
    for number in range(loops):
        total += number
    return time.perf_counter() - started


def cores_speedup(processes: int, loops: int = 8_000_000) -> float:
    """What ``processes`` cores give over one at this moment: a pure-Python loop alone, then in ``processes``
    processes at once (forked, each timing itself): the ceiling of any split over processes while a busy host (its
    other guests, a CPU quota) takes part of the cores."""
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        alone = pool.apply(spin, (loops,))
        together = pool.map(spin, [loops] * processes, chunksize=1)
    return alone * processes / statistics.mean(together)


def one_file(megabytes: int, processes: int, seed: int, rounds: int) -> None:
    """1 and ``processes`` processes on one file, in ``rounds`` rounds taken in turn (each run a fresh process):
    best and median of each, their ratio, peak RSS, and whether the CSVs are the same bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "in" / "big.ndjson"
        bundles, resources = write_one_file(path, megabytes, seed)
        print(
            f"data: one file, {path.stat().st_size / 1e6:.1f} MB, {bundles} varied TORCH Bundles, {resources} "
            f"resources (no Provenance), {os.cpu_count()} cores, {rounds} rounds taken in turn"
        )
        runs: dict[int, list[dict]] = {1: [], processes: []}
        ceilings = []
        for _ in range(rounds):
            ceilings.append(cores_speedup(processes))
            for count in runs:
                shutil.rmtree(folder / f"out-{count}", ignore_errors=True)
                runs[count].append(run_fresh(path, folder / f"out-{count}", count))
        best = {count: min(r["seconds"] for r in done) for count, done in runs.items()}
        median = {count: statistics.median(r["seconds"] for r in done) for count, done in runs.items()}
        print(f"{'':28}{'1 process':>14}{f'{processes} processes':>16}")
        print(f"{'seconds, best':28}{best[1]:>14.2f}{best[processes]:>16.2f}")
        print(f"{'seconds, median':28}{median[1]:>14.2f}{median[processes]:>16.2f}")
        print(f"{'resources/s, best':28}{resources / best[1]:>14,.0f}{resources / best[processes]:>16,.0f}")
        print(f"{'rows':28}{runs[1][0]['rows']:>14}{runs[processes][0]['rows']:>16}")
        print("each round: seconds with 1 and with N processes, their ratio; the cores' own speed-up at that moment")
        for number, (one, many, ceiling) in enumerate(zip(runs[1], runs[processes], ceilings, strict=True), 1):
            ratio = one["seconds"] / many["seconds"]
            print(f"  {number:>2}: {one['seconds']:5.2f} {many['seconds']:5.2f}  {ratio:.2f}x  cores {ceiling:.2f}x")
        peaks = {count: max(r["tree_peak_mb"] for r in done) for count, done in runs.items()}
        print(f"{'peak RSS of the tree, MB':28}{peaks[1]:>14.0f}{peaks[processes]:>16.0f}")
        same = same_files(folder / "out-1", folder / f"out-{processes}")
        print(
            f"speed-up: {best[1] / best[processes]:.2f}x best, {median[1] / median[processes]:.2f}x median (the "
            f"cores' own, a pure-Python loop in 1 and {processes} processes: {statistics.median(ceilings):.2f}x "
            f"median); CSVs {'identical' if same else 'DIFFERENT'} ({len(list((folder / 'out-1').glob('*.csv')))} "
            "files)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=17_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--reference-sample", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--one-file-mb", type=int, help="one file of this many MB, flattened in 1 and in N processes")
    parser.add_argument("--processes", type=int, default=2, help="N for --one-file-mb")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of 1 and N processes for --one-file-mb")
    args = parser.parse_args()
    if args.one_file_mb:
        one_file(args.one_file_mb, args.processes, args.seed, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["PREFECT_HOME"] = str(folder / "prefect-home")
        job_dir = folder / "job"
        paths, count = write_data(job_dir / "import", args.patients, args.files, args.seed)
        size_mb = sum(path.stat().st_size for path in paths) / 1e6
        print(
            f"data: {count} resources (no Provenance) in {args.patients} patient Bundles, {args.files} files, "
            f"{size_mb:.1f} MB, {os.cpu_count()} cores"
        )
        print(f"anchor: orjson parse of the same bytes, 1 process: {anchor(paths):,.0f} resources/s")
        step = run_step(job_dir, paths, count)
        ours = count / step["seconds"]
        where = f"{step['processes']} worker processes, start-up included" if step["processes"] > 1 else "1 process"
        peaks = ", ".join(f"{mb:.0f}" for mb in step["workers_peak_mb"]) or "none"
        print(
            f"the flattening step ({where}): {ours:,.0f} resources/s, peak RSS {step['peak_mb']:.0f} MB, "
            f"workers' peak RSS {peaks} MB"
        )
        views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
        started = time.perf_counter()
        outcome = flatten_files(paths, folder / "one", views, skipped, max_line_bytes=64 << 20)
        alone = count / (time.perf_counter() - started)
        rows = sum(g.rows for g in outcome.groups)
        print(
            f"the engine alone, 1 process (scan, parse, route, rows, CSV; no Prefect task): {alone:,.0f} resources/s, "
            f"{rows} rows, CSVs {'identical' if same_files(folder / 'one', step['out_dir']) else 'DIFFERENT'}; "
            f"the step: {ours / alone:.2f}x"
        )
        result = reference([v.view for v in views], paths[0], args.reference_sample, folder)
        if result:
            theirs = result["resources"] / result["seconds"]
            print(
                f"sqlonfhir (view evaluation only, {result['resources']} resources): {theirs:,.0f} resources/s, "
                f"{result['rows']} rows"
            )
            print(f"ratio (engine alone / sqlonfhir): {alone / theirs:.1f}x")


def same_files(one: Path, other: Path) -> bool:
    """Whether the two folders hold the same CSVs, byte for byte."""
    names = sorted(p.name for p in one.glob("*.csv"))
    return names == sorted(p.name for p in other.glob("*.csv")) and all(
        (one / name).read_bytes() == (other / name).read_bytes() for name in names
    )


if __name__ == "__main__":
    main()
