"""Client of a FHIR server for the send step: transaction Bundles (direct_resource_load) and resource PUTs with
streamed bodies (transfer_load's Binary and DocumentReference). Plain Python: no Prefect in here.

Every call goes through the client layer (``tasks.clients.http``): credentials scoped to the server's origin,
retry of network errors, 408, 429 and 5xx with backoff, other 4xx terminal. A transaction is atomic on the server,
so sending it again after an ambiguous failure cannot apply it twice: entries are PUTs (idempotent) or conditional
creates (``ifNoneExist``), see tasks/send.py.

A 2xx answer to a transaction is not yet a success: every entry of the ``transaction-response`` is checked, and
one failed entry (or a missing one) rejects the batch like an HTTP error would. A rejection carries the server's
answer (status and body) so the step can keep it for inspection.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import orjson

from tasks.clients.errors import (
    MAX_MESSAGE_CHARS,
    ServiceError,
    error_from_response,
    operation_outcome_texts,
    redact,
    truncate,
)
from tasks.clients.http import ReplayableBody, ServiceClient, ServiceEndpoint, call_with_retry, http_timeout

if TYPE_CHECKING:
    from config.settings import RetrySettings, SendSettings, TlsSettings

FHIR_JSON = "application/fhir+json"
REQUEST_HEADERS = {"Content-Type": FHIR_JSON, "Accept": FHIR_JSON}
SERVICE_NAME = "FHIR server"
# services.send has no timeout key; a transaction of 1000 resources or a Binary of a large file can keep a server
# busy for minutes before it answers, so one read may take this long.
SEND_TIMEOUT = timedelta(minutes=10)
_ENTRY_NUMBER = re.compile(r"\bentry\s*\[?\s*(\d+)", re.IGNORECASE)


class TransactionRejected(ServiceError):
    """The server refused a transaction: an HTTP error, or a failed entry in its ``transaction-response``.

    ``failed_entry`` is the 0-based index of the first failing entry when the server said which one, ``outcome``
    the server's OperationOutcome text, ``response_text`` what the server answered (kept for inspection).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None,
        transient: bool,
        response_text: str,
        failed_entry: int | None = None,
        outcome: str = "",
    ):
        super().__init__("transaction", status_code, message, transient=transient, service=SERVICE_NAME)
        self.response_text = response_text
        self.failed_entry = failed_entry
        self.outcome = outcome


@dataclass(frozen=True)
class EntryFailure:
    index: int
    status: str
    outcome: str


class FhirServer:
    """One FHIR server (``{url}/fhir``) reached through a ``ServiceClient``."""

    def __init__(self, client: ServiceClient):
        self._client = client

    @classmethod
    def connect(cls, send: SendSettings, tls: TlsSettings, retry: RetrySettings) -> FhirServer:
        """A client for ``services.send.url`` with ``services.send.auth`` (Basic, OAuth or none, plus API key)."""
        endpoint = ServiceEndpoint(SERVICE_NAME, send.url or "", send.auth, http_timeout(SEND_TIMEOUT))
        return cls(ServiceClient(endpoint, tls, retry))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> FhirServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self, body: bytes, entries: int) -> dict:
        """POST a transaction Bundle of ``entries`` entries; the ``transaction-response`` when every entry succeeded.

        Raises ``TransactionRejected`` for an HTTP error (after retries of the transient ones) or a failed entry,
        and ``ServiceError`` (status None) when the server could not be reached.
        """
        answer: list[httpx.Response] = []

        def attempt() -> httpx.Response:
            response = self._client.http.request("POST", "/fhir", content=body, headers=REQUEST_HEADERS)
            if response.is_error:
                answer[:] = [response]
                raise error_from_response(response, operation="transaction", service=SERVICE_NAME)
            return response

        try:
            response = call_with_retry(attempt, self._client.retry, operation="transaction", service=SERVICE_NAME)
        except ServiceError as exc:
            if not answer or exc.status_code is None:
                raise
            raise rejected_by_status(answer[0], exc) from None
        return checked_transaction_response(response, entries)

    def put(
        self,
        resource_type: str,
        resource_id: str,
        body: Callable[[], Iterable[bytes]] | bytes,
        *,
        length: int | None = None,
    ) -> httpx.Response:
        """PUT ``{url}/fhir/<type>/<id>``; ``body`` is the JSON, or a function that streams it afresh per attempt
        (its total ``length`` then goes into Content-Length, so the body is not sent chunked)."""
        headers = dict(REQUEST_HEADERS)
        if length is not None:
            headers["Content-Length"] = str(length)
        return self._client.request(
            "PUT",
            f"/fhir/{resource_type}/{resource_id}",
            operation=f"PUT {resource_type}/{resource_id}",
            content=body if isinstance(body, bytes) else ReplayableBody(body),
            headers=headers,
        )

    def get(self, path: str, **params: str) -> dict:
        """GET a resource or a search under ``{url}/fhir`` (used to read back what was sent)."""
        response = self._client.request("GET", f"/fhir/{path}", operation=f"GET {path}", params=params)
        return orjson.loads(response.content)


