"""THE rule for a name that comes from data (a CRTDL group name, a result or import file name, a part of an S3 key):
no invisible character, none of ``/ \\ : * ? " < > |``, no ``..``, no leading dot, not empty, and at most
``MAX_DATA_NAME_BYTES`` of UTF-8, so ``.<name>.part`` fits a file name's 255 bytes. Imports nothing of ours.
"""

from __future__ import annotations

import unicodedata

MAX_DATA_NAME_BYTES = 240
RESERVED_NAME_CHARACTERS = '/\\:*?"<>|'
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
SHOWN_NAME_CHARS = 80


def name_from_data_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file name or key part ("contains a control character U+000A"), or None."""
    if not name:
        return "is empty"
    if problem := invisible_character_problem(name):
        return problem
    if reserved := sorted({char for char in name if char in RESERVED_NAME_CHARACTERS}):
        return f"contains {' '.join(reserved)} (none of {' '.join(RESERVED_NAME_CHARACTERS)} may be in a file name)"
    if ".." in name:
        return "contains .. (a path could leave its folder)"
    if name.startswith("."):
        return "starts with a dot (a hidden file)"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a file system name's undecodable bytes, kept as surrogates by Python
        return "is not valid UTF-8 (bytes of another encoding, such as Latin-1, in a file name)"
    if size > MAX_DATA_NAME_BYTES:
        return f"is too long: {size} bytes of UTF-8, more than the {MAX_DATA_NAME_BYTES} a name may have"
    return None


BIDI_CONTROL = "bidirectional text control character"
CONTROL = "control character"
LINE_SEPARATOR = "line or paragraph separator"
FORMAT = "invisible format character"
_KINDS = {"Cc": CONTROL, "Zl": LINE_SEPARATOR, "Zp": LINE_SEPARATOR}
_INVISIBLE_CONSEQUENCES = {
    BIDI_CONTROL: ", which can make it display as another name",
    CONTROL: " (such as a newline or a tab)",
    LINE_SEPARATOR: ", which breaks the line it is shown on",
    FORMAT: " (such as a zero-width space)",
}


def invisible_character(text: str) -> tuple[str, str] | None:
    """The kind and code (``U+202E``) of the first character of ``text`` that would not show as itself, or None: a
    message names it by these, never printing the character."""
    for char in text:
        if (category := unicodedata.category(char)) in INVISIBLE_CATEGORIES:
            kind = BIDI_CONTROL if char in BIDI_CONTROLS else _KINDS.get(category, FORMAT)
            return kind, f"U+{ord(char):04X}"
    return None


def invisible_character_problem(name: str) -> str | None:
    """Why ``name`` would not show as what it is (a control, bidirectional or other invisible character), or None."""
    if (found := invisible_character(name)) is None:
        return None
    kind, code = found
    article = "an" if kind[0] in "aeiou" else "a"
    return f"contains {article} {kind} {code}{_INVISIBLE_CONSEQUENCES[kind]}"


def show_name(name: str) -> str:
    """``name`` quoted for a message, every control character escaped and cut after SHOWN_NAME_CHARS characters."""
    return ascii(name) if len(name) <= SHOWN_NAME_CHARS else ascii(name[:SHOWN_NAME_CHARS]) + "…"


def show_text(value: object, limit: int | None = SHOWN_NAME_CHARS) -> str:
    """``value`` (a path, an id from data) as it is when it shows as itself within ``limit`` characters (None: any
    length); else quoted with invisible characters escaped, cut as ``show_name`` does (a newline in it would forge a
    line of the message)."""
    text = str(value)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    return ascii(text) if limit is None else show_name(text)


def name_key(name: str) -> str:
    """What two file names share when a case-insensitive file system (macOS, SMB, NTFS) takes them for one file."""
    return unicodedata.normalize("NFC", name).casefold()
