"""Where things live inside a job directory. Import-light on purpose: ``status`` and ``list`` use it.

``name_from_data_problem`` is THE rule for a name that comes from data (a CRTDL group name that becomes a CSV and a
ViewDefinition name, a result or import file name, a part of an S3 key): no control or format character (Unicode
categories Cc and Cf: newline, CR, tab, bidirectional overrides and isolates, zero-width characters; also the line
and paragraph separators), none of ``/ \\ : * ? " < > |``, no ``..``, no leading dot, not empty, and at most
``MAX_DATA_NAME_BYTES`` bytes of UTF-8, so that the temporary form ``.<name>.part`` fits the 255 bytes a file name
may have. Each door decides whether it refuses such a name or escapes it (``show_name`` quotes one for a message).

``read_json_file`` is the one reader of a JSON file a user gives (the CRTDL, the lookup file, the enrichment file, a
ViewDefinition): it reads at most the caller's byte limit (a device such as /dev/zero is refused, never read to its
end) and refuses documents nested deeper than ``MAX_JSON_DEPTH`` levels, which no such file needs and which would
otherwise end in a RecursionError far from the file.

``write_file_atomically`` writes a job's small files under a temporary name and renames them; a write that fails
(a full disk) removes the temporary file and raises ``JobWriteError`` ("no space left on <folder>: ...").
"""

from __future__ import annotations

import errno
import json
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import DupflowError

PREFECT_DIR = ".prefect"
IMPORT_STEPS = ("extractor", "local_import", "http_import")
MAX_DATA_NAME_BYTES = 240
RESERVED_NAME_CHARACTERS = '/\\:*?"<>|'
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
SHOWN_NAME_CHARS = 80
MAX_JSON_DEPTH = 128
MB = 1024 * 1024


class JsonFileError(ValueError):
    """A user's JSON file that cannot be used; the message names the file, the reason and the fix."""


def read_json_file(path: Path, max_bytes: int, label: str) -> Any:
    """The JSON document in ``path``; at most ``max_bytes`` are read, and nesting is bounded by MAX_JSON_DEPTH.
    ``label`` names the file in errors ("the lookup file /x.json"). Raises ``JsonFileError``."""
    return parse_json_document(read_limited(path, max_bytes, label), label)


def read_limited(path: Path, max_bytes: int, label: str) -> bytes:
    """The bytes of ``path``, refused (``JsonFileError``) when there are more than ``max_bytes``."""
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise JsonFileError(f"cannot read {label}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise JsonFileError(
            f"{label} is larger than {max_bytes // MB} MB, more than such a file ever needs; check the path"
        )
    return data


def parse_json_document(data: bytes, label: str) -> Any:
    """``data`` as JSON, nested at most MAX_JSON_DEPTH levels; else ``JsonFileError`` naming ``label``."""
    too_deep = JsonFileError(f"{label} is nested too deeply (more than {MAX_JSON_DEPTH} levels); fix the file")
    try:
        document = json.loads(data)
    except RecursionError:
        raise too_deep from None
    except UnicodeDecodeError:
        raise JsonFileError(f"{label} is not UTF-8 text; save it as UTF-8") from None
    except ValueError as exc:
        raise JsonFileError(f"{label} is not valid JSON ({exc}); fix the file") from None
    if json_depth_exceeds(document, MAX_JSON_DEPTH):
        raise too_deep
    return document


def json_depth_exceeds(document: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels in ``document`` (walked without recursion)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def name_from_data_problem(name: str) -> str | None:
    """Why ``name`` cannot be used as a file name or key part (a phrase such as "contains a control character
    U+000A"), or None when it can; see the module docstring for the rule."""
    if not name:
        return "is empty"
    if problem := _invisible_character_problem(name):
        return problem
    if reserved := sorted({char for char in name if char in RESERVED_NAME_CHARACTERS}):
        return f"contains {' '.join(reserved)} (none of {' '.join(RESERVED_NAME_CHARACTERS)} may be in a file name)"
    if ".." in name:
        return "contains .. (a path could leave its folder)"
    if name.startswith("."):
        return "starts with a dot (a hidden file)"
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_DATA_NAME_BYTES:
        return f"is too long: {size} bytes of UTF-8, more than the {MAX_DATA_NAME_BYTES} a name may have"
    return None


def _invisible_character_problem(name: str) -> str | None:
    for char in name:
        if unicodedata.category(char) not in INVISIBLE_CATEGORIES:
            continue
        code = f"U+{ord(char):04X}"
        if char in BIDI_CONTROLS:
            return f"contains a bidirectional text control character {code}, which can make it display as another name"
        if unicodedata.category(char) == "Cc":
            return f"contains a control character {code} (such as a newline or a tab)"
        return f"contains an invisible format character {code} (such as a zero-width space)"
    return None


def show_name(name: str) -> str:
    """``name`` quoted for a message, every control character escaped and cut after SHOWN_NAME_CHARS characters."""
    return ascii(name) if len(name) <= SHOWN_NAME_CHARS else ascii(name[:SHOWN_NAME_CHARS]) + "…"


def step_folder(step: str) -> str:
    """The folder a step writes: ``import`` for every import step, else the step's name."""
    return "import" if step in IMPORT_STEPS else step


def is_crtdl_file(job_input: str | None) -> bool:
    """A job input that is a CRTDL: an existing ``.json`` file (a directory or a URL is data, not a CRTDL)."""
    return bool(job_input) and "://" not in job_input and job_input.endswith(".json") and Path(job_input).is_file()


@dataclass(frozen=True)
class JobPaths:
    job_dir: Path

    @property
    def job_id(self) -> str:
        return self.job_dir.name

    @property
    def job_file(self) -> Path:
        return self.job_dir / "job.json"

    @property
    def results(self) -> Path:
        return self.job_dir / PREFECT_DIR / "results"

    def wait_release_marker(self, position: int) -> Path:
        return self.job_dir / PREFECT_DIR / f"wait-{position:02d}.released"

    def wait_pause_marker(self, position: int) -> Path:
        """Set when the gate at ``position`` first paused the job (its instructions are published once)."""
        return self.job_dir / PREFECT_DIR / f"wait-{position:02d}.paused"


def artifact_key(job_id: str, *parts: str) -> str:
    """A Prefect artifact key for a job: lowercase letters, digits and dashes only."""
    return "-".join(("job", job_id, *parts)).lower().replace("_", "-")


class JobWriteError(DupflowError, OSError):
    """A job's file could not be written (no space left, no permission); nothing half-written is left. An
    ``OSError`` too, so callers that tolerate a failed write still do."""


def write_error(exc: OSError, path: Path) -> JobWriteError:
    """The user's words for a failed write of ``path``: where, why and what to do."""
    if exc.errno == errno.ENOSPC:
        return JobWriteError(
            f"no space left on {path.parent}: cannot write {path.name}; free space there (or set another jobs_dir) "
            "and try again"
        )
    return JobWriteError(f"cannot write {path}: {exc.strerror or exc}; check that the folder exists and is writable")


def write_file_atomically(path: Path, data: bytes) -> None:
    """Write a small job file (job.json, the CRTDL copy) under a temporary name, synced, then renamed; when that
    fails the temporary file is removed and ``JobWriteError`` says why."""
    temporary = path.with_name(f".{path.name}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise write_error(exc, path) from None
