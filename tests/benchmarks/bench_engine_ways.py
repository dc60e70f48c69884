"""Benchmark: the SQL-on-FHIR engine's two ways to a resource's rows, each view alone, next to orjson parsing.

Run: ``uv run python -m tests.benchmarks.bench_engine_ways [--patients 25000] [--rounds 3]``.

Why: ``bench_views`` runs the example's views as ``view run`` does, where struct_rows' block path takes every line,
so it cannot tell what the generated functions or the general way cost. A change to either is judged here: on views
outside the generator's subset (``getResourceKey()``, ``unionAll``) and on data the generated function hands back,
the general way is what runs.

Data: ``bench_views``' seeded files, one per type. Views: the example CRTDL's three (``plan_views``) and two of a
user's kind. Each round, for every view: orjson parsing every line of its file (the anchor), then the rows of every
resource (parsed beforehand) by each way (``tests.support.sof.in_one_way``; their rows are checked equal once).
Printed: CPU seconds (``time.process_time``) min / median over the rounds, each way's ratio to the anchor, the load
average.
"""

import argparse
import gc
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.flattening import plan_views
from tasks.sof.resources import parse_line
from tasks.sof.view import compile_view
from tests.benchmarks.bench_flattening import EXAMPLE, LOOKUP
from tests.benchmarks.bench_views import parse_all, spread, write_own_type_files
from tests.benchmarks.runs import load
from tests.support.sof import in_one_way

WAYS = ("generated", "general")
USER_VIEWS: dict[str, dict[str, Any]] = {
    "Condition keys": {
        "resource": "Condition",
        "select": [
            {
                "column": [
                    {"name": "key", "path": "getResourceKey()"},
                    {"name": "patient", "path": "subject.getReferenceKey(Patient)"},
                    {"name": "recorded", "path": "recordedDate"},
                ]
            },
            {
                "forEach": "code.coding",
                "column": [{"name": "system", "path": "system"}, {"name": "code", "path": "code"}],
            },
        ],
    },
    "Condition unionAll": {
        "resource": "Condition",
        "select": [
            {"column": [{"name": "id", "path": "id"}]},
            {
                "unionAll": [
                    {"forEach": "code.coding", "column": [{"name": "value", "path": "code"}]},
                    {"column": [{"name": "value", "path": "recordedDate"}]},
                ]
            },
        ],
    },
}


def cpu(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def measure(view: dict[str, Any], source: Path, rounds: int) -> dict[str, list[float]]:
    """Each round: the anchor, then every way's rows of every resource, consumed and not kept.

    Note: a view outside the generator's subset has no generated function: its "generated" is the general way.
    Why: rows kept by one way would make the garbage collector's passes dearer for the next; the ways' rows are
    compared once before the rounds.
    """
    with source.open("rb") as lines:
        resources = [parse_line(str(source), number, line) for number, line in enumerate(lines)]
    compiled = compile_view(view)
    ways = {way: in_one_way(compiled, way) for way in WAYS}
    first, *others = ([list(each.rows(r)) for r in resources] for each in ways.values())
    assert all(rows == first for rows in others), "the ways disagree"
    del first, others
    found: dict[str, list[float]] = {name: [] for name in ("orjson", *WAYS)}
    for _ in range(rounds):
        gc.collect()
        found["orjson"].append(cpu(lambda: parse_all(source)))
        for way, each in ways.items():
            gc.collect()
            found[way].append(cpu(lambda each=each: [deque(each.rows(r), 0) for r in resources]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--patients", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    print(f"load average before: {load()}")
    with tempfile.TemporaryDirectory() as scratch:
        paths = write_own_type_files(Path(scratch), args.patients, args.seed)
        planned = {group.resource_type: group.view for group in plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)[0]}
        views = {f"{kind} (example)": view for kind, view in planned.items()} | USER_VIEWS
        print(f"{args.patients:,} patients, {args.rounds} rounds; CPU s min / median, x orjson min / median")
        for name, view in views.items():
            found = measure(view, paths[view["resource"]], args.rounds)
            generated = in_one_way(compile_view(view), "generated").compiled is not None
            print(f"{name:<22} orjson {spread(found['orjson'])}")
            for way in WAYS:
                each = [mine / anchor for mine, anchor in zip(found[way], found["orjson"], strict=True)]
                none = "   (none: the general way)" if way == "generated" and not generated else ""
                print(
                    f"{'':<22} {way:<9} {spread(found[way])}   {min(each):.2f}x / {statistics.median(each):.2f}x{none}"
                )
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
