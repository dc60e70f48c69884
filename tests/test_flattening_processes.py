"""Flattening in worker processes, as the step's file tasks do on a large input (``flatten_one`` in a worker, the
parts joined by ``join_parts``), gives the same bytes as in one process: the shared example, several files of TORCH
batches, bare Provenance, zstd input and routing by type; a failure in a worker names its file and leaves nothing
behind."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.streams import processes
from tasks.flattening import (
    FlattenOutcome,
    FlatteningError,
    plan_views,
)
from tests.benchmarks.bench_flattening import GROUP_SYSTEM, patient_bundle
from tests.conftest import TESTDATA
from tests.flattening_runs import flatten_files

pytestmark = pytest.mark.slow  # worker processes

EXAMPLE = TESTDATA / "flattening" / "example"
LOOKUP = TESTDATA / "flattening" / "flatten-lookup.json"
MB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def pool():
    yield
    processes.shutdown_pool()


def flatten(paths: list[Path], out: Path, processes_count: int) -> FlattenOutcome:
    """The CSVs of ``paths`` in ``out``: in this process (1), else each file in a worker process, as many at once."""
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    return flatten_files(paths, out, views, skipped, max_line_bytes=10 * MB, processes=processes_count)


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def group_ids() -> dict[str, str]:
    crtdl = orjson.loads((EXAMPLE / "example-crtdl.json").read_bytes())
    ids = [g["id"] for g in crtdl["dataExtraction"]["attributeGroups"]]
    return dict(zip(("Patient", "Condition", "Procedure"), ids, strict=True))


def torch_batches(folder: Path, files: int, patients: int, seed: int = 5) -> list[Path]:
    rng, groups, paths = random.Random(seed), group_ids(), []
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        lines = b"".join(orjson.dumps(patient_bundle(rng, number * 1000 + i, groups)) + b"\n" for i in range(patients))
        path = folder / f"batch-{number:04d}.ndjson"
        path.write_bytes(lines)
        paths.append(path)
    return paths


def bare_file(path: Path, groups: dict[str, str]) -> Path:
    """Bare resources routed by bare Provenance lines of the same file (one resource in two groups)."""
    resources = [
        {"resourceType": "Patient", "id": "bare-1", "gender": "female", "birthDate": "1970-01-01"},
        {"resourceType": "Condition", "id": "bare-c", "subject": {"reference": "Patient/bare-1"}},
        {"resourceType": "Encounter", "id": "bare-e", "subject": {"reference": "Patient/bare-1"}},
    ]
    provenance = {
        "resourceType": "Provenance",
        "id": "bare-prov",
        "target": [{"reference": "Patient/bare-1"}, {"reference": "Condition/bare-c"}],
        "entity": [
            {"what": {"identifier": {"system": GROUP_SYSTEM, "value": groups["Patient"]}}},
            {"what": {"identifier": {"system": GROUP_SYSTEM, "value": groups["Condition"]}}},
        ],
    }
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*resources, provenance]))
    return path


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
