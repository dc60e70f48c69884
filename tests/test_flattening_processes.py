"""Flattening in worker processes, as the step's file tasks do on a large input (``flatten_one`` in a worker, the
parts joined by ``join_parts``), gives the same bytes as in one process: the shared example, several files of TORCH
batches, bare Provenance, zstd input and routing by type; a failure in a worker names its file and leaves nothing
behind."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.flattening import plan_views
from tasks.job.flattening_outcome import FlatteningError, FlattenOutcome
from tests.flattening_runs import flatten_files
from tests.support.flattening import EXAMPLE, LOOKUP, bare_file, files_of, group_ids, torch_batches

pytestmark = pytest.mark.slow  # worker processes

MB = 1024 * 1024


def flatten(paths: list[Path], out: Path, processes_count: int) -> FlattenOutcome:
    """The CSVs of ``paths`` in ``out``: in this process (1), else each file in a worker process, as many at once."""
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    return flatten_files(paths, out, views, skipped, max_line_bytes=10 * MB, processes=processes_count)


def test_the_shared_example_is_the_expected_bytes_with_two_processes(tmp_path):
    outcome = flatten([EXAMPLE / "input" / "fhir-data.ndjson"], tmp_path / "out", 2)

    assert files_of(tmp_path / "out") == files_of(EXAMPLE / "expected")
    assert outcome.routing == "provenance" and not outcome.unrouted


def test_several_files_give_the_same_bytes_and_counts_with_one_and_with_two_processes(tmp_path):
    paths = torch_batches(tmp_path / "in", files=4, patients=60)
    paths.append(bare_file(tmp_path / "in" / "bare.ndjson", group_ids()))
    compressed = tmp_path / "in" / "batch-zstd.ndjson.zst"
    compressed.write_bytes(zstandard.ZstdCompressor().compress(paths[0].read_bytes().replace(b"pat-", b"zpat-")))
    paths.append(compressed)

    one = flatten(paths, tmp_path / "one", 1)
    two = flatten(paths, tmp_path / "two", 2)

    assert files_of(tmp_path / "one") == files_of(tmp_path / "two")
    assert one.summary() == two.summary() and one.files == two.files
    assert one.unrouted["Encounter"] > 0
    assert b"bare-1" in (tmp_path / "two" / "MII PR Person Patient (Pseudonymisiert).csv").read_bytes()
    assert b"zpat-" in (tmp_path / "two" / "Diagnosis.csv").read_bytes()


def test_without_provenance_files_are_routed_by_type_alike_in_processes(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = []
    for number in range(3):
        path = folder / f"plain-{number}.ndjson"
        path.write_bytes(
            b"".join(
                orjson.dumps({"resourceType": kind, "id": f"{kind}-{number}-{i}", "gender": "male"}) + b"\n"
                for i in range(20)
                for kind in ("Patient", "Encounter")
            )
        )
        paths.append(path)

    one = flatten(paths, tmp_path / "one", 1)
    two = flatten(paths, tmp_path / "two", 2)

    assert two.routing == "resource type" and two.unrouted == one.unrouted
    assert files_of(tmp_path / "one") == files_of(tmp_path / "two")


def test_a_bad_line_in_a_worker_names_its_file_and_leaves_no_csv_and_no_part(tmp_path):
    paths = torch_batches(tmp_path / "in", files=3, patients=5)
    with paths[1].open("ab") as out:
        out.write(b"{not json\n")

    with pytest.raises(FlatteningError, match=r"batch-0001\.ndjson: line 6 is not valid JSON"):
        flatten(paths, tmp_path / "out", 2)

    assert list((tmp_path / "out").iterdir()) == []
