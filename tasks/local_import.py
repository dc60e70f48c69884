"""The ``local_import`` step: copy NDJSON files from a local directory into the job's ``import/``.

Source: a directory given as the job input, else ``services.local_import.dir`` (which ``--dir``
overrides). ``.ndjson`` and ``.ndjson.zst`` files are picked up (zstd is recognised by its magic
bytes, whatever the name says), recompressed at the configured level or written plain, and counted.
Each file is its own cached task, so a resumed job copies only the files not finished before.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tasks.context import FileRecord, StepContext, StepOutput
from tasks.ndjson import AtomicNdjsonWriter, DATA_SUFFIXES, iter_chunks, output_name, remove_partial_files
from tasks.progress import track


class LocalImportError(Exception):
    """Bad import input; the message says what is wrong and what to do."""


@task(name="local_import")
def local_import(ctx: StepContext, previous: StepOutput | None = None) -> StepOutput:
    source = source_directory(ctx)
    files = find_ndjson_files(source, ctx.settings.services.local_import.recursive)
    targets = target_names(files, compress=ctx.compression_level is not None)
    remove_partial_files(ctx.folder)
    records = [
        ctx.run_cached(import_file, "file", file_identity(path), ctx, path, ctx.folder / name, f"{i}/{len(files)}")
        for i, (path, name) in enumerate(zip(files, targets, strict=True), start=1)
    ]
    return ctx.output(records, source=str(source))


@task(name="import-file")
def import_file(ctx: StepContext, source: Path, dest: Path, counter: str = "") -> FileRecord:
    """Copy one file; ``counter`` (``2/5``) tells the progress display which file of how many this is."""
    with track(f"import {counter} {source.name}".replace("  ", " "), source.stat().st_size) as progress:
        with AtomicNdjsonWriter(dest, ctx.compression_level, ctx.max_line_bytes, source=str(source)) as writer:
            for chunk in iter_chunks(source):
                writer.write(chunk)
                progress.advance(len(chunk))
    assert writer.stats is not None
    return FileRecord(name=dest.name, size=writer.stats.size, resources=writer.stats.resources)


def source_directory(ctx: StepContext) -> Path:
    configured = ctx.job_input or ctx.settings.services.local_import.dir
    if not configured:
        raise LocalImportError(
            "local_import has no directory: give one as the job input, with --dir, or set services.local_import.dir"
        )
    source = Path(configured).expanduser()
    if not source.exists():
        raise LocalImportError(f"import directory {source} does not exist")
    if not source.is_dir():
        raise LocalImportError(f"import directory {source} is a file, not a directory; give the folder that holds it")
    return source.resolve()


def find_ndjson_files(source: Path, recursive: bool) -> list[Path]:
    candidates = source.rglob("*") if recursive else source.iterdir()
    files = sorted(
        p for p in candidates if p.is_file() and p.name.endswith(DATA_SUFFIXES) and not p.name.startswith(".")
    )
    if files:
        return files
    hint = ""
    if not recursive and any(p.is_dir() for p in source.iterdir()):
        hint = "; it has subdirectories: set services.local_import.recursive: true to scan them"
    raise LocalImportError(f"no .ndjson or .ndjson.zst files in {source}{hint}")


def target_names(files: list[Path], compress: bool) -> list[str]:
    """Names in ``import/``; two sources that would land on one name are an error, never an overwrite."""
    seen: dict[str, Path] = {}
    for path in files:
        name = output_name(path.name, compress)
        if name in seen:
            raise LocalImportError(f"{seen[name]} and {path} would both be imported as {name}; rename one of them")
        seen[name] = path
    return list(seen)


def file_identity(path: Path) -> list:
    """What makes a source file the same file on a re-run: its path, size and modification time."""
    stat = path.stat()
    return [str(path), stat.st_size, stat.st_mtime_ns]
