"""The whole-request deadline of one call (``Deadline``): a per-read timeout never cuts off a server that drips its
answer. Its own module so that the OAuth token fetch (``tasks.clients.auth``), below ``bounds``, can use it too."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from tasks.clients.errors import ServiceError
from tasks.core.url_credentials import shown_url


class Deadline:
    """The end of one call: ``seconds`` from now. ``setting`` names what sets it, and ``url`` (set where the request
    is built, if not given) the address called, for the error message."""

    def __init__(self, seconds: float, setting: str, url: str | httpx.URL | None = None):
        self.seconds, self.setting, self.url = seconds, setting, url
        self._end = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def check(self, operation: str, service: str | None) -> None:
        """Raise the deadline's ``ServiceError`` once it has passed."""
        if self.passed():
            raise self.exceeded(operation, service)

    def passed(self) -> bool:
        return time.monotonic() >= self._end

    def watch(self) -> dict[str, Any]:
        """The extensions of a sync httpx request that opens its own connection (sent with ``Connection: close``):
        at the deadline the request's socket is shut down, which ends a read blocked on a server that drips its
        headers. Call ``release`` when the answer is closed."""
        self._timer = threading.Timer(max(0.0, self._end - time.monotonic()), self._shut_down)
        self._timer.daemon = True
        self._timer.start()
        return {"trace": self._note_connection}

    def release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _note_connection(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep the socket of each connection the request opens."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete") and info.get("return_value"):
            with self._lock:
                self._sockets.append(info["return_value"].get_extra_info("socket"))
            if self.passed():
                self._shut_down()

    def _shut_down(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def exceeded(self, operation: str, service: str | None) -> ServiceError:
        source = f" from {shown_url(str(self.url))}" if self.url is not None else ""
        message = f"no complete answer{source} within {round(self.seconds, 1):g} s, the deadline of one request"
        return ServiceError(
            operation, None, f"{message} ({self.setting})", transient=True, service=service, no_answer=True
        )

    def pieces(self, body: Iterable[bytes], operation: str, service: str | None) -> Iterator[bytes]:
        """``body`` as it is sent, checking the deadline before each piece (a server that reads slowly)."""
        for piece in body:
            self.check(operation, service)
            yield piece
