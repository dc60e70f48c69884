"""Values as a person reads them (sizes, durations, nested facts as ``key: value`` lines, free text made safe to
show), the same in ``status`` and the job-record artifact. Import-light: ``status`` uses it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

from tasks.core.names import INVISIBLE_CATEGORIES

KIB = 1024
MAX_NOTE_BYTES = 4 * KIB
CAUSE_CHARS = 4 * KIB
"""A job's state message (a failure's whole cause) is shown whole up to this, in ``status`` and the job record."""
SHOW_WHOLE = {"show_whole": True}
"""A log call's ``extra`` that keeps its multi-line message whole on the terminal (others show their first line)."""


def truncate(text: str, limit: int) -> str:
    """``text`` whole within ``limit`` characters, else cut at its last space within them (or mid-word if it has
    none) and ended with "…"."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip() + "…"


def size_text(size: float) -> str:
    """``512 B``, ``1.5 KB``, ``12.0 MB``, ``2.1 GB`` (powers of 1024)."""
    if size < KIB:
        return f"{size:.0f} B"
    for unit in ("KB", "MB", "GB"):
        size /= KIB
        if round(size, 1) < KIB or unit == "GB":
            break
    return f"{size:.1f} {unit}"


def counted(number: int, noun: str) -> str:
    """``1 file``, ``0 files``, ``2 files``: ``noun`` in the singular, with an s for any other number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def duration_text(seconds: float) -> str:
    """``4.2 s`` under a minute, ``3 min 5 s`` under an hour, else ``2 h 7 min``."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def readable_lines(value: Any, depth: int = 0) -> list[tuple[int, str | None, str | None]]:
    """``value`` as lines (depth, label, text): a scalar item ``(depth, key or None, text)``, a nested mapping or
    list ``(depth, key, None)`` followed by its own lines one level deeper. Never a Python repr of a dict or list."""
    if not isinstance(value, Mapping | list | tuple):
        return [(depth, None, scalar_text(value))]
    items = value.items() if isinstance(value, Mapping) else ((None, item) for item in value)
    lines: list[tuple[int, str | None, str | None]] = []
    for key, item in items:
        label = None if key is None else plain_text(str(key))
        if isinstance(item, Mapping | list | tuple) and item:
            if label is not None:
                lines.append((depth, label, None))
            lines += readable_lines(item, depth + 1 if label is not None else depth)
        else:
            lines.append((depth, label, scalar_text(item)))
    return lines


def scalar_text(value: Any) -> str:
    """A single value as text: ``-`` for nothing (None, an empty mapping or list), ``yes``/``no`` for booleans."""
    if value is None or (isinstance(value, Mapping | list | tuple) and not value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return plain_text(str(value))


def plain_lines(value: Any, indent: str) -> list[str]:
    """``readable_lines`` as indented plain text: ``key: text``, ``key:`` over its nested lines, ``- text``."""
    lines = []
    for depth, label, text in readable_lines(value):
        prefix = indent + "  " * depth
        if label is None:
            lines.append(f"{prefix}- {text}")
        else:
            lines.append(f"{prefix}{label}:" + (f" {text}" if text is not None else ""))
    return lines


def plain_text(text: str) -> str:
    """Free text from outside as it is kept and shown: each control or format character (newline, ESC, bidi
    overrides, zero-width) a space, at most MAX_NOTE_BYTES of UTF-8 with the cut said. A terminal or a page then
    shows the text as written, and nothing else: no forged line, no colours."""
    shown = " ".join(plain_multiline(text).split())
    if (size := len(shown.encode())) <= MAX_NOTE_BYTES:
        return shown
    cut = f" … (cut at {MAX_NOTE_BYTES // KIB} KB of {size_text(size)})"  # within the bound: a kept note stays as is
    return shown.encode()[: MAX_NOTE_BYTES - len(cut.encode())].decode(errors="ignore") + cut


def plain_multiline(text: str) -> str:
    """``text`` whole, each control or format character but the line feed a space.

    Note: its own lines as written, none forged (a carriage return, a line separator), no escape
    sequence or bidi control: a log record's text as a terminal, or ``cat job.log``, shows it.
    """
    if text.replace("\n", "").isprintable():  # Python's printable has none of them: at C speed
        return text
    invisible = INVISIBLE_CATEGORIES
    return "".join(" " if c != "\n" and unicodedata.category(c) in invisible else c for c in text)
