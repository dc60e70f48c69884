"""local_import's rules and error cases, driven through the step's plain functions (no Prefect run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zstandard

from tasks.job.contract import DataFile, StepInput
from tasks.local_import import (
    LocalImportError,
    file_identity,
    find_ndjson_files,
    import_file,
    scan,
    source_directory,
    target_names,
)
from tasks.streams.ndjson import LineTooLongError, NdjsonError, UnsafeNameError, is_zstd
from tests.steps import step_input


def context(tmp_path: Path, job_input: str | None = None, **settings: str) -> StepInput:
    return step_input(tmp_path / "job", "local_import", job_input=job_input, **settings)


def test_the_job_input_directory_wins_over_the_configured_one(tmp_path):
    (tmp_path / "given").mkdir()
    assert source_directory(str(tmp_path / "given"), str(tmp_path / "other")) == (tmp_path / "given").resolve()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text("{}"), "is a file, not a directory"),
    ],
)
def test_a_missing_directory_or_a_file_in_its_place_is_a_clear_error(tmp_path, make, message):
    target = tmp_path / "data"
    make(target)
    with pytest.raises(LocalImportError, match=message):
        source_directory(str(target), None)


def test_a_missing_directory_names_where_it_was_given(tmp_path):
    with pytest.raises(LocalImportError, match=r"\(services.local_import.dir\) does not exist; give the folder"):
        source_directory(None, str(tmp_path / "gone"))
    with pytest.raises(LocalImportError, match=r"\(the job input\) does not exist"):
        source_directory(str(tmp_path / "gone"), str(tmp_path))


def test_no_directory_at_all_says_where_to_give_one(tmp_path):
    with pytest.raises(LocalImportError, match="as the job input, with --dir DIR, or in services.local_import.dir"):
        source_directory(None, None)


def test_an_empty_directory_with_subdirectories_hints_at_recursive(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.ndjson").write_text("{}\n")
    with pytest.raises(LocalImportError, match="services.local_import.recursive: true"):
        find_ndjson_files(tmp_path, recursive=False, jobs_dir=tmp_path / "jobs")
    assert find_ndjson_files(tmp_path, recursive=True, jobs_dir=tmp_path / "jobs") == [
        str(tmp_path / "sub" / "a.ndjson")
    ]


def test_only_ndjson_files_are_picked_up(tmp_path):
    for name in ("a.ndjson", "b.ndjson.zst", "c.json", "notes.txt", ".hidden.ndjson"):
        (tmp_path / name).write_text("{}\n")
    assert [Path(p).name for p in find_ndjson_files(tmp_path, recursive=False, jobs_dir=tmp_path / "jobs")] == [
        "a.ndjson",
        "b.ndjson.zst",
    ]


@pytest.mark.parametrize("name", ["A.NDJSON", "b.ndjson.ZST", "c.Ndjson"])
def test_a_data_file_whose_suffix_is_not_in_lower_case_is_an_error_naming_it(tmp_path, name):
    (tmp_path / "a.ndjson").write_text("{}\n")
    (tmp_path / name).write_text("{}\n")
    with pytest.raises(LocalImportError, match=f"{tmp_path / name} is named like data but its suffix"):
        find_ndjson_files(tmp_path, recursive=False, jobs_dir=tmp_path / "jobs")


@pytest.mark.parametrize("name", ["Patient.ndjson.gz", "Condition.ndjson.zstd", "Obs.ndjson.bz2"])
def test_ndjson_compressed_otherwise_than_with_zstd_is_an_error_naming_it(tmp_path, name):
    (tmp_path / "a.ndjson").write_text("{}\n")
    (tmp_path / name).write_bytes(b"\x1f\x8b")
    with pytest.raises(LocalImportError, match=f"{tmp_path / name} is named like data of another kind: only plain"):
        find_ndjson_files(tmp_path, recursive=False, jobs_dir=tmp_path / "jobs")


def test_a_checksum_or_backup_beside_a_data_file_is_passed_over(tmp_path):
    for name in ("Patient.ndjson.zst", "Patient.ndjson.zst.sha256", "Patient.ndjson.md5", "Patient.ndjson.bak"):
        (tmp_path / name).write_text("{}\n")
    assert [Path(p).name for p in find_ndjson_files(tmp_path, recursive=False, jobs_dir=tmp_path / "jobs")] == [
        "Patient.ndjson.zst"
    ]


def test_a_symlinked_folder_in_a_recursive_scan_is_an_error_naming_it(tmp_path):
    """os.walk does not follow it: its files were left out without a word."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "Observation.ndjson").write_text("{}\n")
    (tmp_path / "in" / "2023").mkdir(parents=True)
    (tmp_path / "in" / "2023" / "Patient.ndjson").write_text("{}\n")
    (tmp_path / "in" / "2024").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LocalImportError, match=f"^{tmp_path / 'in' / '2024'} is a symbolic link to a folder, which"):
        find_ndjson_files(tmp_path / "in", recursive=True, jobs_dir=tmp_path / "jobs")
    assert scan(tmp_path / "in", recursive=False, jobs_dir=tmp_path / "jobs") == []  # not scanned at all: no folder is


