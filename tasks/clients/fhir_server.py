"""Client of a FHIR server for the send step: transactions, streamed resource PUTs.

Note: no Prefect. See docs/development.md#service-clients.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from tasks.core.json_shapes import as_array, as_object, JsonObject
from tasks.clients.bounds import MB, Body, Deadline
from tasks.clients.errors import (
    BODY_LIMIT,
    MAX_MESSAGE_CHARS,
    ServiceError,
    json_or_none,
    operation_outcome_texts,
)
from tasks.clients.http import (
    FHIR_JSON_HEADERS,
    Closing,
    ServiceClient,
    ServiceEndpoint,
)
from tasks.core.readable import plain_text, truncate
from tasks.core.redaction import redact

if TYPE_CHECKING:
    from config.services import SendSettings
    from config.settings import RetrySettings, TlsSettings

SERVICE_NAME = "FHIR server"
REQUEST_DEADLINE = timedelta(minutes=10)
"""Whole-request deadline of one call (send, answer), plus the upload time of its body (below).

Note: also the read timeout: services.send has no timeout key, and a transaction of 1000 resources
or a Binary of a large file can keep a server busy for minutes before it answers."""
SLOWEST_UPLOAD_BYTES_PER_SECOND = MB
"""A body adds its size at this rate to the deadline: a 2 GB Binary may take 34 minutes more to go
out."""
DEADLINE_SETTING = "REQUEST_DEADLINE of tasks/clients/fhir_server.py, plus 1 s per MB sent"
MAX_ANSWER_BYTES = 64 * MB
"""The most of one answer that is read (a transaction-response, a read back); a PUT's answer body is
not read."""
MAX_STATUS_CHARS = 100  # an entry's response.status: "422 Unprocessable Entity"
TOO_LARGE_ANSWER_HINT = (
    "lower services.send.batch_size so that each transaction gets a smaller answer"
)
RETURN_MINIMAL = {"Prefer": "return=minimal"}
"""Asked of a transaction: only each entry's status is read, and a server that sends every resource
back answered a batch of large resources past ``MAX_ANSWER_BYTES``: refused after it had applied it,
again on every ``continue``."""
# what a request refused for its credentials asks of the user (a transaction, a PUT)
AUTH_REFUSALS = {
    401: "the server did not accept the credentials; check services.send.auth",
    403: "the credentials may not write there; check services.send.auth and the server's access "
    "rules",
}
PUT_HINTS = {  # what a refused PUT (transfer_load's Binary and DocumentReference) asks of the user
    **AUTH_REFUSALS,
    413: f"the resource is larger than the server accepts: raise {BODY_LIMIT}",
}
_ENTRY_NUMBER = re.compile(r"\bentry\s*\[?\s*(\d+)", re.IGNORECASE)


class TransactionRejected(ServiceError):
    """The server refused a transaction: an HTTP error, or a failed entry.

    Note: ``cause`` is the HTTP error (it says if transient); ``failed_entry`` is the 0-based index
    of the first failed entry of the ``transaction-response``, when the server said which.
    """

    def __init__(
        self,
        answer: httpx.Response,
        message: str,
        *,
        failed_entry: int | None = None,
        outcome: str = "",
        cause: ServiceError | None = None,
    ):
        super().__init__(
            "transaction",
            answer.status_code,
            message,
            transient=cause is not None and cause.transient,
            service=SERVICE_NAME,
            retry_after=None if cause is None else cause.retry_after,
        )
        # the server's answer for the failure dump: status line, content type, the body as read
        content_type = answer.headers.get("Content-Type", "")
        self.response_text = redact(
            f"HTTP {answer.status_code} {answer.reason_phrase}\nContent-Type: "
            f"{content_type}\n\n{answer.text}"
        )
        self.failed_entry, self.outcome = failed_entry, outcome


class FhirServer(Closing):
    """One FHIR server (``{url}/fhir``) through a ``ServiceClient``."""

    def __init__(
        self,
        client: ServiceClient,
        *,
        deadline: timedelta = REQUEST_DEADLINE,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        self._client, self.http = client, client.http
        self._deadline, self._max_answer_bytes = deadline, max_answer_bytes

    @classmethod
    def connect(
        cls, send: SendSettings, tls: TlsSettings, retry: RetrySettings, **bounds: Any
    ) -> FhirServer:
        """Make a client for ``services.send.url``.

        Note: ``bounds``: ``deadline`` and ``max_answer_bytes`` if not the defaults.
        """
        endpoint = ServiceEndpoint(
            SERVICE_NAME, send.url or "", send.auth, REQUEST_DEADLINE, setting="services.send.url"
        )
        return cls(ServiceClient(endpoint, tls, retry), **bounds)

    def transaction(self, body: bytes, entries: int) -> JsonObject:
        """POST a transaction Bundle; return the ``transaction-response``.

        Note: raises ``TransactionRejected`` unless every entry succeeded (``ServiceError`` when the
        server could not be reached in time).
        """
        answer = self._call(
            "POST",
            "/fhir",
            "transaction",
            body,
            rejection=rejected_by_status,
            headers=FHIR_JSON_HEADERS | RETURN_MINIMAL,
        )
        return checked_transaction_response(answer, entries)

    def put(
        self, resource_type: str, resource_id: str, body: Body, *, length: int | None = None
    ) -> None:
        """PUT ``{url}/fhir/<type>/<id>``; the answer's body (maybe a Binary) is not read.

        Note: ``body`` is the JSON, or a function that streams it afresh per attempt (its ``length``
        then goes into Content-Length).
        """
        name = f"{resource_type}/{resource_id}"
        self._call(
            "PUT",
            f"/fhir/{name}",
            f"PUT {name}",
            body,
            length,
            read_body=False,
            status_hints=PUT_HINTS,
        )

    def _call(
        self,
        method: str,
        path: str,
        operation: str,
        body: Body,
        length: int | None = None,
        *,
        headers: dict[str, str] = FHIR_JSON_HEADERS,
        **options: Any,
    ) -> httpx.Response:
        """Make one call through the client: each attempt in its deadline, answers bounded.

        Note: ``options`` go to ``ServiceClient.request`` (``read_body``, ``status_hints``,
        ``rejection``). ``length``: a streamed ``body``'s size.
        """
        size = len(body) if isinstance(body, bytes) else length
        headers = headers | ({"Content-Length": str(size)} if size is not None else {})
        # each attempt's deadline: the request's plus the upload of the body
        duration = self._deadline + timedelta(seconds=(size or 0) / SLOWEST_UPLOAD_BYTES_PER_SECOND)
        return self._client.request(
            method,
            path,
            operation=operation,
            deadline=functools.partial(Deadline, duration, DEADLINE_SETTING),
            max_answer_bytes=self._max_answer_bytes,
            too_large_hint=TOO_LARGE_ANSWER_HINT,
            name_source=False,
            body=body,
            headers=headers,
            **options,
        )


def rejected_by_status(answer: httpx.Response, error: ServiceError) -> TransactionRejected:
    """Make the rejection of a transaction answered 4xx/5xx, naming the entry if known."""
    texts = operation_outcome_texts(answer.content)
    match = next((m for text in texts if (m := _ENTRY_NUMBER.search(text))), None)
    return TransactionRejected(
        answer,
        error.message,
        failed_entry=int(match.group(1)) if match else None,
        outcome=truncate("; ".join(texts), MAX_MESSAGE_CHARS),
        cause=error,
    )


def checked_transaction_response(answer: httpx.Response, sent: int) -> JsonObject:
    """Parse the ``transaction-response``; a failed or missing entry is rejected.

    Note: raises ``TransactionRejected``.
    """
    bundle = as_object(json_or_none(answer.content))
    if bundle.get("resourceType") != "Bundle":
        raise _bad_answer(answer, "the answer is not a Bundle")
    entries = as_array(bundle.get("entry"))
    # the first entry whose response.status is not 2xx fails the batch
    for index, entry in enumerate(entries):
        said = as_object(as_object(entry).get("response"))
        status = str(said.get("status", ""))
        code = status.split(" ", 1)[0]
        if not (code.isdigit() and 200 <= int(code) < 300):
            # no OperationOutcome (none, or another JSON value) has no texts
            texts = operation_outcome_texts(orjson.dumps(said.get("outcome")))
            outcome = truncate("; ".join(texts), MAX_MESSAGE_CHARS)
            # the server's own words
            shown = plain_text(truncate(status, MAX_STATUS_CHARS)) or "no status"
            message = f"entry {index + 1} failed with {shown}" + (f": {outcome}" if outcome else "")
            raise TransactionRejected(answer, message, failed_entry=index, outcome=outcome)
    if len(entries) != sent:
        raise _bad_answer(
            answer, f"the transaction-response has {len(entries)} entries for {sent} sent"
        )
    return bundle


def _bad_answer(answer: httpx.Response, reason: str) -> TransactionRejected:
    return TransactionRejected(answer, f"{reason}; the server's answer cannot confirm the batch")
