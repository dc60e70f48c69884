"""The ``local_import`` step: copy NDJSON files from a local folder to ``import/``.

See docs/development.md#steps.
"""

import errno
import os
import stat
from pathlib import Path
from typing import Any

from config.settings import Settings
from tasks.job.contract import (
    DataFile,
    DataFiles,
    StepInput,
    StepResult,
    each_file,
    file_task,
    settings_of,
    step_task,
)
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.core.names import name_key, show_text
from tasks.streams.fanout import raise_if_cancelled, results_or_raise
from tasks.job.filework import FileToDo, run_batches
from tasks.job.steps import compression_shape, ndjson_written
from tasks.job.layout import is_crtdl_file
from tasks.streams.ndjson import DATA_SUFFIXES, output_name
from tasks.streams.ndjson_writer import AtomicNdjsonWriter
from tasks.streams.processes import worker_pool
from tasks.streams.progress import track


# NDJSON compressed otherwise than with zstd: named like data, never read (a checksum or backup
# beside a file is no data: Patient.ndjson.zst.sha256, Patient.ndjson.bak).
COMPRESSED_SUFFIXES = (
    ".gz",
    ".gzip",
    ".bz2",
    ".xz",
    ".lzma",
    ".zstd",
    ".lz4",
    ".br",
    ".zip",
    ".7z",
)
FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
}
CHANGE_CHECK_BYTES = 16 << 20
"""How much is copied between two checks that the source is as the scan found it (one stat each)."""


class LocalImportError(StepError):
    """Bad import input; the message says what is wrong and what to do."""


@step_task("local_import")
def local_import(step: StepInput) -> StepResult:
    settings = settings_of(step)
    source = source_directory(step.job_input, settings.services.local_import.dir)
    to_do = files_to_do(source, settings, step.job_path.parent)
    with worker_pool():  # the line checks of the step's large plain files share its workers
        batches = run_batches(import_files, step, to_do, os.cpu_count() or 1)
    imported = [file for batch in results_or_raise(batches) for file in batch.files]
    return step.result(imported, source=str(source))


def files_to_do(source: Path, settings: Settings, jobs_dir: Path) -> list[FileToDo]:
    """Return each data file of ``source`` to import, by target name, path as text.

    Why: the ``Path``s and lists kept beside were 0.5 KB a file of the flow peak while batches ran.
    """
    files = find_ndjson_files(source, settings.services.local_import.recursive, jobs_dir)
    targets = target_names(files, compress=settings.compression.enabled)
    found = zip(targets, (file_identity(path) for path in files), strict=True)
    return [FileToDo(name, each[1], (each[0], name, each)) for name, each in found]


def import_file(step: StepInput, source: str, name: str, identity: list[Any]) -> DataFile:
    """Copy one file into ``import/<name>``.

    Note: ``identity`` (path, size, mtime) makes a changed source a new file.
    """
    # a folder's name may hold a line break
    source_path, shown = Path(source), show_text(source, None)
    size = identity[1]
    written = ndjson_written(settings_of(step))
    hint = None if source.endswith(".zst") else size  # a zstd file's data are larger than its size
    with track(f"import {source_path.name}", size) as progress:
        with AtomicNdjsonWriter(
            step.output_dir / name,
            source=shown,
            expected_size=size,
            size_hint=hint,
            **written,
        ) as writer:
            unchecked = 0
            for copied in writer.copy(source_path):
                raise_if_cancelled()
                progress.advance(copied)
                # a file that keeps growing never ends
                if (unchecked := unchecked + copied) >= CHANGE_CHECK_BYTES:
                    refuse_a_changed_source(source_path, identity)
                    unchecked = 0
            refuse_a_changed_source(source_path, identity)
    assert writer.stats is not None
    return DataFile.written(name, writer.stats)


def import_file_batch(step: StepInput, label: str, files: list[tuple[Any, ...]]) -> DataFiles:
    """A batch of ``import_file``, its files written as columns (``FileColumns``)."""
    return DataFiles(files=each_file(import_file, step, files))


import_files = file_task("import-files", "import[{label}]")(import_file_batch)


def refuse_a_changed_source(path: Path, identity: list[Any]) -> None:
    """Refuse a source whose size or time of change differ from what the scan found.

    Why: a file still being written (an export not finished) would be imported as whatever part of
    it exists.
    """
    found = path.stat()
    if [found.st_size, found.st_mtime_ns] != identity[1:]:
        raise LocalImportError(
            f"{show_text(path, None)} changed while it was imported ({identity[1]:,} bytes when "
            f"the step began, {found.st_size:,} now, written again since); wait until whatever "
            "writes it has finished, then continue the job"
        )


def source_directory(job_input: str | None, configured_dir: str | None) -> Path:
    """Return the job input, unless it is the job's CRTDL; else the configured folder.

    Note: the folder is ``services.local_import.dir`` (``--dir``).
    """
    configured = job_input if job_input and not is_crtdl_file(job_input) else configured_dir
    if not configured:
        raise LocalImportError(
            "local_import has no directory: give the folder that holds the .ndjson files as the "
            "job input, with --dir DIR, or in services.local_import.dir"
        )
    source = Path(configured).expanduser()
    if configured == configured_dir:
        given_as, how = (
            "services.local_import.dir",
            "with --dir DIR or in services.local_import.dir",
        )
    else:
        given_as, how = "the job input", "as the job input"
    if not source.is_dir():
        if source.exists():
            problem = "is a file, not a directory; give the folder that holds it"
        else:
            problem = "does not exist; give the folder that holds the .ndjson files"
        raise LocalImportError(f"import directory {source} ({given_as}) {problem} {how}")
    return source.resolve()


