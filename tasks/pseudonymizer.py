"""The ``pseudonymizer`` step: every resource through the ``$de-identify`` service.

Note: the resources of the previous step's files. See docs/development.md#steps.
"""

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from config.settings import Settings
from tasks.clients.errors import BODY_LIMIT, ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.pseudonymizer import (
    CONFIG_KEY,
    AnonymizationConfig,
    PseudonymizationError,
    Pseudonymized,
    Pseudonymizer,
    resource_label,
)
from tasks.core.errors import StepError
from tasks.core.json_shapes import JsonObject
from tasks.core.jsonfile import JsonFileError
from tasks.core.kept import KeptByDigest
from tasks.job.contract import DataFile, StepInput, StepResult, batch_task, settings_of, step_task
from tasks.job.filework import FileToDo, map_batches
from tasks.job.steps import (
    compression_shape,
    file_shape,
    ndjson_written,
    publish_report,
    write_answers,
)
from tasks.streams.ndjson import (
    CompressionLevel,
    FileStats,
    iter_lines,
    output_name,
    parse_resource,
)

TOO_LARGE_HINT = (
    "the request was larger than the pseudonymization service accepts: lower "
    "services.pseudonymizer.bundle_split_threshold_mb so that Bundles are sent in smaller "
    f"chunks, or raise {BODY_LIMIT}"
)
# the step's, for its file tasks
_configs_by_digest: KeptByDigest[AnonymizationConfig] = KeptByDigest()


class FileReport(TypedDict):
    file: str
    resources_in: int
    resources_out: int
    bundles_split: int
    requests: int
    seconds: float


@dataclass
class FileCounts:
    written: FileStats = FileStats(size=0, resources=0)
    resources_in: int = 0
    resources_out: int = 0
    requests: int = 0
    bundles_split: int = 0


class FileResult(TypedDict):
    file: DataFile
    report: FileReport


@step_task("pseudonymizer")
def pseudonymizer(step: StepInput) -> StepResult:
    settings = settings_of(step)
    config = read_anonymization_config(settings.services.pseudonymizer.anonymization_config)
    config_digest, compress = config.sha256 if config else None, settings.compression.enabled
    files = [
        FileToDo(
            f.name, f.size, (f.name, output_name(f.name, compress), f.resources, config_digest), f
        )
        for f in step.input_files()
    ]
    results: list[FileResult] = map_batches(pseudonymize_files, step, files)
    reports = [result["report"] for result in results]
    # else in words
    titles = {"resources_in": "lines in", "resources_out": "lines out", "seconds": "duration (s)"}
    rows = [
        {titles.get(key, key.replace("_", " ")): value for key, value in r.items()} for r in reports
    ]
    publish_report(step, rows, "lines, split Bundles and requests per file")
    return step.result(
        [result["file"] for result in results],
        anonymization_config=config.path if config else "the service's own",
        requests=sum(r["requests"] for r in reports),
        bundles_split=sum(r["bundles_split"] for r in reports),
    )


def pseudonymize_file(
    step: StepInput, source_name: str, name: str, expected_resources: int, config_digest: str | None
) -> FileResult:
    """De-identify one file.

    Why: ``config_digest`` (the SHA-256 of the YAML the step read) makes a changed anonymization
    config a new result.
    """
    settings = settings_of(step)
    config = anonymization_config(
        settings.services.pseudonymizer.anonymization_config, config_digest
    )
    source = step.input_path(source_name)
    started = time.monotonic()
    dest = step.output_dir / name
    counts = pseudonymize_with_service(settings, source, dest, config, expected_resources)
    report = FileReport(
        file=source.name,
        resources_in=counts.resources_in,
        resources_out=counts.resources_out,
        bundles_split=counts.bundles_split,
        requests=counts.requests,
        seconds=round(time.monotonic() - started, 3),
    )
    return FileResult(file=DataFile.written(name, counts.written), report=report)


pseudonymize_files = batch_task("pseudonymize-files", "pseudonymize", pseudonymize_file)


