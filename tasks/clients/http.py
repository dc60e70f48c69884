"""The one place outgoing HTTP clients are made: TLS, credentials, timeouts and retry.

Steps never build ``httpx`` clients themselves::

    endpoint = ServiceEndpoint("pseudonymizer", settings.services.pseudonymizer.url,
                               settings.services.pseudonymizer.auth, http_timeout(pseudonymizer.timeout))
    with build_client(endpoint, settings.tls) as client:
        response = request_with_retry(client, "POST", "/fhir/$de-identify", retry=settings.retry,
                                      operation="pseudonymize bundle", json=bundle)

Relative URLs resolve against the service's base URL. Clients follow redirects through their auth flow (see
``tasks.clients.auth``), so there is no need to pass ``follow_redirects=True``; credentials reach only the
service's origin either way.

Retry: ``retry.max_attempts`` attempts in total. Before retry n (n = 0 for the first retry) the wait is
``min(initial_backoff_ms * 2**n, max_backoff_ms)``; a Retry-After header replaces it, capped at
``max_backoff_ms``. Transient: network errors (by exception type), 408, 429, 5xx. Terminal: other 4xx,
untrusted certificates, unsupported URL schemes. Calls that could create something twice are made with
``retryable=False`` and attempted exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

import certifi
import httpx
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from tasks.clients.auth import ServiceAuth
from tasks.clients.errors import (
    ServiceError,
    is_transient_network_error,
    network_error,
    raise_for_service_status,
    raise_for_service_status_async,
)

if TYPE_CHECKING:
    from config.settings import AuthSettings, RetrySettings, TlsSettings

log = logging.getLogger("dupflow.clients")

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=10)


def http_timeout(read: timedelta, *, connect: timedelta = DEFAULT_CONNECT_TIMEOUT) -> httpx.Timeout:
    """A per-request timeout from a configured duration: ``read`` bounds each read, write and pool wait."""
    return httpx.Timeout(read.total_seconds(), connect=min(connect, read).total_seconds())


@dataclass(frozen=True)
class ServiceEndpoint:
    """Where a service lives and how to authenticate to it. ``name`` appears in logs and errors."""

    name: str
    base_url: str
    auth: AuthSettings | None = None
    timeout: httpx.Timeout = field(default_factory=lambda: http_timeout(timedelta(seconds=30)))


# --- TLS ---------------------------------------------------------------------------------------------------


def ssl_verify(tls: TlsSettings, *, purpose: str) -> ssl.SSLContext | bool:
    """The ``verify`` value for httpx: system and certifi CAs plus ``ca_cert_path``, or False when skipping.

    ``purpose`` names the client in the warning logged when verification is off.
    """
    if tls.insecure_skip_verify:
        log.warning(
            "TLS certificate verification is disabled for %s (tls.insecure_skip_verify); "
            "use this for development and testing only",
            purpose,
        )
        return False
    return trusted_context(tls.ca_cert_path)


@functools.lru_cache(maxsize=8)
def trusted_context(ca_cert_path: str | None) -> ssl.SSLContext:
    """One SSL context per CA configuration (building one loads every CA: about 0.25 s here), shared by clients."""
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=certifi.where())
    if ca_cert_path:
        try:
            context.load_verify_locations(cafile=ca_cert_path)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"tls.ca_cert_path {ca_cert_path}: cannot load PEM bundle: {exc}") from exc
    return context


# --- client factory ----------------------------------------------------------------------------------------


def _client_options(endpoint: ServiceEndpoint, tls: TlsSettings) -> tuple[ServiceAuth, dict]:
    verify = ssl_verify(tls, purpose=endpoint.name)
    auth = ServiceAuth(endpoint.name, endpoint.base_url, endpoint.auth, verify)
    options = {
        "base_url": endpoint.base_url,
        "auth": auth,
        "verify": verify,
        "timeout": endpoint.timeout,
        "follow_redirects": False,  # ServiceAuth follows them, checking each hop's origin
    }
    return auth, options


def build_client(endpoint: ServiceEndpoint, tls: TlsSettings) -> httpx.Client:
    """A configured client rooted at the service's URL; close it (``with``) when done."""
    auth, options = _client_options(endpoint, tls)
    return httpx.Client(**options, event_hooks={"request": [auth.strip_foreign_credentials]})


