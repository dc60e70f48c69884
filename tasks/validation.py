"""The ``validation`` step: every resource through ``/validateResource``.

See docs/development.md#steps.
"""

import logging
from pathlib import Path

import orjson
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from pydantic import BaseModel

from config.settings import Settings
from tasks.clients.errors import BODY_LIMIT, ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.bounds import MB
from tasks.clients.validator import (
    REQUEST_DEADLINE,
    Chunk,
    ValidationServiceError,
    Validator,
    annotated,
    iter_chunks,
    read_findings,
)
from tasks.job.contract import DataFile, StepInput, StepResult, batch_task, settings_of, step_task
from tasks.job.filework import FileToDo, map_batches
from tasks.core.errors import DupflowError, StepError
from tasks.core.json_shapes import JsonObject
from tasks.job.steps import ndjson_written, publish_report, write_answers
from tasks.streams.ndjson import CompressionLevel, iter_lines, output_name

FIRST_ERRORS = 5
"""Error messages kept per file for the step's summary and artifact."""
REPORT_LINE_LIMIT = 1 << 30
"""Report lines hold a whole chunk's OperationOutcome; the NDJSON line limit is for input
resources."""
TOO_LARGE_HINT = (
    "the chunk was larger than the validation service accepts: lower "
    f"services.validation.bundle_chunk_size_mb, or raise {BODY_LIMIT}"
)
ALONE_TOO_LARGE_HINT = (
    "the chunk held this one resource, larger than the validation service accepts (a smaller "
    f"services.validation.bundle_chunk_size_mb cannot help): raise {BODY_LIMIT}"
)

stdlib_logger = logging.getLogger("dupflow.validation")


class FileValidation(BaseModel):
    """What the validation of one file found, counted over its chunks, and its report."""

    file: str
    report: DataFile
    resources: int = 0
    chunks: int = 0
    resources_with_errors: int = 0
    errors: int = 0
    warnings: int = 0
    information: int = 0
    first_errors: list[str] = []

    def add(self, chunk: Chunk, outcome: JsonObject) -> None:
        findings = read_findings(outcome, chunk.labels, FIRST_ERRORS - len(self.first_errors))
        self.resources += len(chunk.labels)
        self.chunks += 1
        self.resources_with_errors += len(findings.resources_with_errors)
        self.errors += findings.errors
        self.warnings += findings.warnings
        self.information += findings.information
        self.first_errors += [finding.describe() for finding in findings.findings]


@step_task("validation")
def validation(step: StepInput) -> StepResult:
    settings = settings_of(step)
    service = settings.services.validation
    if not service.url:
        raise StepError(
            "services.validation.url is not set; the validation step needs the validator's root URL"
        )
    files = [
        FileToDo(f.name, f.size, (f.name, service.bundle_chunk_size_mb, f.resources), f)
        for f in step.input_files()
    ]
    checked: list[FileValidation] = map_batches(validate_files, step, files)
    per_file = [c.model_dump(exclude={"report"}) for c in checked]
    rows = [  # the counts' names in words, in field order
        {
            **{key.replace("_", " "): value for key, value in counts.items()},
            "first errors": "; ".join(c.first_errors),
            "report": f"{step.output_dir.name}/{c.report.name}",
        }
        for counts, c in zip(per_file, checked, strict=True)
    ]
    publish_report(step, rows, f"findings per file; reports in `{step.output_dir}`")
    if service.fail_on_error and any(c.errors for c in checked):
        raise StepError(failure_message(step.output_dir, checked))
    totals = {
        k: sum(f[k] for f in per_file)
        for k in ("resources", "resources_with_errors", "errors", "warnings")
    }
    return step.result(
        [c.report for c in checked], per_file=per_file, **totals, reports=str(step.output_dir)
    )


def validate_file(
    step: StepInput, name: str, chunk_size_mb: int, expected: int | None
) -> FileValidation:
    """Validate one input file.

    Why: ``chunk_size_mb`` is a parameter: it shapes the report. ``expected``: the file's lines, for
    progress.
    """
    settings = settings_of(step)
    dest = step.output_dir / output_name(name, settings.compression.enabled)
    return validate_with_service(settings, step.input_path(name), dest, chunk_size_mb, expected)


