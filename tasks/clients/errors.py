"""Typed errors of outgoing service calls: transient (worth retrying) or terminal.

Response bodies are never echoed (secrets, patient data): only a FHIR OperationOutcome's texts are
taken over, truncated. Every text that leaves a client is redacted: ``ServiceError`` messages when
made, OperationOutcome texts when taken. The clients' part of the exception tree (the root's:
``tasks.core.errors``)::

    DupflowError
    ├── ServiceError                a failed call: operation, HTTP status, transient or terminal
    │   ├── TransactionRejected     fhir_server
    │   └── JobNotFoundError, TransitionRefusedError, SearchRejectedError   extraction_jobs
    ├── ValidationServiceError      validator: a 2xx answer that is no OperationOutcome
    └── StepError
        ├── ExtractionError         extraction_documents
        │   ├── InvalidCrtdlError, DeadHandleError, ExtractionCancelledError,
        │   └── ExtractionTimeoutError, StatusUrlMismatchError
        ├── DownloadError           downloads
        └── PseudonymizationError   pseudonymizer: EntryTooLargeError
"""

import email.utils
import ssl
from collections.abc import Mapping
from contextlib import suppress
from datetime import datetime, UTC
from typing import Any, TypedDict, Unpack

import httpx
import orjson

from tasks.core.json_shapes import as_object, as_objects
from tasks.core.errors import DupflowError
from tasks.core.readable import plain_text, truncate
from tasks.core.redaction import redact
from tasks.core.url_credentials import shown_url

MAX_TEXT_CHARS = 500
MAX_MESSAGE_CHARS = 2000
MAX_PARSED_BODY_BYTES = 1_000_000
BODY_LIMIT = (
    "the body limit of the server (or of a proxy before it, such as nginx's client_max_body_size)"
)
"""What a 413 asks to raise: a proxy answers for the service (nginx's 413 is an HTML page naming
neither)."""
BODY_FRAMING_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
"""Headers that no longer describe a body read and decoded here (``answered``)."""
SERVICE_SETTING = "dupflow.service_setting"
"""The request extension naming the configuration key of the URL (or OAuth issuer) whose origin it
goes to."""


class Call(TypedDict):
    """The keywords that name a call in its errors."""

    operation: str
    service: str | None


class ServiceError(DupflowError):
    """A failed call to a service.

    Note: ``retry_after``: the server's Retry-After in seconds. ``no_answer``: no complete answer
    came at all (a network error, a missed deadline), unlike an answer refused or not usable.
    """

    operation: str  # always named, unlike a DupflowError's

    def __init__(
        self,
        operation: str,
        status_code: int | None,
        message: str,
        *,
        transient: bool = False,
        service: str | None = None,
        retry_after: float | None = None,
        no_answer: bool = False,
    ):
        self.service, self.retry_after, self.no_answer = service, retry_after, no_answer
        # A service's own words come from outside: escape sequences, forged lines and bidi marks
        # become spaces.
        super().__init__(
            plain_text(redact(message)),
            operation=operation,
            status_code=status_code,
            transient=transient,
        )
        who = f"{service}: " if service else ""
        status = f" with HTTP {status_code}" if status_code is not None else ""
        # what str() shows
        self.args = (redact(f"{who}{operation} failed{status} ({self.kind}): {self.message}"),)


def is_transient_status(status_code: int) -> bool:
    """408, 429 and every 5xx are worth retrying; other 4xx are not."""
    return status_code in (408, 429) or status_code >= 500


def is_transient_network_error(exc: BaseException) -> bool:
    """Tell whether a transport error is transient.

    Note: all are, except a URL we cannot speak to or a certificate we do not trust.
    """
    if not isinstance(exc, httpx.TransportError) or isinstance(exc, httpx.UnsupportedProtocol):
        return False
    return not _caused_by(exc, ssl.SSLCertVerificationError)


def _caused_by(exc: BaseException | None, cause_type: type[BaseException]) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and not isinstance(exc, cause_type):
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return isinstance(exc, cause_type)


