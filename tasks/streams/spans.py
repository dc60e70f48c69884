"""Cut large data files into pieces, so one big file uses every worker process.

See docs/development.md#streams.
"""

import bisect
import itertools
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from tasks.streams.ndjson import WHOLE_FILE, Span, is_zstd, iter_chunks, line_feeds
from tasks.streams.processes import processes_allowed

MB = 1024 * 1024
# Worker processes take about 0.9 s to a first result on a busy 2-core machine (a new interpreter
# each, importing the engine); below this much input that costs more than it saves, so the files are
# flattened in the calling process.
PROCESS_MIN_BYTES = 16 * MB
# A file is cut into spans for several processes only when each span gets at least this much (of its
# content).
SPAN_MIN_BYTES = 8 * MB
# A plain file is cut into up to this many spans per process, so that a slow span does not hold up
# the step's end alone. A zstd file gets one per process: each of its spans decompresses everything
# before it (a zstd stream cannot be entered in the middle; that is fast beside flattening, and no
# decompressed copy is written to disk).
PLAIN_SPANS_PER_PROCESS = 2


@dataclass(frozen=True)
class Piece:
    """What one task works on: file ``name`` whole, or span ``index`` of ``count``."""

    name: str
    span: Span
    index: int
    count: int

    @property
    def label(self) -> str:
        return self.name if self.count == 1 else f"{self.name}#{self.index}/{self.count}"

    @property
    def folder(self) -> str:
        return self.name if self.count == 1 else f"{self.name}#{self.index}-{self.count}"


def input_pays_for_processes(paths: Iterable[Path]) -> bool:
    """Tell whether worker processes pay for their start-up on this input.

    Why: they pay only on a large input; it is counted only that far.
    """
    counted = 0
    for path in paths:
        counted += content_bytes(path, PROCESS_MIN_BYTES - counted)
        if counted >= PROCESS_MIN_BYTES:
            break
    return counted >= PROCESS_MIN_BYTES and processes_allowed()


def file_spans(path: Path, processes: int, min_bytes: int) -> list[Span]:
    """Return the file whole, or spans cut at line starts of at least ``min_bytes``.

    Note: one span per process of a zstd file, ``PLAIN_SPANS_PER_PROCESS`` of a plain one.
    """
    most = processes * (1 if is_zstd(path) else PLAIN_SPANS_PER_PROCESS)
    spans = min(most, content_bytes(path, most * min_bytes) // min_bytes)
    return line_spans(path, spans, max(min_bytes // 8, 1)) if spans > 1 else [WHOLE_FILE]


def content_bytes(path: Path, enough: int) -> int:
    """Return the file's decompressed size, counted up to ``enough``.

    Why: a zstd file's whole pass costs as much as reading it.
    """
    if not is_zstd(path):
        return path.stat().st_size
    counted = 0
    with closing(iter_chunks(path)) as chunks:
        for chunk in chunks:
            counted += len(chunk)
            if counted >= enough:
                break
    return counted


def line_spans(path: Path, count: int, mark_bytes: int) -> list[Span]:
    """Cut ``path`` at line starts into at most ``count`` spans of about equal content.

    Note: one pass counts each span's lines and notes a place to cut every ``mark_bytes``
    (flat memory).
    """
    marks = [(0, 0)]  # (offset of a line's start, newlines before it)
    offset = lines = 0
    for chunk in iter_chunks(path):
        position = marks[-1][0] + mark_bytes - offset
        while position < len(chunk) and (newline := chunk.find(b"\n", max(position, 0))) != -1:
            marks.append((offset + newline + 1, lines + chunk.count(b"\n", 0, newline + 1)))
            position = newline + 1 + mark_bytes
        lines += line_feeds(chunk)
        offset += len(chunk)
    starts = [start for start, _ in marks]
    cuts = sorted({bisect.bisect_left(starts, offset * i // count) for i in range(1, count)})
    bounds = [
        marks[0],
        *(marks[i] for i in cuts if i < len(marks) and 0 < marks[i][0] < offset),
        (offset, lines),
    ]
    return [
        Span(start, None if end == offset else end, before, after - before)
        for (start, before), (end, after) in itertools.pairwise(bounds)
    ]
