"""Bounds of one service call: a whole-request deadline, a cap on the answer read.

Note: also the bodies the clients stream. See docs/development.md#service-clients.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NotRequired, Unpack

import httpx

from tasks.clients.errors import Call, ServiceError
from tasks.core.json_shapes import JsonObject
from tasks.core.readable import size_text
from tasks.core.url_credentials import shown_url

MB = 1024 * 1024
# a request body goes out in pieces of this size, the deadline checked before each
UPLOAD_PIECE = MB
# for a connection its deadline can shut down (Deadline.watch)
OWN_CONNECTION = {"Connection": "close"}
# its bytes, or a function making its pieces afresh for each send
Body = Callable[[], Iterable[bytes]] | bytes
BODY_FRAMING_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
"""Headers that no longer describe a body read and decoded here (``answered``)."""
STATUS_LINE = ("http_version", "reason_phrase")  # httpx keeps them in a response's extensions


class Deadline:
    """The end of one call, ``seconds`` from now.

    Note: ``setting`` (what sets it) and ``url`` are named in its error.
    """

    def __init__(self, seconds: float, setting: str, url: str | httpx.URL | None = None):
        self.seconds, self.setting, self.url = seconds, setting, url
        self._end = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._watched: int | None = None

    def check(self, operation: str, service: str | None) -> None:
        if self.passed():
            raise self.exceeded(operation, service)

    def passed(self) -> bool:
        return time.monotonic() >= self._end

    def watch(self) -> JsonObject:
        """Return the extensions of a sync request on its own connection.

        Why: at the deadline its socket is shut down, which ends a read blocked on a server that
        drips its headers.
        Note: call ``release`` when the answer is closed.
        """
        self._watched = _WATCHDOG.watch(self._end, self)
        return {"trace": self._note_connection}

    def release(self) -> None:
        with self._lock:
            self._sockets = []  # closed with the answer; nothing left to shut down
        if self._watched is not None:
            _WATCHDOG.forget(self._watched)

    def _note_connection(self, event: str, info: JsonObject) -> None:
        if event in (
            "connection.connect_tcp.complete",
            "connection.start_tls.complete",
        ) and info.get("return_value"):
            with self._lock:
                self._sockets.append(info["return_value"].get_extra_info("socket"))
            if self.passed():
                self.shut_down()

    def shut_down(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def exceeded(self, operation: str, service: str | None) -> ServiceError:
        source = f" from {shown_url(str(self.url))}" if self.url is not None else ""
        message = (
            f"no complete answer{source} within {round(self.seconds, 1):g} s, the deadline of one "
            "request"
        )
        return ServiceError(
            operation,
            None,
            f"{message} ({self.setting})",
            transient=True,
            service=service,
            no_answer=True,
        )

    def pieces(self, body: Iterable[bytes], operation: str, service: str | None) -> Iterator[bytes]:
        """Yield ``body`` as it is sent, checking the deadline before each piece.

        Why: against a server that reads slowly.
        """
        for piece in body:
            self.check(operation, service)
            yield piece


class _Watchdog:
    """One thread per process, shutting down the connections whose deadline passed.

    Why:
    - A timer thread per request cost each of the pseudonymizer's many small requests a thread
      start.
    Note: a released deadline is forgotten at once, and the heap rebuilt once most of it is
    released, so it holds about the requests in flight, not all those of the last deadline's span.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int]] = []
        self._live: dict[int, Deadline] = {}
        self._changed = threading.Condition()
        self._order = itertools.count()
        self._pid = 0

    def watch(self, end: float, deadline: Deadline) -> int:
        with self._changed:
            if self._pid != os.getpid():  # the first deadline of this process (or of a fork)
                self._pid, self._due, self._live = os.getpid(), [], {}
                threading.Thread(target=self._run, name="deadlines", daemon=True).start()
            key = next(self._order)
            self._live[key] = deadline
            heapq.heappush(self._due, (end, key))
            if self._due[0][1] == key:
                self._changed.notify()
            return key

    def forget(self, key: int) -> None:
        with self._changed:
            self._live.pop(key, None)
            if len(self._due) > 2 * len(self._live) + 64:
                self._due = [entry for entry in self._due if entry[1] in self._live]
                heapq.heapify(self._due)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    if (deadline := self._live.pop(heapq.heappop(self._due)[1], None)) is not None:
                        deadline.shut_down()
                self._changed.wait(self._due[0][0] - now if self._due else None)


_WATCHDOG = _Watchdog()


