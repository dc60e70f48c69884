"""Benchmark: each of the example's three views over a file of its own resource type, next to orjson parsing the same
file, and the Patient view next to a hand-written DuckDB query, file to CSV, in this process and each as a process.

Run: ``uv run python -m tests.benchmarks.bench_views [--patients 25000] [--rounds 5]``.

Data: ``--patients`` seeded varied TORCH-shaped patient Bundles (``bench_flattening.patient_bundle``: a Patient,
one to four Conditions with one to three random ICD-10 codings, up to three Procedures with random OPS and SNOMED
codes, random dates and genders), their resources written one per line into one file per type (Patient, Condition,
Procedure): no line repeats. Views: the three the shared example's CRTDL gives (``plan_views`` with its lookup).

Each round, in turn for every view: orjson parsing every line of the view's file (``orjson.loads`` in a loop, the
anchor), then ``view run``'s CSV path (``flows.view_cli.write_csv``, the file to a CSV file); for the Patient view
also DuckDB (``read_json`` of the file with the view's six fields, ``COPY ... TO`` a CSV, its threads), whose CSV
must be the same bytes as ours (duckdb and the CSV writer imported before the rounds). Then the same as a user runs
them, each a process of its own (this venv's Python, without ``uv run``'s lock check, which both would pay):
``python -m flows.run view run VIEW.json FILE --format csv`` with its standard output to a file, for every view, and
for Patient a Python process that imports duckdb and runs that query; every CSV must be the same bytes as
``write_csv``'s.

Printed: per view the CPU seconds (``time.process_time``: the process's, DuckDB's threads included; of a process,
user + system of every thread, from ``RUSAGE_CHILDREN``) and wall seconds, min and median over the rounds, the ratio
dupflow / orjson of each round's CPU (min and median), the same of dupflow against DuckDB in this process and as
processes, whether
the project's own modules were byte-compiled (after the Quick start on a machine with ``PYTHONDONTWRITEBYTECODE=1``
they are not: every process compiles those it imports), and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP, patient_bundle
from tests.benchmarks.runs import REPO_ROOT, load

TYPES = ("Patient", "Condition", "Procedure")
PATIENT_FIELDS = {  # the Patient view's columns: (JSON key, DuckDB type)
    "id": ("id", "VARCHAR"),
    "active": ("active", "BOOLEAN"),
    "deceased_boolean": ("deceasedBoolean", "BOOLEAN"),
    "deceased_datetime": ("deceasedDateTime", "VARCHAR"),
    "gender": ("gender", "VARCHAR"),
    "birth_date": ("birthDate", "VARCHAR"),
}


def write_own_type_files(folder: Path, patients: int, seed: int) -> dict[str, Path]:
    """One NDJSON file per type of ``TYPES``, the resources of ``patients`` varied Bundles one per line."""
    crtdl = json.loads((EXAMPLE / "example-crtdl.json").read_text())
    groups = dict(zip(TYPES, (g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]), strict=True))
    rng = random.Random(seed)
    paths = {kind: folder / f"{kind}.ndjson" for kind in TYPES}
    outs = {kind: path.open("wb") for kind, path in paths.items()}
    try:
        for index in range(patients):
            for entry in patient_bundle(rng, index, groups)["entry"]:
                resource = entry["resource"]
                if resource["resourceType"] in outs:
                    outs[resource["resourceType"]].write(orjson.dumps(resource) + b"\n")
    finally:
        for out in outs.values():
            out.close()
    return paths


def duckdb_patient_sql(source: Path, target: Path) -> str:
    """The Patient view by hand in DuckDB: ``read_json`` of the six fields it reads (and ``resourceType``, for files
    of several types), to a CSV with a header."""
    fields = {"resourceType": "VARCHAR", **dict(PATIENT_FIELDS.values())}
    columns = ", ".join(f"{key}: '{kind}'" for key, kind in fields.items())
    select = ", ".join(f'"{key}" AS {name}' for name, (key, _) in PATIENT_FIELDS.items())
    table = f"read_json('{source}', format = 'newline_delimited', columns = {{{columns}}})"
    query = f"SELECT {select} FROM {table} WHERE resourceType = 'Patient'"
    return f"COPY ({query}) TO '{target}' (FORMAT csv, HEADER true)"


CODING = "STRUCT(system VARCHAR, code VARCHAR)[]"
CONDITION_FIELDS = {  # the fields the Condition view reads, as DuckDB types
    "resourceType": "VARCHAR",
    "id": "VARCHAR",
    "subject": "STRUCT(reference VARCHAR)",
    "code": f"STRUCT(coding {CODING})",
    "recordedDate": "VARCHAR",
    "clinicalStatus": f"STRUCT(coding {CODING})",
    "verificationStatus": f"STRUCT(coding {CODING})",
    "extension": "STRUCT(url VARCHAR, valueDateTime VARCHAR)[]",
}
CONDITION_SYSTEMS = {  # column suffix: the system its forEachOrNull keeps
    "sct": "http://snomed.info/sct",
    "icd10gm": "http://fhir.de/CodeSystem/bfarm/icd-10-gm",
    "alphaid": "http://fhir.de/CodeSystem/bfarm/alpha-id",
    "orphanet": "http://www.orpha.net",
}
ASSERTED = "http://hl7.org/fhir/StructureDefinition/condition-assertedDate"


def duckdb_condition_sql(source: Path, target: Path) -> str:
    """The Condition view by hand in DuckDB: ``read_json`` of the fields it reads, each ``forEachOrNull`` an unnest
    of its list (one null where it is empty) in a query around the last, so that the last varies fastest, to a CSV
    with a header."""
    columns = ", ".join(f"{key}: '{kind}'" for key, kind in CONDITION_FIELDS.items())
    query = f"SELECT * FROM read_json('{source}', format = 'newline_delimited', columns = {{{columns}}})"
    query += " WHERE resourceType = 'Condition'"
    lists = {n: f"list_filter(code.coding, lambda c: c.system = '{s}')" for n, s in CONDITION_SYSTEMS.items()}
    lists |= {"cs": "clinicalStatus.coding", "vs": "verificationStatus.coding"}
    lists["asserted"] = f"list_filter(extension, lambda e: e.url = '{ASSERTED}')"
    for name, found in lists.items():
        branch = f"unnest(CASE WHEN len({found}) > 0 THEN {found} ELSE [NULL] END) AS {name}"
        query = f"SELECT *, {branch} FROM ({query})"
    codes = ", ".join(f"{n}.system AS code_system_{n}, {n}.code AS code_code_{n}" for n in CONDITION_SYSTEMS)
    statuses = ", ".join(
        f"{short}.system AS {name}_status_system, {short}.code AS {name}_status_code"
        for short, name in (("cs", "clinical"), ("vs", "verification"))
    )
    select = (
        f"id, subject.reference AS patient, {codes}, recordedDate AS recorded_date, {statuses}, "
        "asserted.valueDateTime AS feststellungsdatum"
    )
    return f"COPY (SELECT {select} FROM ({query})) TO '{target}' (FORMAT csv, HEADER true)"


DUCKDB_SQL = {"Patient": duckdb_patient_sql, "Condition": duckdb_condition_sql}
"""The views a hand-written DuckDB query runs next to: the query of the view over a file, to a CSV."""


def duckdb_csv(sql: str) -> None:
    import duckdb

    with duckdb.connect() as connection:
        connection.execute(sql)


def duckdb_patient_csv(source: Path, target: Path) -> None:
    duckdb_csv(duckdb_patient_sql(source, target))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def as_process(command: list[str], target: Path | None = None) -> tuple[float, float]:
    """CPU (user + system, every thread) and wall seconds of ``command`` as a process, its standard output to
    ``target`` (else nowhere)."""
    cpu, wall = children_cpu(), time.perf_counter()
    with open(target or os.devnull, "wb") as out:
        subprocess.run(command, stdout=out, check=True, cwd=REPO_ROOT)
    return children_cpu() - cpu, time.perf_counter() - wall


def view_run_process(view: Path, source: Path, target: Path) -> tuple[float, float]:
    return as_process(
        [sys.executable, "-m", "flows.run", "view", "run", str(view), str(source), "--format", "csv"], target
    )


def duckdb_process(sql: str) -> tuple[float, float]:
    script = "import sys, duckdb; duckdb.connect().execute(sys.argv[1])"
    return as_process([sys.executable, "-c", script, sql])


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall seconds of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    work()
    return time.process_time() - cpu, time.perf_counter() - wall


def parse_all(path: Path) -> None:
    with path.open("rb") as lines:
        for line in lines:
            orjson.loads(line)


def dupflow_csv(view, source: Path, target: Path) -> None:
    from flows.view_cli import write_csv

    with target.open("w", encoding="utf-8", newline="") as out:
        write_csv(view, source, out)


def measure(paths: dict[str, Path], out: Path, rounds: int) -> dict[str, dict[str, list]]:
    """``rounds`` rounds, each view in turn: orjson, dupflow, ``view run`` as a process (and DuckDB in this process
    and as a process for Patient); (CPU, wall) per round."""
    from tasks.flattening import plan_views
    from tasks.sof.view import compile_view

    views = {}
    for group in plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)[0]:
        (out / f"{group.resource_type}.view.json").write_text(json.dumps(group.view))
        views[group.resource_type] = compile_view(group.view)
    # imported before the rounds, so that no round of this process counts an import (the process rows do)
    import duckdb  # noqa: F401

    import flows.view_cli  # noqa: F401

    found: dict[str, dict[str, list]] = {kind: {} for kind in TYPES}
    for _ in range(rounds):
        for kind in TYPES:
            for name, figures in one_view(kind, paths[kind], views[kind], out).items():
                found[kind].setdefault(name, []).append(figures)
    return found


def one_view(kind: str, source: Path, view, out: Path) -> dict[str, tuple[float, float]]:
    """One round of one view: (CPU, wall) of each measurement, taken in this order."""
    found = {
        "orjson": timed(lambda: parse_all(source)),
        "dupflow": timed(lambda: dupflow_csv(view, source, out / f"{kind}-dupflow.csv")),
        "view run": view_run_process(out / f"{kind}.view.json", source, out / f"{kind}-process.csv"),
    }
    if kind in DUCKDB_SQL:
        found["duckdb"] = timed(lambda: duckdb_csv(DUCKDB_SQL[kind](source, out / f"{kind}-duckdb.csv")))
        found["duckdb process"] = duckdb_process(DUCKDB_SQL[kind](source, out / f"{kind}-duckdb-process.csv"))
    return found


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f}"


def ratios(ours: list[tuple[float, float]], anchor: list[tuple[float, float]]) -> str:
    """Min and median of each round's CPU ratio."""
    each = [mine[0] / theirs[0] for mine, theirs in zip(ours, anchor, strict=True)]
    return f"{min(each):>6.2f}x / {statistics.median(each):.2f}x"


