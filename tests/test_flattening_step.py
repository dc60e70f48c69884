"""The flattening step in a Prefect run: consecutive input files make one cached ``flatten[<first> … <last> (N
files)]`` task (``pipeline.file_batches``), so a re-run takes the finished batches from their parts and redoes the
others; a cached batch whose parts are gone is redone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tasks.job.contract import DataFile
from tasks.flattening import plan_views
from tasks.job.flattening_outcome import FlatteningError
from tests.steps import step_input
from tests.flattening_runs import flatten_files
from tests.support.flattening import run_step
from tests.support.flattening import EXAMPLE, LOOKUP, files_of, torch_batches

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def job_with_batches(tmp_path: Path):
    job_dir = tmp_path / "job"
    paths = torch_batches(job_dir / "import", files=3, patients=8)
    files = [DataFile(name=p.name, size=p.stat().st_size, resources=8) for p in paths]
    step = step_input(
        job_dir,
        "flattening",
        folder="import",
        files=files,
        facts={"crtdl_path": str(EXAMPLE / "example-crtdl.json")},
        position=1,
        pipeline__enabled_steps="[local_import, flattening]",
        pipeline__file_batches__max_files="2",  # batch-0000 and batch-0001, then batch-0002
        services__flattening__lookup_path=str(LOOKUP),
    )
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    flatten_files(paths, tmp_path / "expected", views, skipped, max_line_bytes=1 << 20)
    return step, paths


def spoil(path: Path) -> bytes:
    """Make the file unreadable as NDJSON without changing its size (the step's input stays the same)."""
    good = path.read_bytes()
    path.write_bytes(b"x" + good[1:])
    return good


def test_a_rerun_takes_finished_batches_from_their_parts_and_redoes_the_failed_one(tmp_path):
    step, paths = job_with_batches(tmp_path)
    good_last = spoil(paths[2])
    with pytest.raises(FlatteningError, match="batch-0002.ndjson: line 1"):
        run_step(step)
    assert not list(step.output_dir.glob("*.csv"))

    spoil(paths[0])  # would fail if flattened again: the finished batch must come from its parts
    paths[2].write_bytes(good_last)
    result = run_step(step)

    assert files_of(step.output_dir) == files_of(tmp_path / "expected")
    assert sorted(f.name for f in result.files) == sorted(files_of(tmp_path / "expected"))


def test_a_batch_failing_in_its_last_file_is_flattened_again_whole_and_no_batch_starts_after_it(tmp_path):
    step, paths = job_with_batches(tmp_path)
    good_second = spoil(paths[1])
    with pytest.raises(FlatteningError, match="batch-0001.ndjson: line 1"):
        run_step(step)
    assert not (step.output_dir / ".parts" / "batch-0002.ndjson").exists(), "no batch starts after a failed one"

    paths[1].write_bytes(good_second)
    result = run_step(step)

    assert files_of(step.output_dir) == files_of(tmp_path / "expected")
    assert sorted(f.name for f in result.files) == sorted(files_of(tmp_path / "expected"))


def test_a_finished_batch_whose_parts_are_gone_is_flattened_again(tmp_path):
    step, _ = job_with_batches(tmp_path)
    run_step(step)
    shutil.rmtree(step.output_dir)

    run_step(step, refresh=True)  # the step again; its files' cached results name parts no longer on disk

    assert files_of(step.output_dir) == files_of(tmp_path / "expected")
