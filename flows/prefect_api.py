"""What a server's answers say about it being a Prefect API this client can use; no Prefect import (the command
line's fast commands import this module)."""

from __future__ import annotations

import importlib.metadata
import json
from typing import TYPE_CHECKING

from tasks.core.readable import plain_text

if TYPE_CHECKING:
    from packaging.version import Version

SHOWN_ANSWER_CHARS = 80


def version_problem(answer: tuple[int, bytes] | None) -> str | None:
    """What is wrong with ``answer``, a server's answer to ``GET /admin/version`` (status and body; None: nothing
    answered), for this client; None when it names a Prefect version of this client's major version. Prefect's
    client reads and parses that answer before its first call: a foreign one ends there in a traceback
    (``InvalidVersion``, a JSON error), a Prefect of another major version in "incompatible versions"."""
    if answer is not None and answer[0] in (401, 403):  # a server elsewhere may want credentials for it
        return None
    from packaging.version import Version  # Prefect's own reading of versions

    if (found := prefect_version(answer)) is None:
        said = (
            f"HTTP {answer[0]} {plain_text(answer[1].decode(errors='replace'))[:SHOWN_ANSWER_CHARS]!r}"
            if answer
            else "nothing"
        )
        return f"answers GET /health with true but is no Prefect API (GET /admin/version answered {said})"
    if found.major != (ours := Version(importlib.metadata.version("prefect"))).major:
        return f"is Prefect {found}, this client Prefect {ours}: their major versions must match"
    return None


def prefect_version(answer: tuple[int, bytes] | None) -> Version | None:
    """The version a Prefect API names at ``/admin/version`` (a JSON string), read as Prefect's client reads it;
    None for any other answer."""
    from packaging.version import Version

    if answer is None or answer[0] != 200:
        return None
    try:
        return Version(json.loads(answer[1]))
    except (ValueError, TypeError):  # InvalidVersion and JSON errors are ValueErrors
        return None