def find_ndjson_files(source: Path, recursive: bool, jobs_dir: Path) -> list[str]:
    """``scan``'s paths as text, in the order of their parts (the separator first).

    Why: a ``Path`` each (its parts, its text) was 0.4 KB a file of the flow's memory.
    """
    if files := sorted(scan(source, recursive, jobs_dir), key=lambda path: path.replace("/", "\0")):
        return files
    hint = ""
    if not recursive and any(p.is_dir() for p in source.iterdir()):
        hint = "; it has subdirectories: set services.local_import.recursive: true to scan them"
    raise LocalImportError(f"no .ndjson or .ndjson.zst files in {source}{hint}")


def scan(source: Path, recursive: bool, jobs_dir: Path) -> list[str]:
    """Find every data file of ``source`` (and its subdirectories).

    Why: ``jobs_dir`` is passed over: an import folder that holds it would import earlier jobs'
    files again.
    """
    skipped = jobs_dir.resolve()

    def unreadable(exc: OSError) -> None:
        raise LocalImportError(
            f"cannot read directory {show_text(exc.filename, None)}: {exc.strerror}; fix its "
            "permissions or remove it from the import"
        )

    files = []
    for folder, subfolders, names in os.walk(source, onerror=unreadable):
        for name in [*names, *subfolders]:
            if is_data_name(name):
                files.append(check_data_file(os.path.join(folder, name)))
            else:
                refuse_data_left_out(Path(folder, name))
        subfolders[:] = [  # hidden ones as hidden files
            name
            for name in subfolders
            if recursive and not name.startswith(".") and Path(folder, name).resolve() != skipped
        ]
        for name in subfolders:
            if os.path.islink(path := Path(folder, name)):  # os.walk does not follow it
                raise LocalImportError(
                    f"{show_text(path, None)} is a symbolic link to a folder, which the recursive "
                    "scan does not follow; import the folder it points to, or copy its files in"
                )
    return files


def refuse_data_left_out(path: Path) -> None:
    """Refuse a file that looks like data and would be left out without a word.

    Note: a suffix in upper case, or NDJSON compressed otherwise than with zstd.
    """
    lower = path.name.lower()
    if path.name.startswith("."):
        return
    if is_data_name(lower):
        raise LocalImportError(
            f"{show_text(path, None)} is named like data but its suffix is not in lower case; "
            "rename it to end in .ndjson or .ndjson.zst, or move it out of the import folder"
        )
    if lower.endswith(COMPRESSED_SUFFIXES) and ".ndjson." in lower:
        raise LocalImportError(
            f"{show_text(path, None)} is named like data of another kind: only plain NDJSON "
            "(.ndjson) and zstd (.ndjson.zst) are read; decompress it, or compress it with zstd "
            "as .ndjson.zst, or move it out of the import folder"
        )


def is_data_name(name: str) -> bool:
    return name.endswith(DATA_SUFFIXES) and not name.startswith(".")


def check_data_file(path: str) -> str:
    """Return ``path``, named like data, if a regular file this process may read.

    Note: else an error naming it.
    Why: only its status is read: opening a named pipe would block.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        problem = _stat_problem(path, exc)
        raise LocalImportError(
            f"cannot read {show_text(path, None)}: {problem}; fix or remove it"
        ) from None
    if not stat.S_ISREG(mode):
        kind = FILE_KINDS.get(stat.S_IFMT(mode), "a device")
        raise LocalImportError(
            f"{show_text(path, None)} is {kind}, not a file, although its name says data; remove "
            "it from the import folder or rename it"
        )
    if not os.access(path, os.R_OK):
        raise LocalImportError(
            f"cannot read file {show_text(path, None)}: permission denied; fix its permissions"
        )
    return path


def _stat_problem(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a loop of symbolic links"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"it is a symbolic link to {os.readlink(path)}, which does not exist"
    return exc.strerror or type(exc).__name__


def target_names(files: list[str], compress: bool) -> list[str]:
    """Name the files in ``import/``; two sources on one name are an error."""
    names = [output_name(os.path.basename(path), compress) for path in files]
    seen: dict[str, str] = {}  # the source of each name's key
    for name, path in zip(names, files, strict=True):
        if (key := name_key(name)) in seen:
            first, second = show_text(seen[key], None), show_text(path, None)
            raise LocalImportError(
                f"{first} and {second} would both be imported as {name} (a file system that "
                "ignores case takes them for one file); rename one of them"
            )
        seen[key] = path
    return names


def file_identity(path: str) -> list[Any]:
    """What makes a source file the same file on a re-run."""
    found = os.stat(path)
    return [path, found.st_size, found.st_mtime_ns]


def shaped_settings(settings: Settings) -> JsonObject:
    """Return what the step's files depend on besides its input.

    Note: the folder, whether it is read recursively, compression.
    """
    folder = settings.services.local_import
    return {"dir": folder.dir, "recursive": folder.recursive, **compression_shape(settings)}
