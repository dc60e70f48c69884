"""NDJSON files in tests: written from resources, read back as parsed resources or as their resource count (each
line checked)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from tasks.streams.ndjson import iter_lines, parse_resource
from tasks.streams.line_check import count_contents


def iter_resources(path: Path, max_line_bytes: int) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, parsed resource)``; a line that is not a FHIR resource is an error."""
    for line_number, line in iter_lines(path, max_line_bytes):
        yield line_number, parse_resource(path, line_number, line)


def count_resources(path: Path, max_line_bytes: int) -> int:
    """The resources (lines) of a data file, each line checked like ``AtomicNdjsonWriter`` checks it."""
    return count_contents(path, max_line_bytes).resources


def write_lines(path: Path, resources: list[dict[str, Any]]) -> Path:
    """``resources`` as NDJSON at ``path``, one compact line each."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in resources))
    return path


def read_output(path: Path) -> list[dict[str, Any]]:
    """The resources of a data file (plain or zstd), in order."""
    return [resource for _, resource in iter_resources(path, 100 * 1024 * 1024)]