def report(paths: dict[str, Path], found: dict[str, dict[str, list]], out: Path) -> None:
    heads = ("orjson CPU s", "dupflow CPU s", "dupflow wall s", "dupflow/orjson", "view run CPU s")
    print(f"{'view':<10} {'MB':>6} " + " ".join(f"{head:>15}" for head in heads))
    print(f"{'':<10} {'':>6} " + " ".join(f"{'min / median':>15}" for _ in heads))
    for kind in TYPES:
        ours, anchor, process = (found[kind][name] for name in ("dupflow", "orjson", "view run"))
        print(
            f"{kind:<10} {paths[kind].stat().st_size / 1e6:>6.1f} {spread([c for c, _ in anchor]):>15} "
            f"{spread([c for c, _ in ours]):>15} {spread([w for _, w in ours]):>15} {ratios(ours, anchor):>15} "
            f"{spread([c for c, _ in process]):>15}"
        )
        if (out / f"{kind}-process.csv").read_bytes() != (out / f"{kind}-dupflow.csv").read_bytes():
            raise SystemExit(f"view {kind}: view run's process wrote another CSV than write_csv")
    for kind in DUCKDB_SQL:
        duckdb_lines(kind, found[kind], out)


def duckdb_lines(kind: str, found: dict[str, list], out: Path) -> None:
    """The view against its hand-written DuckDB query, in this process and as processes."""
    duck, ours = found["duckdb"], found["dupflow"]
    same = (out / f"{kind}-duckdb.csv").read_bytes() == (out / f"{kind}-dupflow.csv").read_bytes()
    print(
        f"{kind} view, file to CSV, hand-written DuckDB query (read_json, COPY TO csv, {os.cpu_count()} threads): "
        f"CPU {spread([c for c, _ in duck])} s, wall {spread([w for _, w in duck])} s (min / median); "
        f"dupflow / DuckDB: CPU {ratios(ours, duck)} (min / median of each round's), "
        f"wall {min(w for _, w in ours) / min(w for _, w in duck):.2f}x (min against min); "
        f"CSVs {'identical' if same else 'DIFFERENT'}"
    )
    duck, ours = found["duckdb process"], found["view run"]
    same = (out / f"{kind}-duckdb-process.csv").read_bytes() == (out / f"{kind}-process.csv").read_bytes()
    print(
        f"the same as processes (python -m flows.run view run, against python importing duckdb and running the query): "
        f"view run CPU {spread([c for c, _ in ours])} s, wall {spread([w for _, w in ours])} s; DuckDB CPU "
        f"{spread([c for c, _ in duck])} s, wall {spread([w for _, w in duck])} s (min / median); view run / DuckDB "
        f"CPU {ratios(ours, duck)} (min / median of each round's); CSVs {'identical' if same else 'DIFFERENT'}"
    )


def compiled_project() -> str:
    """Whether this tree's own modules have their bytecode cached (else every process compiles what it imports)."""
    cached = (REPO_ROOT / "flows" / "__pycache__").is_dir()
    return "byte-compiled" if cached else "not byte-compiled (every process compiles the modules it imports)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dupflow-views-") as tmp:
        folder = Path(tmp)
        paths = write_own_type_files(folder, args.patients, args.seed)
        lines = {kind: sum(1 for _ in path.open("rb")) for kind, path in paths.items()}
        print(
            f"own-type files of {args.patients} varied patients: "
            + ", ".join(f"{kind} {lines[kind]:,} lines" for kind in TYPES)
            + f"; {os.cpu_count()} cores, {args.rounds} rounds taken in turn; load average before: {load()}"
        )
        print(f"the project's own modules: {compiled_project()}")
        found = measure(paths, folder, args.rounds)
        report(paths, found, folder)
        print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