def test_a_recursive_scan_passes_the_jobs_directory_over(tmp_path):
    """An import folder that holds the jobs directory: earlier jobs' imported files are no input of this one."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.ndjson").write_text("{}\n")
    (tmp_path / "jobs" / "0d3f" / "import").mkdir(parents=True)
    (tmp_path / "jobs" / "0d3f" / "import" / "a.ndjson.zst").write_text("{}\n")
    assert find_ndjson_files(tmp_path, recursive=True, jobs_dir=tmp_path / "jobs") == [
        str(tmp_path / "data" / "a.ndjson")
    ]


def test_a_recursive_scan_passes_hidden_folders_over_as_it_passes_hidden_files(tmp_path):
    for folder in (".Trash-1000", ".snapshot", "visible"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.ndjson").write_text("{}\n")
    assert find_ndjson_files(tmp_path, recursive=True, jobs_dir=tmp_path / "jobs") == [
        str(tmp_path / "visible" / "a.ndjson")
    ]


def test_two_files_that_would_get_one_name_are_refused(tmp_path):
    files = [tmp_path / "x" / "a.ndjson", tmp_path / "y" / "a.ndjson.zst"]
    with pytest.raises(LocalImportError, match="would both be imported as a.ndjson.zst"):
        target_names(files, compress=True)


def test_two_files_whose_names_differ_only_in_case_are_refused(tmp_path):
    """On a file system that ignores case (macOS, SMB, NTFS) the second would overwrite the first."""
    files = [tmp_path / "Patient.ndjson", tmp_path / "sub" / "PATIENT.ndjson", tmp_path / "patient.ndjson"]
    with pytest.raises(LocalImportError, match="would both be imported as PATIENT.ndjson .*ignores case"):
        target_names(files, compress=False)


def test_a_folder_name_with_a_control_character_is_shown_escaped(tmp_path):
    folder = tmp_path / "x\n12:00:00 INFO import finished OK\u202e"
    folder.mkdir()
    os.mkfifo(folder / "a.ndjson")
    with pytest.raises(LocalImportError) as refused:
        find_ndjson_files(tmp_path, recursive=True, jobs_dir=tmp_path / "jobs")
    message = str(refused.value)
    assert "named pipe" in message and "\\n12:00:00" in message and "\\u202e" in message
    assert "\n" not in message and "\u202e" not in message


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("a.ndjson", b'{"resourceType":"Patient"}\nnot json\n', "/a.ndjson': line 2 is not valid JSON"),
        ("b.ndjson.zst", zstandard.ZstdCompressor().compress(b"{}\n")[:-3], "/b.ndjson.zst': not readable as zstd"),
    ],
)
def test_a_folder_name_with_a_control_character_is_shown_escaped_in_the_import_s_errors_too(tmp_path, name, data, said):
    folder = tmp_path / "x\n12:00:00 INFO import finished OK\u202e"
    folder.mkdir()
    (source := folder / name).write_bytes(data)
    with pytest.raises(NdjsonError) as refused:
        import_file(context(tmp_path), str(source), name, file_identity(source))
    message = str(refused.value)
    assert said in message and "\\n12:00:00" in message and "\\u202e" in message
    assert "\n" not in message and "\u202e" not in message


def test_a_source_that_changes_while_it_is_imported_fails_naming_it_and_leaves_nothing(tmp_path):
    """An export still being written was imported as whatever part of it existed, and a file that kept growing never
    ended: the source is checked against the size and time of change the scan found (every 16 MB copied, and at the
    end, as here)."""
    source = tmp_path / "Observation.ndjson"
    source.write_bytes(b'{"resourceType":"Observation"}\n' * 1000)
    scanned = file_identity(source)
    with source.open("ab") as still_written:
        still_written.write(b'{"resourceType":"Observation"}\n')
    ctx = context(tmp_path, **{"compression.enabled": "false"})
    with pytest.raises(LocalImportError) as refused:
        import_file(ctx, str(source), "Observation.ndjson", scanned)
    assert str(refused.value) == (
        f"{source} changed while it was imported (31,000 bytes when the step began, 31,031 now, written again since); "
        "wait until whatever writes it has finished, then continue the job"
    )
    assert list(ctx.output_dir.iterdir()) == []


def test_a_file_name_that_is_not_utf_8_is_refused_before_anything_is_copied(tmp_path):
    """A Latin-1 name (``P\xe4tient``) could never be stored in the job's record."""
    name = os.fsdecode(b"P\xe4tient.ndjson")
    with pytest.raises(UnsafeNameError, match=r"'P\\udce4tient.ndjson.zst' is not valid UTF-8"):
        target_names([tmp_path / name], compress=True)