def pseudonymize_with_service(
    settings: Settings,
    source: Path,
    dest: Path,
    config: AnonymizationConfig | None,
    expected_resources: int | None,
) -> FileCounts:
    configured = settings.services.pseudonymizer
    assert configured.url, "Settings require services.pseudonymizer.url for the step"
    endpoint = ServiceEndpoint(
        "pseudonymizer",
        configured.url,
        configured.auth,
        configured.timeout,
        configured.max_concurrent_requests,
        setting="services.pseudonymizer.url",
    )
    with ServiceClient(endpoint, settings.tls, settings.retry) as client:
        service = Pseudonymizer(
            client,
            config=config,
            split_threshold_mb=configured.bundle_split_threshold_mb,
            max_answer_bytes=settings.pipeline.max_ndjson_line_size_bytes,
        )
        return pseudonymize_path(
            source,
            dest,
            service,
            **ndjson_written(settings),
            concurrency=configured.max_concurrent_requests,
            expected_resources=expected_resources,
        )


def pseudonymize_path(
    source: Path,
    dest: Path,
    service: Pseudonymizer,
    *,
    level: CompressionLevel | None,
    max_line_bytes: int,
    concurrency: int,
    expected_resources: int | None = None,
) -> FileCounts:
    """De-identify ``source`` into ``dest`` in input order.

    Note: ``concurrency`` requests are in flight.
    """
    counts = FileCounts()

    def resources() -> Iterator[tuple[int, bytes, JsonObject]]:
        for line_number, line in iter_lines(source, max_line_bytes):
            yield line_number, line, parse_resource(source, line_number, line)
            counts.resources_in += 1

    def written(_: Any, result: Pseudonymized) -> tuple[bytes, int]:
        counts.requests += result.requests
        counts.bundles_split += result.split
        return result.line, 1

    counts.written = write_answers(
        resources(),
        functools.partial(_pseudonymize_line, service, source),
        written,
        dest,
        workers=concurrency,
        window=2 * concurrency,  # read ahead: a slow request does not stall the others
        level=level,
        line_limit=max_line_bytes,
        progress=(f"pseudonymize {source.name}", expected_resources),
        source=str(source),
    )
    # as many as went in: one line an answer, each a JSON object (``checked_answer``)
    counts.resources_out = counts.written.resources
    return counts


def _pseudonymize_line(
    service: Pseudonymizer, source: Path, item: tuple[int, bytes, JsonObject]
) -> Pseudonymized:
    """De-identify one line; a failure names the file, line and resource."""
    line_number, line, resource = item
    try:
        return service.pseudonymize(line, resource)
    except (ServiceError, PseudonymizationError) as exc:
        hint = f"; {TOO_LARGE_HINT}" if exc.status_code == 413 else ""
        message = f"{source}: line {line_number} ({resource_label(resource)}): {exc}{hint}"
        raise StepError(message) from exc


def read_anonymization_config(path: str | None) -> AnonymizationConfig | None:
    """Read the YAML once per run, kept for the step's file tasks by its digest.

    Note: an unreadable file stops the step before a request.
    """
    if not path:
        return None
    try:
        config = AnonymizationConfig.read(path, f"{CONFIG_KEY} (--anonymization-config)")
    except JsonFileError as exc:
        raise StepError(str(exc)) from None
    _configs_by_digest.keep(config.sha256, config)
    return config


def anonymization_config(path: str | None, digest: str | None) -> AnonymizationConfig | None:
    """Return the config the step read, by its ``digest``.

    Why: a process that has not seen it (a Dask worker) reads ``path`` and refuses a file changed
    since (the job would mix two configs).
    """
    if digest is None:
        return None
    if (config := _configs_by_digest.get(digest)) is not None:
        return config
    config = read_anonymization_config(path)
    if config is None or config.sha256 != digest:
        raise StepError(
            f"{CONFIG_KEY} (--anonymization-config): {path} changed while the step ran (it is no "
            "longer the file the step read at its start); keep the file unchanged while a job "
            "runs"
        )
    return config


def shaped_settings(settings: Settings) -> JsonObject:
    """Return what the step's files depend on besides its input.

    Note: the anonymization config (an edit of it too) and compression.
    """
    return {
        "config": file_shape(settings.services.pseudonymizer.anonymization_config),
        **compression_shape(settings),
    }
