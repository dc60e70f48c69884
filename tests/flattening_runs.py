"""The embedded engine as the flattening step runs it, without Prefect, for tests and benchmarks: each file through
the step's ``flatten_one`` (in this process, or in worker processes), then its ``join_parts``. The step adds only
the cached per-file task (``flatten[<file>]``) around the same call."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tasks.flattening import PARTS_FOLDER, FlattenOutcome, file_plan, flatten_one, join_parts, routes_by_provenance
from tasks.sof.crtdl_views import AttributeGroup, GroupView


def flatten_files(
    paths: list[Path],
    out_dir: Path,
    views: list[GroupView],
    skipped: list[AttributeGroup],
    *,
    max_line_bytes: int,
    processes: int = 1,
) -> FlattenOutcome:
    """The CSVs of ``paths`` in ``out_dir``: each file in this process (``processes`` 1), else in worker processes,
    ``processes`` files at once."""
    by_provenance = routes_by_provenance(paths, max_line_bytes)
    parts_dir = out_dir / PARTS_FOLDER
    plans = [file_plan(path, parts_dir, views, skipped, by_provenance, max_line_bytes) for path in paths]
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with ThreadPoolExecutor(processes) as threads:
            results = list(threads.map(lambda plan: flatten_one(plan, in_worker_process=processes > 1), plans))
        return join_parts(out_dir, parts_dir, views, skipped, results, by_provenance)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
