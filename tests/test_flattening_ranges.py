"""One large file cut into spans of lines (``plan_pieces``), each span flattened on its own, in this process or in
worker processes, gives the CSVs of the file flattened whole, byte for byte: TORCH Bundles, bare Provenance at the
end that routes bare resources at the start (another span), plain and zstd. An error names its line as in the whole
file. In a Prefect run a resumed step keeps its finished spans, and the spans' progress reaches the job log without
a terminal (in log lines) and the step's progress artifact.

The large files are mostly filler (long Encounter lines that no attribute group takes): cheap to flatten, so a
file large enough for the step to cut is quick to run."""

from __future__ import annotations

import random
import re
from pathlib import Path

import orjson
import pytest
import zstandard

from flows.run import EXIT_OK, main
from tasks.streams import processes
from tasks.job.contract import DataFile
from tasks.job.layout import step_artifact_key
from tasks.flattening import PARTS_FOLDER, plan_pieces, plan_views
from tasks.job.flattening_outcome import FlatteningError
from tasks.streams.ndjson import WHOLE_FILE, iter_lines
from tasks.streams.spans import (
    PLAIN_SPANS_PER_PROCESS,
    PROCESS_MIN_BYTES,
    SPAN_MIN_BYTES,
    file_spans,
    input_pays_for_processes,
    line_spans,
)
from tests.benchmarks.bench_flattening import patient_bundle
from tests.steps import step_input
from tests.support.flattening import EXAMPLE, LOOKUP, bare_file, files_of, group_ids
from tests.support.flattening import run_step
from tests.support.jobs import only_job_dir
from tests.flattening_runs import flatten_files

MB = 1024 * 1024
SMALL_SPANS = 64 * 1024  # the least bytes per span in the plain-function tests (the step's is SPAN_MIN_BYTES)


def filler(number: int, size: int) -> bytes:
    """A long line no attribute group takes (an Encounter: unrouted), with blank lines after it."""
    return orjson.dumps({"resourceType": "Encounter", "id": f"fill-{number}", "text": {"div": "x" * size}}) + b"\n\n"


