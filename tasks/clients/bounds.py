"""Bounds of one service call: a whole-request deadline, a cap on the answer read.

Note: also the bodies the clients stream. See docs/development.md#service-clients.
"""

import contextlib
import contextvars
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NotRequired, TypeVar, Unpack

import httpcore
import httpx

from tasks.clients.errors import Call, ServiceError, first_bytes
from tasks.core.readable import size_text
from tasks.core.url_credentials import shown_url

MB = 1024 * 1024
# a write's timeout is cut to the time left before each piece of this size (a slow reader)
WRITE_PIECE = 64 * 1024
# its bytes, or a function making its pieces afresh for each send
Body = Callable[[], Iterable[bytes]] | bytes


class Deadline:
    """The end of one call, ``duration`` from now.

    Note: ``setting`` (what sets it) and ``url`` are named in its error.
    """

    def __init__(self, duration: timedelta, setting: str, url: str | httpx.URL | None = None):
        self.duration, self.setting, self.url = duration, setting, url
        self._end = time.monotonic() + duration.total_seconds()
        self._socket: socket.socket | None = None  # the one its call last waited on

    @contextlib.contextmanager
    def bounding(self) -> Iterator[None]:
        """Bound each socket operation of this thread in the block by the deadline.

        Why: a read blocked on a server dripping its headers ends at it (``BoundedBackend``).
        """
        token = _CALL.set(self)
        try:
            yield
        finally:
            _CALL.reset(token)

    def shut_down(self) -> None:
        """End the call at once (a cancel): a blocked read fails, the next one times out."""
        self._end = 0.0
        if sock := self._socket:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def check(self, operation: str, service: str | None) -> None:
        """Raise the call's ``ServiceError`` once the deadline has passed."""
        if time.monotonic() < self._end:
            return
        source = f" from {shown_url(str(self.url))}" if self.url is not None else ""
        message = (
            f"no complete answer{source} within {round(self.duration.total_seconds(), 1):g} s, "
            "the deadline of one request"
        )
        raise ServiceError(
            operation,
            None,
            f"{message} ({self.setting})",
            transient=True,
            service=service,
            no_answer=True,
        )


_CALL: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("deadline", default=None)


def _capped(
    timeout: float | None, expired: type[Exception], sock: socket.socket | None
) -> float | None:
    """Cut ``timeout`` to the time left of this thread's call, if it has a deadline."""
    if (deadline := _CALL.get()) is None:
        return timeout
    deadline._socket = sock
    if (left := deadline._end - time.monotonic()) <= 0:
        raise expired("the deadline passed")
    return left if timeout is None else min(timeout, left)


class _BoundedStream(httpcore.NetworkStream):
    """A connection whose reads and writes end by the deadline of the call using it."""

    def __init__(self, stream: httpcore.NetworkStream):
        self._stream, self._socket = stream, stream.get_extra_info("socket")

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _capped(timeout, httpcore.ReadTimeout, self._socket))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_PIECE):
            capped = _capped(timeout, httpcore.WriteTimeout, self._socket)
            self._stream.write(buffer[start : start + WRITE_PIECE], capped)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _capped(timeout, httpcore.ConnectTimeout, self._socket)
        return _BoundedStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class BoundedBackend(httpcore.SyncBackend):
    """httpcore's sync network backend, each connection bounded by its call's deadline."""

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *args: Any, **kwargs: Any
    ) -> httpcore.NetworkStream:
        """Connect as httpcore does, within the call's deadline; other arguments as given."""
        timeout = _capped(timeout, httpcore.ConnectTimeout, None)
        return _BoundedStream(super().connect_tcp(host, port, timeout, *args, **kwargs))


ClientT = TypeVar("ClientT", bound=httpx.Client)


def within_deadlines(client: ClientT) -> ClientT:
    """Return ``client``, each of its connection pools using the ``BoundedBackend``.

    Note: httpx makes its pools (the environment's proxies' too) with no backend argument, and a
    transport passed to it turns those proxies off; so the backend goes into the pools made.
    """
    for transport in (client._transport, *client._mounts.values()):
        if isinstance(transport, httpx.HTTPTransport):
            transport._pool._network_backend = BoundedBackend()
    return client


@dataclass
class ReplayableBody:
    """A request body made afresh for each send, never held whole in memory.

    Note: each send is a retry or a resend after a 401.
    """

    make: Callable[[], Iterable[bytes]]

    def __iter__(self) -> Iterator[bytes]:
        yield from self.make()


@dataclass
class _AnswerBody(httpx.SyncByteStream):
    """An answer's body in place of its ``stream``, which closing it closes."""

    stream: httpx.SyncByteStream

    def close(self) -> None:
        self.stream.close()


class UnreadBody(_AnswerBody):
    """The body of an answer not used (a redirect's, a 401's), left unread.

    Why: httpx would read it whole before the next request.
    Note: closing it closes the connection, which cannot carry another request.
    """

    def __iter__(self) -> Iterator[bytes]:
        yield from ()


@dataclass
class CappedBody(_AnswerBody):
    """A sync answer's body as sent, at most ``limit`` bytes of it.

    Note: ``too_large()`` is raised once more comes.
    """

    limit: int
    too_large: Callable[[], Exception]

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for piece in self.stream:
            seen += len(piece)
            if seen > self.limit:
                raise self.too_large()
            yield piece


class TooLarge(Call):
    """The keywords of ``answer_too_large`` besides the size."""

    hint: str
    source: NotRequired[httpx.URL | None]  # the answer's URL, named when known


@contextlib.contextmanager
def answer_within(
    http: httpx.Client,
    deadline: Deadline,
    method: str,
    url: str | httpx.URL,
    *,
    operation: str,
    service: str | None,
    body: Body | None = None,
    **request: Any,
) -> Iterator[httpx.Response]:
    """Stream a sync request's answer, each socket operation bounded by ``deadline``.

    Note: a network error then is the deadline's error.
    """
    content = ReplayableBody(body) if callable(body) else body
    built = http.build_request(method, url, content=content, **request)
    deadline.url = built.url
    try:
        with deadline.bounding(), contextlib.closing(http.send(built, stream=True)) as response:
            deadline.check(operation, service)
            yield response
    except httpx.TransportError:
        deadline.check(operation, service)
        raise


def answer_too_large(
    size: str,
    limit: int,
    *,
    operation: str,
    service: str | None,
    hint: str,
    source: httpx.URL | None = None,
) -> ServiceError:
    answer = "the answer" if source is None else f"the answer from {shown_url(str(source))}"
    message = f"{answer} is {size}, more than the {size_text(limit)} read from this service; {hint}"
    return ServiceError(operation, None, message, service=service)


def declared_size(response: httpx.Response) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def read_answer(response: httpx.Response, limit: int, **where: Unpack[TooLarge]) -> bytes:
    """Read a streamed ``response``'s body, at most ``limit`` bytes of it.

    Note: inside ``answer_within`` each read ends by its deadline (``BoundedBackend``).
    """
    if (size := declared_size(response)) is not None and size > limit:
        raise answer_too_large(size_text(size), limit, **where)
    if len(body := first_bytes(response, limit)) > limit:
        raise answer_too_large(f"over {size_text(limit)}", limit, **where)
    return body