def network_error(
    exc: httpx.TransportError, *, operation: str, service: str | None
) -> ServiceError:
    """Turn a transport error into a ``ServiceError`` naming where and the fix.

    Note: a connection not made (unlike a TLS handshake: something answered) names the key of its
    URL (``SERVICE_SETTING``): ``; nothing answers at <origin>: …``.
    """
    try:
        request: httpx.Request | None = exc.request
    except RuntimeError:  # raised before a request existed
        request = None
    at = "" if request is None else f" at {shown_url(str(request.url))}"
    message = f"network error: {type(exc).__name__}: {exc}{at}"
    if _caused_by(exc, ssl.SSLCertVerificationError):
        message += "; the server's certificate is not trusted: give its CA with tls.ca_cert_path"
    elif isinstance(exc, httpx.UnsupportedProtocol):
        message += "; only http and https URLs can be fetched"
    elif (
        isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
        and not _caused_by(exc, ssl.SSLError)
        and request is not None
        and isinstance(setting := request.extensions.get(SERVICE_SETTING), str)
    ):
        origin = f"{request.url.scheme}://{request.url.netloc.decode('ascii')}"
        message += nothing_answers_at(origin, setting)
    return ServiceError(
        operation,
        None,
        message,
        transient=is_transient_network_error(exc),
        service=service,
        no_answer=True,
    )


def nothing_answers_at(origin: str, setting: str) -> str:
    return (
        f"; nothing answers at {shown_url(origin)}: is the service running there, and is "
        f"{setting} right?"
    )


def error_from_response(
    response: httpx.Response,
    *,
    hints: Mapping[int, str] | None = None,
    **call: Unpack[Call],
) -> ServiceError:
    """Make a 4xx/5xx response's error from its content, with the fix ``hints`` knows."""
    texts = operation_outcome_texts(response.content)
    status_line = f"HTTP {response.status_code} {response.reason_phrase}"
    message = truncate("; ".join(texts), MAX_MESSAGE_CHARS) if texts else status_line
    if hint := (hints or {}).get(response.status_code):
        message = f"{message}; {hint}"
    return ServiceError(
        call["operation"],
        response.status_code,
        message,
        transient=is_transient_status(response.status_code),
        service=call["service"],
        retry_after=parse_retry_after(response.headers.get("Retry-After")),
    )


def raise_for_service_status(
    response: httpx.Response, *, hints: Mapping[int, str] | None = None, **call: Unpack[Call]
) -> None:
    """Raise a ``ServiceError`` for a 4xx/5xx response.

    Why: at most ``MAX_PARSED_BODY_BYTES`` of a streamed body is read: only an OperationOutcome's
    texts are used, and an error page can be of any size.
    """
    if response.is_error:
        raise error_from_response(answered(response, first_bytes(response)), hints=hints, **call)


def first_bytes(response: httpx.Response, limit: int = MAX_PARSED_BODY_BYTES) -> bytes:
    """Return an answer's body: whole if read, else read until its end or ``limit``."""
    body = bytearray()
    for piece in response.iter_bytes():  # a read response's content comes in one piece
        body += piece
        if len(body) > limit:
            break
    return bytes(body)


def answered(response: httpx.Response, body: bytes) -> httpx.Response:
    """Return ``response`` with ``body`` as its content and its status line as sent.

    Note: without its framing headers; an error made of it says the server's reason phrase.
    """
    headers = [(k, v) for k, v in response.headers.multi_items() if k not in BODY_FRAMING_HEADERS]
    # the status line as sent is in the extensions (http_version, reason_phrase)
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=body,
        request=response.request,
        extensions=response.extensions,
    )


def operation_outcome_texts(body: bytes) -> list[str]:
    """Return an OperationOutcome's diagnostics and details texts, redacted.

    Note: each is truncated and made plain, too.
    """
    if not body or len(body) > MAX_PARSED_BODY_BYTES:
        return []
    outcome = as_object(json_or_none(body))
    if outcome.get("resourceType") != "OperationOutcome":
        return []
    texts: list[str] = []
    for issue in as_objects(outcome.get("issue")):
        for text in (issue.get("diagnostics"), as_object(issue.get("details")).get("text")):
            if isinstance(text, str) and text.strip():
                texts.append(plain_text(truncate(redact(text.strip()), MAX_TEXT_CHARS)))
    return texts


def json_or_none(body: bytes) -> Any:
    """An answer's body parsed by orjson; None when it is no JSON or nested too deeply.

    Why: orjson reads 1,024 levels but writes 254; a copy or a text (``str`` and ``json`` recurse
    too) made of a deeper answer would fail.
    """
    try:
        document = orjson.loads(body)
        orjson.dumps(document)  # too deep: a TypeError
    except (ValueError, TypeError):
        return None
    return document


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Return the seconds a Retry-After header asks for; None when absent or invalid.

    Note: delay-seconds or an HTTP date.
    """
    value = (value or "").strip()  # "" is neither a number nor a date: None
    with suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