class ReplayableBody:
    """A request body made afresh for each send, never held whole in memory.

    Note: each send is a retry or a resend after a 401.
    """

    def __init__(self, make: Callable[[], Iterable[bytes]]):
        self._make = make

    def __iter__(self) -> Iterator[bytes]:
        yield from self._make()


class UnreadBody(httpx.SyncByteStream):
    """The body of an answer not used (a redirect's, a 401's), left unread.

    Why: httpx would read it whole before the next request.
    Note: closing it closes the connection, which cannot carry another request.
    """

    def __init__(self, stream: httpx.SyncByteStream):
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        yield from ()

    def close(self) -> None:
        self._stream.close()


class CappedBody(httpx.SyncByteStream):
    """A sync answer's body as sent, at most ``limit`` bytes of it.

    Note: ``too_large()`` is raised once more comes.
    """

    def __init__(
        self, stream: httpx.SyncByteStream, limit: int, too_large: Callable[[], Exception]
    ):
        self._stream, self._limit, self._too_large = stream, limit, too_large

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for piece in self._stream:
            seen += len(piece)
            if seen > self._limit:
                raise self._too_large()
            yield piece

    def close(self) -> None:
        self._stream.close()


def replayable(request: httpx.Request) -> bool:
    """Tell whether a request's body can be streamed again.

    Note: httpx keeps the iterable given as ``content`` as ``stream._stream``.
    """
    return isinstance(getattr(request.stream, "_stream", None), ReplayableBody)


class TooLarge(Call):
    """The keywords of ``answer_too_large`` besides the size."""

    hint: str
    source: NotRequired[httpx.URL | None]  # the answer's URL, named when known


@contextlib.contextmanager
def answer_within(
    http: httpx.Client,
    deadline: Deadline,
    method: str,
    url: str,
    *,
    operation: str,
    service: str | None,
    body: Body | None = None,
    headers: dict[str, str] | None = None,
    **request: Any,
) -> Iterator[httpx.Response]:
    """Stream the answer to a sync request on its own connection, shut at ``deadline``.

    Note: a network error then is the deadline's error; ``body`` is checked against it piece by
    piece.
    Why: bytes are declared by their ``Content-Length``: in pieces they would go chunked, which some
    servers refuse.
    """
    pieces = (lambda: in_pieces(body)) if isinstance(body, bytes) else body
    content = (
        None
        if pieces is None
        else ReplayableBody(lambda: deadline.pieces(pieces(), operation, service))
    )
    declared = {"Content-Length": str(len(body))} if isinstance(body, bytes) else {}
    headers = {**declared, **(headers or {}), **OWN_CONNECTION}
    built = http.build_request(
        method, url, content=content, headers=headers, extensions=deadline.watch(), **request
    )
    deadline.url = built.url
    try:
        response = http.send(built, stream=True)
        try:
            deadline.check(operation, service)
            yield response
        finally:
            response.close()
    except httpx.TransportError:
        deadline.check(operation, service)
        raise
    finally:
        deadline.release()


def in_pieces(body: bytes) -> Iterator[bytes]:
    view = memoryview(body)
    return (
        bytes(view[start : start + UPLOAD_PIECE]) for start in range(0, len(view), UPLOAD_PIECE)
    )


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
    return ServiceError(operation, None, message, transient=False, service=service)


def declared_size(response: httpx.Response) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def read_answer(
    response: httpx.Response,
    limit: int,
    *,
    deadline: Deadline | None = None,
    **where: Unpack[TooLarge],
) -> bytes:
    """Read a streamed ``response``'s body, at most ``limit`` bytes of it.

    Note: ``deadline`` is checked after each piece.
    """
    if (size := declared_size(response)) is not None and size > limit:
        raise answer_too_large(size_text(size), limit, **where)
    body = bytearray()
    for piece in response.iter_bytes():
        body += piece
        if len(body) > limit:
            raise answer_too_large(f"over {size_text(limit)}", limit, **where)
        if deadline is not None:
            deadline.check(where["operation"], where["service"])
    return bytes(body)


def answered(response: httpx.Response, body: bytes) -> httpx.Response:
    """Return ``response`` with ``body`` as its content and its status line as sent.

    Note: without its framing headers; an error made of it says the server's reason phrase.
    """
    headers = [
        (k, v) for k, v in response.headers.multi_items() if k.lower() not in BODY_FRAMING_HEADERS
    ]
    answer = httpx.Response(
        response.status_code, headers=headers, content=body, request=response.request
    )
    answer.extensions = {
        key: response.extensions[key] for key in STATUS_LINE if key in response.extensions
    }
    return answer
