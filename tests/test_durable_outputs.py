"""Every file the flattening renames into place as finished is on the disk before its rename, as the NDJSON writer's
are: a power cut after the rename must not leave a CSV or Parquet file that looks finished and is half-written.

``os.fsync`` is the system's, recorded here and then called: the path an fsync'd descriptor points to at that moment
is its temporary name only when the sync came before the rename."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tasks.flattening import GroupCsv, plan_views
from tasks.sof.parquet import write_parquet
from tasks.streams.files import write_file_atomically
from tests.flattening_runs import flatten_files
from tests.support.flattening import EXAMPLE, LOOKUP, files_of
from tests.support.parquet import COLUMNS, ROWS, TYPED_VIEW, write_csv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The paths of the files ``os.fsync`` was called on, in order (the real ``os.fsync`` runs as well)."""
    paths: list[str] = []
    system_fsync = os.fsync

    def recorded(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        system_fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    return paths


def test_the_joined_csvs_are_synced_under_their_temporary_names(tmp_path, synced):
    out = tmp_path / "out"
    views, skipped = plan_views(EXAMPLE / "example-crtdl.json", LOOKUP)
    flatten_files([EXAMPLE / "input" / "fhir-data.ndjson"], out, views, skipped, max_line_bytes=1 << 20)

    names = sorted(files_of(out))
    assert names and names == sorted(files_of(EXAMPLE / "expected"))
    assert sorted(Path(path).name for path in synced) == [f".{name}.part" for name in names]


def test_a_csv_of_the_flattening_service_is_synced_before_its_rename(tmp_path, synced):
    csv = GroupCsv(tmp_path, "Patient.csv", ["id", "gender"])
    csv.write([("p1", "female"), ("p2", None)])
    assert csv.finish().resources == 2

    assert synced == [str(tmp_path / ".Patient.csv.part")]
    assert (tmp_path / "Patient.csv").read_text(encoding="utf-8") == "id,gender\np1,female\np2,\n"


def test_a_parquet_file_is_synced_before_its_rename(tmp_path, synced):
    source = write_csv(tmp_path / "rows.csv", COLUMNS, ROWS)
    assert write_parquet(source, TYPED_VIEW, tmp_path / "rows.parquet") == len(ROWS)

    assert synced == [str(tmp_path / ".rows.parquet.part")]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_a_job_file_interrupted_before_its_rename_leaves_no_temporary_file(tmp_path, monkeypatch, interruption):
    """Ctrl+C or SIGTERM (Prefect's handler raises) while a small job file was synced left its ``.part`` behind."""

    def interrupted(fd: int) -> None:
        raise interruption

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(interruption):
        write_file_atomically(tmp_path / "job.json", b"{}\n")
    assert list(tmp_path.iterdir()) == []
