"""``compare``'s view rows: ``view run``'s CSV path next to orjson parsing, a hand-written DuckDB query, and fhir4ds."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from pathlib import Path

import orjson

from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.bench_views import duckdb_patient_csv
from tests.benchmarks.dataset import MAX_LINE_BYTES, MB
from tests.benchmarks.runs import Row, in_child

VIEW_MB = 55
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
