"""The one reader of a JSON file a user gives, and of a settings file used as is.

A CRTDL, lookup file or ViewDefinition; an anonymization config or CA bundle. At most a byte
limit is read (``/dev/zero`` is never read to its end), and nesting deeper than
``MAX_JSON_DEPTH``, which would end in a RecursionError far from the file, is refused.
"""

import json
import stat
from pathlib import Path
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JSON

MAX_JSON_DEPTH = 128
MB = 1024 * 1024
READ_PIECE_BYTES = MB
MAX_SETTINGS_FILE_BYTES = 16 * MB  # an anonymization config, CA bundle or enrichment file


class JsonFileError(DupflowError):
    """A user's JSON file that cannot be used; the message names file, reason and fix."""


def read_json_file(path: Path, max_bytes: int, label: str) -> JSON:
    """The JSON document in ``path``; ``label`` names it in errors ("the lookup file")."""
    return parse_json_document(read_limited(path, max_bytes, label), label)


def read_at_most(path: Path, limit: int) -> bytes:
    """The file's bytes, or its first ``limit + 1`` bytes (then it is too large).

    Why: read in pieces, as one ``read(limit + 1)`` asks the allocator for the whole limit at
    once (64 MB for each job record read).
    """
    pieces: list[bytes] = []
    total = 0
    with open(path, "rb") as file:
        while total <= limit and (piece := file.read(min(READ_PIECE_BYTES, limit + 1 - total))):
            pieces.append(piece)
            total += len(piece)
    return b"".join(pieces)


def read_limited(path: Path, max_bytes: int, label: str) -> bytes:
    try:
        data = read_at_most(path, max_bytes)
    except OSError as exc:
        raise JsonFileError(f"cannot read {label}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise JsonFileError(
            f"{label} is larger than {max_bytes // MB} MB, more than such a file ever needs; "
            "check the path"
        )
    return data


def settings_file_problem(path: Path, *, must_exist: bool = False) -> str | None:
    """Why a file a setting names cannot be read whole (a device, too big), or None.

    Note: a missing file is a problem only ``must_exist``; else it is left to whoever reads it.
    """
    try:
        status = path.stat()
    except OSError as exc:
        return (
            f"cannot read {path}: {exc.strerror}; fix the path or the file's permissions"
            if must_exist
            else None
        )
    if not stat.S_ISREG(status.st_mode):
        return f"{path} is no regular file; give the path of a file"
    if status.st_size > MAX_SETTINGS_FILE_BYTES:
        limit = MAX_SETTINGS_FILE_BYTES // MB
        return f"{path} is larger than {limit} MB, more than such a file needs; check the path"
    return None


def read_settings_file(path: Path, key: str) -> bytes:
    """The bytes of the file the setting ``key`` names, within the bound.

    Why: checked again here, as a job continued with another path, or a file grown since,
    passed the first check.
    """
    if problem := settings_file_problem(path):
        raise JsonFileError(f"{key}: {problem}")
    try:
        data = read_at_most(path, MAX_SETTINGS_FILE_BYTES)
    except OSError as exc:
        reason = exc.strerror or exc
        raise JsonFileError(
            f"{key}: cannot read {path}: {reason}; fix the path or the file's permissions"
        ) from None
    if len(data) > MAX_SETTINGS_FILE_BYTES:  # grown since it was looked at
        raise JsonFileError(
            f"{key}: {path} is larger than {MAX_SETTINGS_FILE_BYTES // MB} MB; check the path"
        )
    return data


def parse_json_document(data: bytes, label: str) -> JSON:
    too_deep = JsonFileError(
        f"{label} is nested too deeply (more than {MAX_JSON_DEPTH} levels); fix the file"
    )
    try:
        document: JSON = json.loads(data)
    except RecursionError:
        raise too_deep from None
    except UnicodeDecodeError:
        raise JsonFileError(f"{label} is not UTF-8 text; save it as UTF-8") from None
    except ValueError as exc:
        raise JsonFileError(f"{label} is not valid JSON ({exc}); fix the file") from None
    # objects and arrays nested more than MAX_JSON_DEPTH levels, found without recursion
    stack: list[tuple[JSON, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise too_deep
            stack.extend(
                (child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)
            )
    return document
