"""Values as a person reads them, the same in ``status`` and the job record.

Sizes, durations, nested facts as ``key: value`` lines, free text made safe to show.
Import-light: ``status`` uses it.
"""

import unicodedata
from collections.abc import Mapping

from tasks.core.names import INVISIBLE_CATEGORIES

KIB = 1024
MAX_NOTE_BYTES = 4 * KIB
CAUSE_CHARS = 4 * KIB
"""A job's state message (a failure's cause) is shown whole up to this (status, job record)."""
SHOW_WHOLE = {"show_whole": True}
"""A log call's ``extra`` keeping its lines whole on the terminal (else the first line shows)."""


def truncate(text: str, limit: int) -> str:
    """``text`` whole within ``limit`` characters, else cut and ended with "…".

    Note: cut at its last space within them, or mid-word if it has none.
    """
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
    """``1 file``, ``0 files``, ``2 files``: ``noun`` given in the singular."""
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


Line = tuple[int, str | None, str | None]


def readable_lines(value: object, depth: int = 0) -> list[Line]:
    """``value`` as lines (depth, label, text), never a Python repr of a dict or list.

    Note: a scalar item is ``(depth, key or None, text)``; a nested mapping or list is
    ``(depth, key, None)`` followed by its own lines one level deeper.
    """
    if not isinstance(value, Mapping | list | tuple):
        return [(depth, None, scalar_text(value))]
    items = value.items() if isinstance(value, Mapping) else ((None, item) for item in value)
    lines: list[Line] = []
    for key, item in items:
        label = None if key is None else plain_text(key)
        if isinstance(item, Mapping | list | tuple) and item:
            if label is not None:
                lines.append((depth, label, None))
            lines += readable_lines(item, depth + 1 if label is not None else depth)
        else:
            lines.append((depth, label, scalar_text(item)))
    return lines


def scalar_text(value: object) -> str:
    """A single value as text: ``-`` for None or empty, ``yes``/``no`` for booleans."""
    if value is None or (isinstance(value, Mapping | list | tuple) and not value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return plain_text(value)


def plain_lines(value: object, indent: str) -> list[str]:
    """``readable_lines`` as indented text.

    Note: ``key: text``, ``key:`` over its nested lines, ``- text``.
    """
    lines = []
    for depth, label, text in readable_lines(value):
        prefix = indent + "  " * depth
        if label is None:
            lines.append(f"{prefix}- {text}")
        else:
            lines.append(f"{prefix}{label}:" + (f" {text}" if text is not None else ""))
    return lines


def plain_text(text: object) -> str:
    """Free text from outside as kept and shown: one line, at most MAX_NOTE_BYTES.

    Note: any value, as its ``str``; each control or format character (newline, ESC, bidi
    overrides, zero-width) a space, a cut said. A terminal or a page then shows the text as
    written, and nothing else: no forged line, no colours.
    """
    shown = " ".join(plain_multiline(str(text)).split())
    if (size := len(shown.encode())) <= MAX_NOTE_BYTES:
        return shown
    # within the bound: a kept note stays as is
    cut = f" … (cut at {MAX_NOTE_BYTES // KIB} KB of {size_text(size)})"
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
