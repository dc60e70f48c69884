"""THE rule for a name from data: a CRTDL group, a file name, a part of an S3 key.

No invisible character, none of ``/ \\ : * ? " < > |``, no ``..``, no leading dot, not empty,
and at most ``MAX_DATA_NAME_BYTES`` of UTF-8, so ``.<name>.part`` fits a file name's 255 bytes.
Imports nothing of ours.
"""

import unicodedata

MAX_DATA_NAME_BYTES = 240
RESERVED_NAME_CHARACTERS = '/\\:*?"<>|'
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
SHOWN_NAME_CHARS = 80


def name_from_data_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file name or key part, or None.

    Note: said as "contains a control character U+000A".
    """
    if not name:
        return "is empty"
    if problem := invisible_character_problem(name):
        return problem
    if reserved := sorted({char for char in name if char in RESERVED_NAME_CHARACTERS}):
        listed = " ".join(RESERVED_NAME_CHARACTERS)
        return f"contains {' '.join(reserved)} (none of {listed} may be in a file name)"
    if ".." in name:
        return "contains .. (a path could leave its folder)"
    if name.startswith("."):
        return "starts with a dot (a hidden file)"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a file system name's undecodable bytes, kept as surrogates
        return "is not valid UTF-8 (bytes of another encoding, such as Latin-1, in a file name)"
    if size > MAX_DATA_NAME_BYTES:
        limit = MAX_DATA_NAME_BYTES
        return f"is too long: {size} bytes of UTF-8, more than the {limit} a name may have"
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
    """The kind and code (``U+202E``) of ``text``'s first invisible character, or None.

    Note: a message names the character by these, never printing it.
    """
    for char in text:
        if (category := unicodedata.category(char)) in INVISIBLE_CATEGORIES:
            kind = BIDI_CONTROL if char in BIDI_CONTROLS else _KINDS.get(category, FORMAT)
            return kind, f"U+{ord(char):04X}"
    return None


def invisible_character_problem(name: str) -> str | None:
    """Why ``name`` would not show as what it is (an invisible character), or None."""
    if (found := invisible_character(name)) is None:
        return None
    kind, code = found
    article = "an" if kind[0] in "aeiou" else "a"
    return f"contains {article} {kind} {code}{_INVISIBLE_CONSEQUENCES[kind]}"


def show_name(name: str) -> str:
    """``name`` quoted for a message, control characters escaped, cut when long."""
    return ascii(name) if len(name) <= SHOWN_NAME_CHARS else ascii(name[:SHOWN_NAME_CHARS]) + "…"


def show_text(value: object, limit: int | None = SHOWN_NAME_CHARS) -> str:
    """``value`` (a path, an id from data) as it is if it shows as itself in ``limit``.

    Note: else quoted with invisible characters escaped, cut as ``show_name`` does (a newline in
    it would forge a line of the message). ``limit`` None: any length.
    """
    text = str(value)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    return ascii(text) if limit is None else show_name(text)


def name_key(name: str) -> str:
    """What two names share when a case-insensitive file system takes them for one.

    Note: as macOS, SMB and NTFS do.
    """
    return unicodedata.normalize("NFC", name).casefold()
