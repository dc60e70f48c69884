"""What the steps share besides their contract: NDJSON writing, downloads, reports.

Note: for the steps that send every file through a service: answers written in request order, a
report of a row per file.
"""

from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import TypedDict, TypeVar

import httpx
from prefect.artifacts import create_table_artifact

from config.settings import Settings
from config.yaml_file import file_identity
from tasks.clients.downloads import download_ndjson
from tasks.core.json_shapes import JsonObject
from tasks.job.contract import StepInput
from tasks.streams.fanout import ordered_map, raise_if_cancelled
from tasks.streams.ndjson import CompressionLevel, FileStats
from tasks.streams.ndjson_writer import AtomicNdjsonWriter
from tasks.streams.progress import track

T = TypeVar("T")
A = TypeVar("A")


class NdjsonWriting(TypedDict):
    """Keywords of ``AtomicNdjsonWriter``: ``level`` and ``max_line_bytes``.

    Note: ``level`` is the zstd level (None: plain).
    """

    level: CompressionLevel | None
    max_line_bytes: int


def ndjson_written(settings: Settings) -> NdjsonWriting:
    level = settings.compression.level if settings.compression.enabled else None
    return {"level": level, "max_line_bytes": settings.pipeline.max_ndjson_line_size_bytes}


def download_tracked(
    client: httpx.Client, url: str, dest: Path, settings: Settings, stall: timedelta
) -> FileStats:
    """Download ``url`` into ``dest``, its progress shown.

    Note: an interrupted run stops it at its next chunk.
    """
    with track(f"download {dest.name}") as progress:

        def on_bytes(amount: int) -> None:
            raise_if_cancelled()
            progress.advance(amount)

        return download_ndjson(
            client,
            url,
            dest,
            **ndjson_written(settings),
            stall_timeout=stall,
            retry=settings.retry,
            on_bytes=on_bytes,
            on_total=progress.set_total,
        )


def compression_shape(settings: Settings) -> JsonObject:
    """How a step compresses what it writes: part of its output's shape."""
    return {"compressed": settings.compression.enabled, "level": settings.compression.level}


def file_shape(path: str | None) -> JsonObject:
    """A settings file as part of a step's output's shape: path, size, time of change.

    Why: so that an edit counts (a stat: the step reads the file once per run).
    Note: for the anonymization config or lookup file; None if not found (the step says why).
    """
    modified_ns, size = file_identity(path) or (None, None)
    return {"path": path, "size": size, "modified_ns": modified_ns}


def write_answers(
    requests: Iterable[T],
    ask: Callable[[T], A],
    written: Callable[[T, A], tuple[bytes, int]],
    dest: Path,
    *,
    workers: int,
    window: int,
    level: CompressionLevel | None,
    line_limit: int,
    progress: tuple[str, int | None],
    source: str,
) -> FileStats:
    """Ask each request on ``workers`` threads; write the answers in order to ``dest``.

    Note: at most ``window`` requests are pending; ``written`` gives an answer's line and the input
    lines it stands for (``progress``: label, expected lines).
    """
    label, expected = progress
    with (
        track(label, expected, "lines") as shown,
        AtomicNdjsonWriter(dest, level, line_limit, source=source) as writer,
    ):
        for request, answer in ordered_map(requests, ask, workers, window):
            raise_if_cancelled()
            line, lines = written(request, answer)
            writer.write(line + b"\n")
            shown.advance(lines)
    assert writer.stats is not None
    return writer.stats


def publish_report(step: StepInput, rows: list[JsonObject], description: str) -> None:
    """The step's report artifact (``job-<id>-NN-<step>-report``): one row per file."""
    create_table_artifact(
        key=step.artifact_key("report"),
        table=rows or [{"file": "(no files)"}],
        description=f"Step {step.position + 1} `{step.step}`: {description}",
    )