validate_files = batch_task("validate-files", "validate", validate_file)


def validate_with_service(
    settings: Settings, source: Path, dest: Path, chunk_size_mb: int, expected_resources: int | None
) -> FileValidation:
    service = settings.services.validation
    assert service.url is not None
    endpoint = ServiceEndpoint(
        "validation",
        service.url,
        None,
        REQUEST_DEADLINE,  # a read waits as long as the whole chunk may take
        service.max_concurrent_requests,
        setting="services.validation.url",
    )
    with ServiceClient(endpoint, settings.tls, settings.retry) as client:
        return validate_path(
            source,
            dest,
            Validator(client),
            chunk_bytes=chunk_size_mb * MB,
            concurrency=service.max_concurrent_requests,
            **ndjson_written(settings),
            expected_resources=expected_resources,
        )


def validate_path(
    source: Path,
    dest: Path,
    validator: Validator,
    *,
    chunk_bytes: int,
    concurrency: int,
    level: CompressionLevel | None,
    max_line_bytes: int,
    expected_resources: int | None = None,
) -> FileValidation:
    """Validate ``source`` chunk by chunk into the report ``dest``.

    Note: ``concurrency`` chunks are in flight.
    """
    # until written
    found = FileValidation(file=source.name, report=DataFile(name=dest.name, size=0, resources=0))

    def validate(chunk: Chunk) -> JsonObject:
        if chunk.oversized:
            warn_oversized(chunk, source)
        try:
            return validator.validate(chunk, source.name)
        except (ServiceError, ValidationServiceError) as exc:
            raise StepError(chunk_failure(source, chunk, exc)) from exc

    def written(chunk: Chunk, outcome: JsonObject) -> tuple[bytes, int]:
        found.add(chunk, outcome)
        return orjson.dumps(annotated(outcome, chunk)), len(chunk.labels)

    stats = write_answers(
        iter_chunks(iter_lines(source, max_line_bytes), chunk_bytes, source),
        validate,
        written,
        dest,
        workers=concurrency,
        window=concurrency,
        level=level,
        line_limit=REPORT_LINE_LIMIT,
        progress=(f"validate {source.name}", expected_resources),
        source=str(dest),
    )
    found.report = DataFile.written(dest.name, stats)
    return found


def chunk_failure(source: Path, chunk: Chunk, exc: DupflowError) -> str:
    """Return a failed chunk's message: its resources, the failure, for a 413 the fix."""
    held = chunk.labels[0] if len(chunk.labels) == 1 else f"{chunk.labels[0]} … {chunk.labels[-1]}"
    message = (
        f"{source}: validation of chunk {chunk.number} ({len(chunk.labels)} resources: {held}) "
        f"failed: {exc}; this is a failure of the validation service, not a finding in the data"
    )
    if exc.status_code == 413:
        message += f"; {ALONE_TOO_LARGE_HINT if len(chunk.labels) == 1 else TOO_LARGE_HINT}"
    return message


def warn_oversized(chunk: Chunk, source: Path) -> None:
    """Warn that ``chunk`` holds one resource larger than a chunk, as it is sent.

    Why: in the task run's log inside Prefect (else a plain logger), so the warning reaches it.
    """
    try:
        logger = get_run_logger()
    except MissingContextError:
        logger = stdlib_logger
    logger.warning(
        "%s: %s is %.1f MB, larger than services.validation.bundle_chunk_size_mb; it is sent "
        "alone in chunk %d",
        source.name,
        chunk.labels[0],
        len(chunk.body) / MB,
        chunk.number,
    )


def failure_message(folder: Path, checked: list[FileValidation]) -> str:
    per_file = "; ".join(
        f"{c.file}: {c.resources_with_errors} of {c.resources} resources with errors ({c.errors} "
        "errors)"
        for c in checked
        if c.errors
    )
    return (
        f"validation found data-quality errors: {per_file}. Reports (one NDJSON of "
        f"OperationOutcomes per input file) are in {folder}. Fix the data, or set "
        "services.validation.fail_on_error: false to go on despite them"
    )
