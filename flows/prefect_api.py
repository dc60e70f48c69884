"""Prefect's REST API for commands that must not import Prefect, and its check.

Note:
- Code that imports Prefect uses Prefect's client instead (docs/development.md, "Layers").
"""

import importlib.metadata
import json
from contextlib import closing
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from urllib.parse import urlsplit, urlunsplit

import httpx

from config.runtime import CLI, prefect_api_headers, prefect_api_url
from config.settings import RetrySettings
from tasks.clients.bounds import answer_too_large, MB
from tasks.clients.errors import Call, ServiceError, is_transient_status
from tasks.clients.retry import call_with_retry
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JSON, as_array, as_objects, JsonObject
from tasks.core.readable import plain_text, size_text
from tasks.core.url_credentials import shown_url

API_HINT = "check that PREFECT_API_URL points at a Prefect server"
TIMEOUT = 20.0  # a busy server elsewhere (2 cores under load) was seen to take over 5 s
PAGE = 200  # the most rows (flow runs, artifacts) the Prefect API returns at once
MAX_PROBE_ANSWER_BYTES = MB
MAX_PAGE_BYTES = 64 * MB  # a page of PAGE rows is far less
REFUSED = (401, 403)
Answer = tuple[int, bytes]
OK = (200, b"true")  # what /health of a Prefect API answers
SHOWN_ANSWER_CHARS = 80


class ApiUnreachableError(DupflowError):
    """The Prefect API does not answer as one, or refuses this command's login."""


def api_answer(
    url: str,
    path: str,
    timeout: float = TIMEOUT,
    *,
    method: str = "GET",
    body: JSON = None,
    limit: int = MAX_PROBE_ANSWER_BYTES,
) -> Answer:
    """Return the status and at most ``limit`` bytes of a call's body; 0 for no answer.

    Why:
    - Not httpx: its client makes a TLS context (60 ms when busy); start-up probes every 50 ms.
    """
    parts = urlsplit(url)
    kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    data = None if body is None else json.dumps(body).encode()
    headers = prefect_api_headers() | ({"Content-Type": "application/json"} if data else {})
    try:
        with closing(kind(parts.hostname or "", parts.port, timeout=timeout)) as connection:
            connection.request(method, parts.path.rstrip("/") + path, data, headers)
            response = connection.getresponse()
            return response.status, response.read(limit)
    except (OSError, HTTPException, ValueError):
        return 0, b""


def api_json(method: str, path: str, body: JSON = None, *, limit: int = MAX_PAGE_BYTES) -> JSON:
    """Return the API's JSON answer to a call, retried; None for a 204 or 404.

    Note:
    - A busy SQLite server answers 503: retried. A DELETE's 404 is something already gone.
    """
    url = prefect_api_url() or ""
    where = Call(operation=f"{method} {path}", service="the Prefect API")

    def attempt() -> JSON:
        status, content = api_answer(url, path, method=method, body=body, limit=limit + 1)
        if status in REFUSED:
            raise refused_login(url, status)
        if not status or status >= 400 and status != 404:
            said = f"HTTP {status}" if status else f"no answer from {shown_url(url)}"
            retry = not status or is_transient_status(status)
            raise ServiceError(status_code=status or None, message=said, transient=retry, **where)
        if len(content) > limit:
            size, source = f"over {size_text(limit)}", httpx.URL(url.rstrip("/") + path)
            raise answer_too_large(size, limit, hint=API_HINT, source=source, **where)
        try:
            return None if status in (204, 404) else json.loads(content)
        except ValueError:
            said = f"no JSON; {API_HINT}"
            raise ServiceError(status_code=status, message=said, transient=False, **where) from None

    return call_with_retry(attempt, RetrySettings(), **where)


def filter_rows(path: str, **filters: JSON) -> list[JsonObject]:
    """Every row of a ``…/filter`` endpoint (``filters``: its body), a page at a time."""
    rows, offset = list[JsonObject](), 0
    while True:
        page = as_array(api_json("POST", path, {**filters, "limit": PAGE, "offset": offset}))
        rows += as_objects(page)
        offset += PAGE
        if len(page) < PAGE:
            return rows


def refused_login(url: str, status: int) -> ApiUnreachableError:
    """Return the one line for an API that refuses this command's login.

    Note: that server runs, and is never stopped for it.
    """
    return ApiUnreachableError(
        f"the Prefect API {shown_url(url)} refuses this command's login (HTTP {status}): set "
        "PREFECT_API_AUTH_STRING to the user:password it was started with (its "
        "PREFECT_SERVER_API_AUTH_STRING)"
    )


def require_answer(api_url: str) -> None:
    """Raise ``ApiUnreachableError`` unless a usable Prefect API answers.

    Note: one that asks for credentials counts as usable.
    """
    answer = api_answer(api_url, "/health")
    if answer[0] in REFUSED:
        return
    if answer == OK:
        if problem := version_problem(api_answer(api_url, "/admin/version")):
            raise ApiUnreachableError(
                f"the Prefect API {shown_url(api_url)} (PREFECT_API_URL) {problem}; set "
                "PREFECT_API_URL to a Prefect server's API, or unset it to use the local server "
                f"({CLI} server start)"
            )
        return
    parts = urlsplit(api_url)
    path = parts.path.rstrip("/")
    api = None if path.endswith("/api") else urlunsplit(parts._replace(path=f"{path}/api"))
    if answer[0] and api and api_answer(api, "/health") == OK:
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
    status, content = answer
    # a server elsewhere may want credentials for it
    if status in REFUSED:
        return None
    from packaging.version import Version  # Prefect's own reading of versions

    try:  # /admin/version answers a JSON string, read as Prefect's client reads it
        found = Version(json.loads(content)) if status == 200 else None
    except (ValueError, TypeError):  # InvalidVersion and JSON errors are ValueErrors
        found = None
    if found is None:
        body = plain_text(content.decode(errors="replace"))[:SHOWN_ANSWER_CHARS]
        said = f"HTTP {status} {body!r}" if status else "nothing"
        return (
            "answers GET /health with true but is no Prefect API (GET /admin/version answered "
            f"{said})"
        )
    if found.major != (ours := Version(importlib.metadata.version("prefect"))).major:
        return f"is Prefect {found}, this client Prefect {ours}: their major versions must match"
    return None
