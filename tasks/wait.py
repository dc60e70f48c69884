"""The ``wait`` step: a gate where the job stops so a person can inspect the data.

Note: the person may correct the data there first. See docs/development.md#steps.
"""

from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import TaskRunContext

from config.runtime import CLI, job_on_command_line
from tasks.job.contract import DataFile, StepInput, StepResult, persisted_task, settings_of
from tasks.job.layout import JobPaths, artifact_key, result_name
from tasks.streams.ndjson import DATA_SUFFIXES, FileStats, output_name
from tasks.streams.line_check import LineCounts, count_contents
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.core.names import name_from_data_problem, name_key, show_name
from tasks.core.readable import SHOW_WHOLE, counted
from tasks.sof.output import csv_data_rows


TABLE_SUFFIXES = (".csv", ".parquet")


def gate_result_path(step: StepInput, outcome: str) -> Path:
    """Return the task's ``paused`` or ``released`` result: what ``status`` reads.

    Note: a ``paused`` one also tells a later run of the job that the gate paused it.
    """
    return JobPaths(step.job_path).results / result_name(
        step.job_id, step.position, "wait", "wait", outcome
    )


def gate_result_key(context: TaskRunContext, parameters: JsonObject) -> str:
    return str(
        gate_result_path(
            parameters["step"], "paused" if parameters.get("note") is None else "released"
        )
    )


# A key, not a cache: run each time (the corrected files may change until the release).
@persisted_task("wait", "wait[{step.number}]", gate_result_key, refresh_cache=True)
def wait(step: StepInput, resume_hint: str = "", note: str | None = None) -> StepResult:
    """Hold the gate until the inspection form's ``note`` comes, then hand on files.

    Note: without the note (not released yet): prepare ``<input folder>_wait/``, say what to
    inspect, and answer "awaiting". With it: the files the gate hands on, and the note.
    """
    if note is None:
        wait_dir(step).mkdir(parents=True, exist_ok=True)
        text = inspection_text(step, resume_hint)
        get_run_logger().info("%s", text, extra=SHOW_WHOLE)
        title, *lines = text.splitlines()
        create_markdown_artifact(
            key=artifact_key(step.job_id, "inspection"),
            markdown="\n".join([f"# {title}", "", *[f"- {line.strip()}" for line in lines]]),
            description=f"Job {step.job_id}: what to inspect and how to resume",
        )
        return step.result(step.files, folder=step.input_dir).model_copy(update={"awaiting": True})
    return released_result(step).model_copy(
        update={"summary": {"inspection note": note}} if note else {}
    )


def inspection_text(step: StepInput, resume_hint: str) -> str:
    """Say what to inspect, where corrections go and how to go on.

    Note: logged whole and published as the inspection card.
    """
    return (
        f"Job {step.job_id} is paused for inspection at step {step.number} (wait).\n  Data to "
        f"inspect: {step.input_dir}\n  Corrected files go into: {wait_dir(step)}\n  When that "
        "folder holds any file on resume (each ending in "
        f"{' or '.join(correction_suffixes(step))}), the next step reads only that folder; "
        f"otherwise it reads {step.input_dir} unchanged.\n  To continue: "
        f"{resume_hint or f'{CLI} continue {job_on_command_line(step.job_path)}'}"
    )


def wait_dir(step: StepInput) -> Path:
    return step.job_path / f"{step.folder}_wait"


def released_result(step: StepInput) -> StepResult:
    """Return the corrected files of ``<input>_wait/`` if any, else the input as is.

    Note: their names become the next steps' file names, S3 keys and transfer entries.
    """
    corrected = corrected_paths(step)
    if not corrected:  # the input as it is
        return step.result(step.files, folder=step.input_dir)
    seen: dict[str, str] = {}
    for path in corrected:
        if problem := name_from_data_problem(path.name):
            raise StepError(
                f"{wait_dir(step)}: the corrected file {show_name(path.name)} {problem}; rename it"
            )
        # the next step writes one file
        if (key := name_key(output_name(path.name, compress=False))) in seen:
            raise StepError(
                f"{wait_dir(step)}: the corrected files {show_name(seen[key])} and "
                f"{show_name(path.name)} would become one file in the next step (their names "
                "differ only in suffix or case); keep one of them"
            )
        seen[key] = path.name
    max_line_bytes = settings_of(step).pipeline.max_ndjson_line_size_bytes
    files = [corrected_file(path, max_line_bytes) for path in corrected]
    get_run_logger().info(
        "continuing with %s from %s", counted(len(files), "corrected file"), wait_dir(step)
    )
    return step.result(files, folder=wait_dir(step))


def correction_suffixes(step: StepInput) -> tuple[str, ...]:
    """Return the suffixes of a corrected file: the kind the step before wrote.

    Note: the flattening's tables, else NDJSON.
    """
    if step.files and all(f.name.endswith(TABLE_SUFFIXES) for f in step.files):
        return TABLE_SUFFIXES
    return DATA_SUFFIXES


def corrected_paths(step: StepInput) -> list[Path]:
    """Return the files of ``<input>_wait/``; any other entry there is refused.

    Why: a person put it there as a correction, and it must not be passed over without a word.
    """
    folder, suffixes = wait_dir(step), correction_suffixes(step)
    if not folder.is_dir():
        return []
    corrected = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):  # a hidden file, or a temporary (``.<name>.part``)
            continue
        if not (path.is_file() and path.name.endswith(suffixes)):
            raise StepError(
                f"{folder}: {show_name(path.name)} is no corrected file the next step reads (a "
                f"file ending in {' or '.join(suffixes)}); rename it or move it out of that "
                "folder, then continue again"
            )
        corrected.append(path)
    return corrected


def corrected_file(path: Path, max_line_bytes: int) -> DataFile:
    """Return a corrected file as the next step's input, with its time of change.

    Why: a person may correct it again to the same size, and the next step must then read it anew.
    """
    found = path.stat()
    if path.name.endswith(".csv"):
        counts = LineCounts(csv_data_rows(path))
    elif path.name.endswith(".parquet"):
        # pyarrow is loaded only for a job that has Parquet
        from tasks.sof.parquet import parquet_rows

        counts = LineCounts(parquet_rows(path))
    else:
        counts = count_contents(path, max_line_bytes)
    return DataFile.written(
        path.name, FileStats(found.st_size, *counts, modified_ns=found.st_mtime_ns)
    )
