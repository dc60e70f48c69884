"""The embedded engine as the flattening step runs it, without Prefect, for tests and benchmarks: the step's pieces
(``plan_pieces``: whole files, or spans of large files' lines), each through the step's ``flatten_one`` (in this
process, or in worker processes), then its ``join_parts``. The step adds only the cached per-piece task
(``flatten[<piece>]``) around the same call.

``python -m tests.flattening_runs OUT PROCESSES CRTDL LOOKUP FILE...`` runs ``flatten_files`` in a process of its
own and prints, as JSON, its seconds and the peak RSS of its process tree (this process and its worker processes:
``tests.benchmarks.memory``), for benchmarks that compare runs.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from pathlib import Path

from tasks.flattening import (
    PARTS_FOLDER,
    flatten_one,
    join_parts,
    plan_pieces,
    plan_views,
)
from tasks.job.contract import DataFile
from tasks.job.flattening_plan import remember_plan
from tasks.sof.flatten import FilePlan, routes_by_provenance
from tasks.job.flattening_outcome import FlattenOutcome
from tasks.streams.processes import worker_pool
from tasks.streams.spans import SPAN_MIN_BYTES
from tasks.sof.crtdl_views import AttributeGroup, GroupView
from tests.benchmarks.memory import tree_peak_mb

MAX_LINE_BYTES = 64 << 20


def flatten_files(
    paths: list[Path],
    out_dir: Path,
    views: list[GroupView],
    skipped: list[AttributeGroup],
    *,
    max_line_bytes: int,
    processes: int = 1,
    spans: int | None = None,
    min_span_bytes: int = SPAN_MIN_BYTES,
) -> FlattenOutcome:
    """The CSVs of ``paths`` (all in one folder) in ``out_dir``: each piece in this process (``processes`` 1),
    else in worker processes, ``processes`` pieces at once. Files are cut as the step cuts them for ``spans``
    processes (default: ``processes``), into spans of at least ``min_span_bytes``."""
    parts_dir = out_dir / PARTS_FOLDER
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        # As the step does: the workers start while the input is scanned for routes and cut.
        with worker_pool("tasks.sof.flatten") if processes > 1 else nullcontext():
            by_provenance = routes_by_provenance(paths, max_line_bytes)
            folder = paths[0].parent if paths else out_dir
            files = [DataFile(path.name, path.stat().st_size, 0) for path in paths]
            cut = spans or processes
            to_do = plan_pieces(folder, files, parts_dir, cut, by_provenance, max_line_bytes, min_span_bytes)
            pieces = [todo.args[0] for todo in to_do]
            plan = remember_plan(views, skipped)
            shared = (plan.groups, plan.skipped_ids, by_provenance, max_line_bytes)
            plans = [FilePlan(str(folder), [p], str(parts_dir), p.folder, *shared) for p in pieces]
            calls = [
                partial(flatten_one, plan, piece.label, piece.span.lines or None, in_worker_process=processes > 1)
                for piece, plan in zip(pieces, plans, strict=True)
            ]
            context = contextvars.copy_context()  # the pool's: each call runs in a copy of it
            with ThreadPoolExecutor(processes) as threads:
                results = list(threads.map(lambda call: context.copy().run(call), calls))
        return join_parts(out_dir, parts_dir, views, skipped, results, by_provenance)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)


def main(argv: list[str]) -> None:
    out, processes, crtdl, lookup, *files = argv
    views, skipped = plan_views(Path(crtdl), Path(lookup))
    peaks = [0.0]
    done = threading.Event()
    sampler = threading.Thread(target=sample_tree_peak, args=(peaks, done), daemon=True)
    sampler.start()
    started = time.perf_counter()
    outcome = flatten_files(
        [Path(f) for f in files], Path(out), views, skipped, max_line_bytes=MAX_LINE_BYTES, processes=int(processes)
    )
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    rows = sum(group.rows for group in outcome.groups)
    print(json.dumps({"seconds": seconds, "rows": rows, "tree_peak_mb": max(peaks[0], tree_peak_mb(os.getpid()))}))


def sample_tree_peak(peaks: list[float], done: threading.Event) -> None:
    """The largest ``tree_peak_mb`` of this process seen until ``done``: the workers end with ``flatten_files``."""
    while not done.wait(0.2):
        peaks[0] = max(peaks[0], tree_peak_mb(os.getpid()))


if __name__ == "__main__":
    main(sys.argv[1:])