def build_async_client(endpoint: ServiceEndpoint, tls: TlsSettings) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` counterpart of ``build_client``."""
    auth, options = _client_options(endpoint, tls)
    return httpx.AsyncClient(**options, event_hooks={"request": [auth.strip_foreign_credentials_async]})


def service_name(client: httpx.Client | httpx.AsyncClient) -> str | None:
    """The endpoint name of a client made by this module (used in error messages)."""
    return client.auth.service if isinstance(client.auth, ServiceAuth) else None


# --- retry -------------------------------------------------------------------------------------------------


def backoff_seconds(retry: RetrySettings, attempt: int) -> float:
    """Wait before retry ``attempt`` (0 for the first retry): min(initial * 2^attempt, max)."""
    return min(retry.initial_backoff_ms * 2**attempt, retry.max_backoff_ms) / 1000


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: a transient ServiceError or a transient network error."""
    if isinstance(exc, ServiceError):
        return exc.transient
    return is_transient_network_error(exc)


def _wait_seconds(retry: RetrySettings) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = exc.retry_after if isinstance(exc, ServiceError) else None
        if retry_after is not None:
            return min(retry_after, retry.max_backoff_ms / 1000)
        return backoff_seconds(retry, state.attempt_number - 1)

    return wait


def describe_exception(exc: BaseException | None) -> str:
    """The exception's text, or its type where the text is empty (many network errors have none)."""
    if exc is None:
        return "no error"
    return str(exc) or type(exc).__name__


def _retry_policy(retry: RetrySettings, *, operation: str, service: str | None, retryable: bool) -> dict:
    attempts = retry.max_attempts if retryable else 1

    def log_retry(state: RetryCallState) -> None:
        log.warning(
            "%s%s failed (%s); attempt %d of %d, retrying in %.1f s",
            f"{service}: " if service else "",
            operation,
            describe_exception(state.outcome.exception()),
            state.attempt_number,
            attempts,
            state.next_action.sleep if state.next_action else 0.0,
        )

    return {
        "stop": stop_after_attempt(attempts),
        "wait": _wait_seconds(retry),
        "retry": retry_if_exception(is_transient),
        "before_sleep": log_retry,
        "reraise": True,
    }


def call_with_retry(
    fn: Callable[[], T],
    retry: RetrySettings,
    *,
    operation: str,
    service: str | None = None,
    retryable: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it succeeds, fails terminally, or ``retry.max_attempts`` attempts are used up.

    ``fn`` signals failure by raising (a ``ServiceError`` or an httpx error). A network error that is still
    failing at the end is raised as a ``ServiceError`` (status None). ``retryable=False``: exactly one attempt.
    """
    try:
        return Retrying(sleep=sleep, **_retry_policy(retry, operation=operation, service=service, retryable=retryable))(
            fn
        )
    except httpx.TransportError as exc:
        raise network_error(exc, operation=operation, service=service) from exc


async def call_with_retry_async(
    fn: Callable[[], Awaitable[T]],
    retry: RetrySettings,
    *,
    operation: str,
    service: str | None = None,
    retryable: bool = True,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``call_with_retry`` for coroutine functions."""
    try:
        return await AsyncRetrying(
            sleep=sleep, **_retry_policy(retry, operation=operation, service=service, retryable=retryable)
        )(fn)
    except httpx.TransportError as exc:
        raise network_error(exc, operation=operation, service=service) from exc


def request_with_retry(
    client: httpx.Client,
    method: str,
    url: str | httpx.URL,
    *,
    retry: RetrySettings,
    operation: str,
    retryable: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    **request_kwargs,
) -> httpx.Response:
    """``client.request`` with retry; a 4xx/5xx answer becomes a ``ServiceError``. Returns the read response."""
    service = service_name(client)

    def attempt() -> httpx.Response:
        response = client.request(method, url, **request_kwargs)
        raise_for_service_status(response, operation=operation, service=service)
        return response

    return call_with_retry(attempt, retry, operation=operation, service=service, retryable=retryable, sleep=sleep)


async def request_with_retry_async(
    client: httpx.AsyncClient,
    method: str,
    url: str | httpx.URL,
    *,
    retry: RetrySettings,
    operation: str,
    retryable: bool = True,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    **request_kwargs,
) -> httpx.Response:
    """``request_with_retry`` for an ``httpx.AsyncClient``."""
    service = service_name(client)

    async def attempt() -> httpx.Response:
        response = await client.request(method, url, **request_kwargs)
        await raise_for_service_status_async(response, operation=operation, service=service)
        return response

    return await call_with_retry_async(
        attempt, retry, operation=operation, service=service, retryable=retryable, sleep=sleep
    )


# --- request bodies ---------------------------------------------------------------------------------------


class ReplayableBody:
    """A request body streamed from a function, afresh each time httpx iterates it: on every retry attempt, and
    when an OAuth token is replaced after a 401 (the auth flow then need not hold the whole body in memory)."""

    def __init__(self, make: Callable[[], Iterable[bytes]]):
        self._make = make

    def __iter__(self) -> Iterator[bytes]:
        yield from self._make()


# --- the service client ------------------------------------------------------------------------------------


class ServiceClient:
    """A client for one configured service that retries and classifies every call by default.

    ``request`` retries transient failures (network errors, 408, 429, 5xx) per ``retry.*`` and raises a
    ``ServiceError`` for any 4xx/5xx answer. A call that could create something twice (the extraction
    submission) says so with ``idempotent=False`` and is attempted exactly once. ``http`` is the underlying
    ``httpx.Client`` for streaming downloads, which have their own retry rules.
    """

    def __init__(self, endpoint: ServiceEndpoint, tls: TlsSettings, retry: RetrySettings):
        self.endpoint = endpoint
        self.retry = retry
        self.http = build_client(endpoint, tls)

    def request(
        self, method: str, url: str | httpx.URL, *, operation: str, idempotent: bool = True, **request_kwargs
    ) -> httpx.Response:
        return request_with_retry(
            self.http, method, url, retry=self.retry, operation=operation, retryable=idempotent, **request_kwargs
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncServiceClient:
    """``ServiceClient`` for asyncio code (bounded fan-out of many requests on one connection pool)."""

    def __init__(self, endpoint: ServiceEndpoint, tls: TlsSettings, retry: RetrySettings):
        self.endpoint = endpoint
        self.retry = retry
        self.http = build_async_client(endpoint, tls)

    async def request(
        self, method: str, url: str | httpx.URL, *, operation: str, idempotent: bool = True, **request_kwargs
    ) -> httpx.Response:
        return await request_with_retry_async(
            self.http, method, url, retry=self.retry, operation=operation, retryable=idempotent, **request_kwargs
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