def rejected_by_status(response: httpx.Response, error: ServiceError) -> TransactionRejected:
    """The rejection of a transaction the server answered with 4xx/5xx; names the entry when the server did."""
    texts = operation_outcome_texts(response.content)
    outcome = "; ".join(texts)
    match = next((m for text in texts if (m := _ENTRY_NUMBER.search(text))), None)
    return TransactionRejected(
        error.message,
        status_code=response.status_code,
        transient=error.transient,
        response_text=response_text(response),
        failed_entry=int(match.group(1)) if match else None,
        outcome=truncate(outcome, MAX_MESSAGE_CHARS),
    )


def checked_transaction_response(response: httpx.Response, sent: int) -> dict:
    """The parsed ``transaction-response``; a failed or missing entry raises ``TransactionRejected``."""
    try:
        bundle = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        bundle = None
    if not isinstance(bundle, dict) or bundle.get("resourceType") != "Bundle":
        raise _bad_answer(response, "the answer is not a Bundle")
    entries = bundle.get("entry") or []
    if failure := first_failed_entry(entries):
        return_text = f"entry {failure.index + 1} failed with {failure.status}"
        raise TransactionRejected(
            return_text + (f": {failure.outcome}" if failure.outcome else ""),
            status_code=response.status_code,
            transient=False,
            response_text=response_text(response),
            failed_entry=failure.index,
            outcome=failure.outcome,
        )
    if len(entries) != sent:
        raise _bad_answer(response, f"the transaction-response has {len(entries)} entries for {sent} sent")
    return bundle


def first_failed_entry(entries: list) -> EntryFailure | None:
    """The first ``transaction-response`` entry whose ``response.status`` is not 2xx."""
    for index, entry in enumerate(entries):
        answer = entry.get("response") if isinstance(entry, dict) else None
        status = str(answer.get("status", "")) if isinstance(answer, dict) else ""
        code = status.split(" ", 1)[0]
        if not (code.isdigit() and 200 <= int(code) < 300):
            outcome = answer.get("outcome") if isinstance(answer, dict) else None
            texts = operation_outcome_texts(orjson.dumps(outcome)) if outcome else []
            return EntryFailure(index, status or "no status", truncate("; ".join(texts), MAX_MESSAGE_CHARS))
    return None


def _bad_answer(response: httpx.Response, reason: str) -> TransactionRejected:
    return TransactionRejected(
        f"{reason}; the server's answer cannot confirm the batch",
        status_code=response.status_code,
        transient=False,
        response_text=response_text(response),
    )


def response_text(response: httpx.Response) -> str:
    """What the server answered, for the failure dump: status line, content type, body; credentials it quoted
    back are blanked out (``redact``)."""
    content_type = response.headers.get("Content-Type", "")
    return redact(
        f"HTTP {response.status_code} {response.reason_phrase}\nContent-Type: {content_type}\n\n{response.text}"
    )