def test_plain_input_is_compressed_and_counted(tmp_path):
    source = tmp_path / "a.ndjson"
    source.write_bytes(b'{"resourceType":"Patient","id":"1"}\n\n{"resourceType":"Patient","id":"2"}\n')
    ctx = context(tmp_path, **{"compression.level": "best"})
    record = import_file(ctx, str(source), "a.ndjson.zst", file_identity(source))
    found = (ctx.output_dir / "a.ndjson.zst").stat()
    assert record == DataFile(
        name="a.ndjson.zst", size=found.st_size, resources=2, bundles=0, modified_ns=found.st_mtime_ns
    )
    assert is_zstd(ctx.output_dir / "a.ndjson.zst")


def test_zstd_input_is_written_plain_when_compression_is_off(tmp_path):
    source = tmp_path / "a.ndjson"  # zstd content under a plain name: recognised by magic bytes
    source.write_bytes(zstandard.ZstdCompressor().compress(b'{"resourceType":"Patient","id":"1"}\n'))
    ctx = context(tmp_path, **{"compression.enabled": "false"})
    import_file(ctx, str(source), "a.ndjson", file_identity(source))
    assert (ctx.output_dir / "a.ndjson").read_bytes() == b'{"resourceType":"Patient","id":"1"}\n'


def test_a_line_over_the_limit_names_file_line_and_key_and_leaves_nothing(tmp_path):
    source = tmp_path / "big.ndjson"
    source.write_bytes(b'{"resourceType":"Patient"}\n{"resourceType":"Patient"}\n' + b"x" * (1024 * 1024 + 1) + b"\n")
    ctx = context(tmp_path, **{"pipeline.max_ndjson_line_size_mb": "1"})
    with pytest.raises(LineTooLongError) as error:
        import_file(ctx, str(source), "big.ndjson.zst", file_identity(source))
    assert str(error.value).startswith(f"{source}: line 3 ")
    assert "pipeline.max_ndjson_line_size_mb" in str(error.value)
    assert list(ctx.output_dir.iterdir()) == []


def test_unreadable_zstd_is_a_clear_error_and_leaves_nothing(tmp_path):
    source = tmp_path / "bad.ndjson.zst"
    source.write_bytes(b"\x28\xb5\x2f\xfd" + b"not really zstd")
    ctx = context(tmp_path)
    with pytest.raises(NdjsonError, match="bad.ndjson.zst: not readable as zstd"):
        import_file(ctx, str(source), "bad.ndjson.zst", file_identity(source))
    assert list(ctx.output_dir.iterdir()) == []
