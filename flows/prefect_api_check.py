"""Whether ``PREFECT_API_URL`` names a Prefect API this client can use.

No Prefect import at module level: the fast commands import this module.
"""

import importlib.metadata
import json
from urllib.parse import urlsplit, urlunsplit

from config.runtime import CLI
from flows.prefect_api import REFUSED, TIMEOUT, Answer, ApiUnreachableError, api_answer
from tasks.core.readable import plain_text
from tasks.core.url_credentials import shown_url

OK = (200, b"true")  # what /health of a Prefect API answers
SHOWN_ANSWER_CHARS = 80


def require_answer(api_url: str) -> None:
    """Raise ``ApiUnreachableError`` unless a usable Prefect API answers.

    Note: one that asks for credentials counts as usable.
    """
    answer = api_answer(api_url, "/health", TIMEOUT)
    if answer[0] in REFUSED:
        return
    if answer == OK:
        if problem := version_problem(api_answer(api_url, "/admin/version", TIMEOUT)):
            raise ApiUnreachableError(
                f"the Prefect API {shown_url(api_url)} (PREFECT_API_URL) {problem}; set "
                "PREFECT_API_URL to a Prefect server's API, or unset it to use the local server "
                f"({CLI} server start)"
            )
        return
    parts = urlsplit(api_url)
    path = parts.path.rstrip("/")
    api = None if path.endswith("/api") else urlunsplit(parts._replace(path=f"{path}/api"))
    if answer[0] and api and api_answer(api, "/health", TIMEOUT) == OK:
        raise ApiUnreachableError(  # the UI's address, as start prints it, exported as the API's
            f"PREFECT_API_URL {shown_url(api_url)} is the address of a Prefect server's UI, not "
            f"its API: set PREFECT_API_URL={shown_url(api)}"
        )
    found = (
        "does not answer"
        if not answer[0]
        else f"is no Prefect API (GET /health answered HTTP {answer[0]})"
    )
    raise ApiUnreachableError(
        f"the Prefect API {shown_url(api_url)} (PREFECT_API_URL) {found}; start that server, set "
        f"PREFECT_API_URL to one that runs, or unset it to use the local server ({CLI} server "
        "start)"
    )


def version_problem(answer: Answer) -> str | None:
    """Say what is wrong for this client with a ``GET /admin/version`` answer.

    Why: Prefect's client reads it first, and ends in a traceback on a foreign one, in
    "incompatible versions" on another major version.
    """
    # a server elsewhere may want credentials for it
    if answer[0] in REFUSED:
        return None
    from packaging.version import Version  # Prefect's own reading of versions

    try:  # /admin/version answers a JSON string, read as Prefect's client reads it
        found = Version(json.loads(answer[1])) if answer[0] == 200 else None
    except (ValueError, TypeError):  # InvalidVersion and JSON errors are ValueErrors
        found = None
    if found is None:
        body = plain_text(answer[1].decode(errors="replace"))[:SHOWN_ANSWER_CHARS]
        said = f"HTTP {answer[0]} {body!r}" if answer[0] else "nothing"
        return (
            "answers GET /health with true but is no Prefect API (GET /admin/version answered "
            f"{said})"
        )
    if found.major != (ours := Version(importlib.metadata.version("prefect"))).major:
        return f"is Prefect {found}, this client Prefect {ours}: their major versions must match"
    return None