def big_file(path: Path, *, patients: int, filler_bytes: int) -> Path:
    """Bare resources, TORCH Bundles between fillers (``filler_bytes`` in all), then the bare Provenance that routes
    the bare resources: a file cut into spans has them in its first span and their routes in its last."""
    rng, groups = random.Random(7), group_ids()
    path.parent.mkdir(parents=True, exist_ok=True)
    *bare, provenance = bare_file(path, groups).read_bytes().splitlines(keepends=True)
    fillers = max(patients // 20, 1)
    with path.open("wb") as out:
        out.writelines(bare)
        for index in range(patients):
            out.write(orjson.dumps(patient_bundle(rng, index, groups)) + b"\n")
            if index % 20 == 0:
                out.write(filler(index, filler_bytes // fillers))
        out.write(provenance)
    return path


def zstd_copy(path: Path) -> Path:
    target = path.with_name(path.name + ".zst")
    target.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
    return target


def flatten(
    paths: list[Path], out: Path, *, processes_count: int = 1, spans: int = 1, min_span_bytes: int = SMALL_SPANS
):
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    return flatten_files(
        paths,
        out,
        views,
        skipped,
        max_line_bytes=10 * MB,
        processes=processes_count,
        spans=spans,
        min_span_bytes=min_span_bytes,
    )


# --- spans of lines --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_a_files_spans_hold_its_lines_with_their_numbers_in_order(tmp_path, compressed):
    lines = [b'{"resourceType":"Patient","id":"p%d","v":"%s"}' % (i, b"y" * (i * 37 % 900)) for i in range(2000)]
    data = b"\n\n".join(lines[:1000]) + b"\n" + b"\n".join(lines[1000:])  # blank lines; no newline at the end
    path = tmp_path / "data.ndjson"
    path.write_bytes(data)
    if compressed:
        path = zstd_copy(path)

    whole = list(iter_lines(path, MB))
    spans = line_spans(path, 5, 4096)

    assert len(spans) == 5 and spans[0].start == 0 and spans[-1].end is None
    assert [line for span in spans for line in iter_lines(path, MB, span)] == whole
    assert sum(span.lines for span in spans) == data.count(b"\n")
    assert all(data[span.start - 1 : span.start] == b"\n" for span in spans[1:])


@pytest.mark.parametrize(
    ("compressed", "per_process"), [(False, PLAIN_SPANS_PER_PROCESS), (True, 1)], ids=["plain", "zstd"]
)
def test_a_plain_file_gets_spans_to_spare_for_processes_that_finish_first_a_zstd_file_one_each(
    tmp_path, compressed, per_process
):
    path = big_file(tmp_path / "in" / "big.ndjson", patients=120, filler_bytes=400_000)
    content = path.stat().st_size
    if compressed:
        path = zstd_copy(path)

    assert PLAIN_SPANS_PER_PROCESS > 1
    assert len(file_spans(path, 2, SMALL_SPANS)) == 2 * per_process
    assert len(file_spans(path, 2, content // 3)) == min(3, 2 * per_process)  # no span below the least bytes
    assert file_spans(path, 2, content) == [WHOLE_FILE]


@pytest.mark.parametrize("processes_count", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: worker processes
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_a_file_cut_into_spans_gives_the_bytes_of_the_whole_file(tmp_path, processes_count, compressed):
    path = big_file(tmp_path / "in" / "big.ndjson", patients=120, filler_bytes=400_000)
    if compressed:
        path = zstd_copy(path)
    min_span = path.stat().st_size // 4  # of the file on disk: a zstd file is cut by its compressed size
    file = DataFile(name=path.name, size=path.stat().st_size, resources=1)
    to_do = plan_pieces(path.parent, [file], tmp_path / "pieces", 4, True, 10 * MB, min_span)
    pieces = [todo.args[0] for todo in to_do]
    assert [piece.label for piece in pieces] == [f"{path.name}#{i}/4" for i in range(1, 5)]
    first, *_, last = pieces
    assert any(b"bare-1" in line for _, line in iter_lines(path, MB, first.span))
    assert any(b"bare-prov" in line for _, line in iter_lines(path, MB, last.span))

    whole = flatten([path], tmp_path / "whole")
    cut = flatten([path], tmp_path / "cut", processes_count=processes_count, spans=4, min_span_bytes=min_span)

    assert files_of(tmp_path / "cut") == files_of(tmp_path / "whole")
    assert cut.summary() == whole.summary() and cut.files == whole.files
    assert b"bare-1" in (tmp_path / "cut" / "MII PR Person Patient (Pseudonymisiert).csv").read_bytes()
    assert b"bare-c" in (tmp_path / "cut" / "Diagnosis.csv").read_bytes()
    assert cut.unrouted["Encounter"] > 0


@pytest.mark.slow  # worker processes
def test_several_files_keep_their_order_when_some_are_cut(tmp_path):
    (tmp_path / "in").mkdir()
    small = bare_file(tmp_path / "in" / "a-small.ndjson", group_ids())
    big = big_file(tmp_path / "in" / "b-big.ndjson", patients=80, filler_bytes=300_000)
    last = tmp_path / "in" / "c-small.ndjson"
    last.write_bytes(orjson.dumps(patient_bundle(random.Random(3), 999, group_ids())) + b"\n")

    whole = flatten([small, big, last], tmp_path / "whole")
    cut = flatten([small, big, last], tmp_path / "cut", processes_count=2, spans=3)

    assert files_of(tmp_path / "cut") == files_of(tmp_path / "whole")
    assert cut.summary() == whole.summary()


@pytest.mark.slow  # worker processes
def test_a_bad_line_in_a_later_span_is_named_by_its_line_in_the_whole_file(tmp_path):
    path = big_file(tmp_path / "in" / "big.ndjson", patients=60, filler_bytes=200_000)
    spans = line_spans(path, 3, SMALL_SPANS // 8)
    data = bytearray(path.read_bytes())
    data[spans[2].start] = ord("x")  # the first line of the third span
    path.write_bytes(bytes(data))

    with pytest.raises(FlatteningError, match=rf"big\.ndjson: line {spans[2].lines_before + 1} is not valid JSON"):
        flatten([path], tmp_path / "out", processes_count=2, spans=3)

    assert list((tmp_path / "out").iterdir()) == []


# --- the step in a Prefect run ---------------------------------------------------------------------------------


def step_on(job_dir: Path, path: Path):
    return step_input(
        job_dir,
        "flattening",
        folder="import",
        files=[DataFile(name=path.name, size=path.stat().st_size, resources=1)],
        facts={"crtdl_path": str(EXAMPLE / "example-crtdl.json")},
        position=1,
        pipeline__enabled_steps="[local_import, flattening]",
        services__flattening__lookup_path=str(LOOKUP),
    )


def flattening_progress(job_id: str) -> tuple[float, str]:
    """The data and description of the flattening step's progress artifact
    (``job-<id>-<NN>-flattening-progress``), as the latest run left it. Every test's job here is named ``job``: the
    key is shared by the runs of earlier tests, so the newest version is asked of the server (unsorted, it returns
    a page of 200 versions in no set order)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    key = step_artifact_key(job_id, 1, "flattening", "progress")
    with get_client(sync_client=True) as client:
        (newest,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return newest.data, newest.description


def spoil_at(path: Path, offset: int) -> int:
    """Make the line at ``offset`` no JSON, the file's size unchanged; the byte it had."""
    data = bytearray(path.read_bytes())
    byte, data[offset] = data[offset], ord("x")
    path.write_bytes(bytes(data))
    return byte


def restore_at(path: Path, offset: int, byte: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = byte
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_rerun_keeps_the_finished_span_of_a_cut_file_and_redoes_the_failed_one(tmp_path):
    if not processes.processes_allowed():
        pytest.skip("one core: the step does not cut files")
    job_dir = tmp_path / "job"
    path = big_file(job_dir / "import" / "big.ndjson", patients=200, filler_bytes=2 * SPAN_MIN_BYTES + MB)
    flatten([path], tmp_path / "expected")
    spans = file_spans(path, processes.pool_size(), SPAN_MIN_BYTES)
    assert len(spans) >= 2
    step = step_on(job_dir, path)
    second = spans[1].start
    byte = spoil_at(path, second)

    with pytest.raises(FlatteningError, match=rf"big\.ndjson: line {spans[1].lines_before + 1} is not valid JSON"):
        run_step(step)
    assert not list(step.output_dir.glob("*.csv"))

    restore_at(path, second, byte)
    spoil_at(path, 0)  # the first span would fail if flattened again: it must come from its parts
    run_step(step)

    assert files_of(step.output_dir) == files_of(tmp_path / "expected")
    assert not (step.output_dir / PARTS_FOLDER).exists()
    percent, description = flattening_progress(step.job_id)  # the cached span counts as done
    done = f"flattening done: {len(spans)} / {len(spans)} pieces of 1 file, "  # the pieces are counted as pieces
    assert percent == 100 and description.startswith(done), description


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_cut_files_progress_reaches_the_job_log_and_the_progress_artifact(tmp_path, write_config, monkeypatch):
    if not processes.processes_allowed():
        pytest.skip("one core: the step does not cut files")
    monkeypatch.setattr("tasks.streams.progress.LOG_EVERY_SECONDS", 0.0)  # a line for every count the worker reports
    source = big_file(tmp_path / "in" / "big.ndjson", patients=100, filler_bytes=2 * SPAN_MIN_BYTES + MB)
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "flattening"]},
            "compression": {"enabled": False},
            "services": {"local_import": {"dir": source.parent}, "flattening": {"lookup_path": LOOKUP}},
        }
    )

    assert main(["start", str(config), str(EXAMPLE / "example-crtdl.json")]) == EXIT_OK

    job_dir = only_job_dir(tmp_path / "jobs")
    log = (job_dir / "job.log").read_text()
    count = len(file_spans(source, processes.pool_size(), SPAN_MIN_BYTES))
    for index in range(1, count + 1):
        assert re.search(rf"dupflow\.progress: .*flatten big\.ndjson#{index}/{count}: \d+ lines", log), log[-3000:]
    percent, description = flattening_progress(job_dir.name)
    done = f"flattening done: {count} / {count} pieces of 1 file, "
    assert percent == 100 and description.startswith(done), description


def test_a_zstd_file_is_cut_and_given_processes_by_its_content_not_its_compressed_size(tmp_path):
    if not processes.processes_allowed():
        pytest.skip("one core: the step does not cut files")
    path = big_file(tmp_path / "big.ndjson", patients=100, filler_bytes=2 * SPAN_MIN_BYTES + MB)
    packed = tmp_path / "big.ndjson.zst"  # as the import writes it: a stream, its content size not in the header
    packed.write_bytes(zstandard.ZstdCompressor(write_content_size=False).compress(path.read_bytes()))
    assert packed.stat().st_size < SPAN_MIN_BYTES < PROCESS_MIN_BYTES < path.stat().st_size

    assert len(file_spans(packed, 2, SPAN_MIN_BYTES)) == 2
    assert input_pays_for_processes([packed])
    assert not input_pays_for_processes([bare_file(tmp_path / "small.ndjson", group_ids())])
