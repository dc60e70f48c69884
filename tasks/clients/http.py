"""The one place outgoing HTTP clients are made: TLS, credentials and timeouts.

Redirects go through the auth flow (credentials reach only the service's origin); retries through
``tasks.clients.retry``. See docs/development.md#service-clients.
"""

from __future__ import annotations

import functools
import logging
import ssl
from urllib.parse import urlsplit, urlunsplit
from collections.abc import Callable, Container, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import certifi
import httpx

from tasks.clients.auth import AS_SENT, ServiceAuth, refuse_compressed
from tasks.clients.bounds import (
    MB,
    Deadline,
    answer_within,
    read_answer,
    within_deadlines,
)
from tasks.clients.errors import Call, ServiceError, answered, error_from_response, first_bytes
from tasks.clients.retry import call_once, call_with_retry
from tasks.streams.fanout import Sleep, pause, stopping

if TYPE_CHECKING:
    from config.services import AuthSettings
    from config.settings import RetrySettings, TlsSettings

log = logging.getLogger("dupflow.clients")

DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=10)
INSECURE_WARNING = (
    "TLS certificate verification is disabled for %s (tls.insecure_skip_verify); use this for "
    "development and testing only"
)
FHIR_JSON = "application/fhir+json"
FHIR_JSON_HEADERS = {"Content-Type": FHIR_JSON, "Accept": FHIR_JSON}
MAX_ANSWER_BYTES = 16 * MB  # unless a call passes max_answer_bytes
UNCOMPRESSED_FIX = (
    "configure the service (or a proxy before it) not to compress its answers to this client"
)
TOO_LARGE_HINT = (
    "check that the service URL points at the service; an answer this large is not one dupflow "
    "expects"
)


def http_timeout(read: timedelta) -> httpx.Timeout:
    """Make a per-request timeout from a configured duration.

    Note: ``read`` bounds each read, write and pool wait; a connect at most 10 s.
    """
    return httpx.Timeout(
        read.total_seconds(), connect=min(DEFAULT_CONNECT_TIMEOUT, read).total_seconds()
    )


class ServiceEndpoint(NamedTuple):
    """Where a service lives and how to log in; ``name`` is said in logs and errors."""

    name: str
    base_url: str
    auth: AuthSettings | None = None
    timeout: timedelta = timedelta(seconds=30)
    # at least httpx's default 100; more requests in flight wait for one within their timeout
    max_connections: int = 100
    setting: str | None = None
    """The configuration key of ``base_url``, named (with its OAuth issuer's key) should nothing
answer there."""

    @property
    def url_without_query(self) -> str:
        """Return ``base_url`` without its query and fragment, to join request paths to.

        Why: httpx would put the paths after the query; ``ServiceAuth`` adds the query (a
        credential such as ``?access_token=…``) to each request to the service.
        """
        return urlunsplit(urlsplit(self.base_url)._replace(query="", fragment=""))


def ssl_verify(tls: TlsSettings, *, purpose: str) -> ssl.SSLContext | bool:
    """Return httpx's ``verify``: system, certifi and ``ca_cert_path`` CAs, or False.

    Note: False warns about ``purpose``.
    """
    if tls.insecure_skip_verify:
        log.warning(INSECURE_WARNING, purpose)
        return False
    return trusted_context(tls.ca_cert_path)


@functools.lru_cache(maxsize=8)
def trusted_context(ca_cert_path: str | None) -> ssl.SSLContext:
    """Return the SSL context of a CA configuration, one shared by all clients.

    Why: building one loads every CA: about 0.25 s here.
    """
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=certifi.where())
    if ca_cert_path:
        try:
            context.load_verify_locations(cafile=ca_cert_path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"tls.ca_cert_path {ca_cert_path}: cannot load PEM bundle: {exc}"
            ) from exc
    return context


def build_client(endpoint: ServiceEndpoint, tls: TlsSettings) -> httpx.Client:
    verify = ssl_verify(tls, purpose=endpoint.name)
    auth = ServiceAuth(endpoint.name, endpoint.base_url, endpoint.auth, verify, endpoint.setting)
    client = httpx.Client(
        # its query goes with each request to its origin (auth)
        base_url=endpoint.url_without_query,
        headers=AS_SENT,
        auth=auth,
        verify=verify,
        timeout=http_timeout(endpoint.timeout),
        limits=httpx.Limits(
            max_connections=max(100, endpoint.max_connections), max_keepalive_connections=20
        ),
        follow_redirects=False,  # ServiceAuth follows them, checking each hop's origin
        event_hooks={
            "request": [auth.check_request],
            "response": [functools.partial(refuse_compressed, endpoint.name, UNCOMPRESSED_FIX)],
        },
    )
    return within_deadlines(client)


def service_name(client: httpx.Client) -> str | None:
    return client.auth.service if isinstance(client.auth, ServiceAuth) else None


class Closing:
    """A context manager that closes its ``http`` client."""

    http: httpx.Client

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()


class ServiceClient(Closing):
    """A client for one configured service.

    Note: ``http`` is for clients that stream bodies in their own attempts.
    """

    def __init__(
        self,
        endpoint: ServiceEndpoint,
        tls: TlsSettings,
        retry: RetrySettings,
        *,
        sleep: Sleep = pause,
    ):
        self.endpoint, self.retry, self.sleep = endpoint, retry, sleep
        self.http = build_client(endpoint, tls)

    def request(
        self,
        method: str,
        url: str | httpx.URL,
        *,
        operation: str,
        once: bool = False,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        too_large_hint: str = TOO_LARGE_HINT,
        status_hints: Mapping[int, str] | None = None,
        deadline: Callable[[], Deadline],
        answers: Container[int] = (),
        rejection: Callable[[httpx.Response, ServiceError], ServiceError] | None = None,
        read_body: bool = True,
        name_source: bool = True,
        **request_kwargs: Any,
    ) -> httpx.Response:
        """``http.request`` under the retry policy, reading at most ``max_answer_bytes``.

        Note:
        - ``once``: for a call that could create or destroy something twice (no retry).
        - ``deadline`` makes each attempt's whole-request deadline (``answer_within``); a cancel of
          the fan-out ends the attempt at once.
        - A 4xx/5xx not in ``answers`` is a ``ServiceError`` with the fix ``status_hints`` knows,
          or what ``rejection`` makes of it and the answer.
        - ``read_body``, ``name_source``: whether the body is read, its URL named if too large.
        """
        where: Call = {"operation": operation, "service": self.endpoint.name}

        def attempt() -> httpx.Response:
            bound = deadline()
            with (
                stopping(bound.shut_down),
                answer_within(self.http, bound, method, url, **where, **request_kwargs) as response,
            ):
                if response.is_error and response.status_code not in answers:
                    answer = answered(response, first_bytes(response))
                    error = error_from_response(answer, **where, hints=status_hints)
                    raise error if rejection is None else rejection(answer, error)
                if not read_body:
                    return answered(response, b"")
                source = response.url if name_source else None
                body = read_answer(
                    response, max_answer_bytes, **where, hint=too_large_hint, source=source
                )
                return answered(response, body)

        if once:
            return call_once(attempt, **where)
        return call_with_retry(attempt, self.retry, **where, sleep=self.sleep)
