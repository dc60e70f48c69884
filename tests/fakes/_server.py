"""Run a stdlib HTTP handler on 127.0.0.1 in a background thread.

Every fake in this package is a plain ``http.server`` handler so that tests see real sockets: real
resets, real stalls, real chunked bodies. ``LoopbackServer`` starts it on a free port and stops it
cleanly; ``serve_forever_cli`` lets a fake run alone (``python -m tests.fakes.<name> --port N``, and
``--latency SECONDS`` for the pseudonymizer and the validator). ``LengthOnlyHandler`` is the base of the fakes of
services that read a request body by its ``Content-Length`` only, as many real ones and their fronts do.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import ssl
import threading
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ResettableState:
    """A fake's switches and records, shared by its request threads under ``_lock``."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, kw_only=True)

    def reset(self, **options: Any) -> None:
        """Back to a fresh state with ``options``, so one running server can serve many tests."""
        fresh = type(self)(**options)
        with self._lock:
            for item in fields(self):
                if item.name != "_lock":
                    setattr(self, item.name, getattr(fresh, item.name))


class LengthOnlyHandler(BaseHTTPRequestHandler):
    """A handler that refuses a chunked request body with 411 Length Required, as a server or front reading only
    ``Content-Length`` does (an old-style front; a Java service that then reads an empty body answers 400, blaming
    the input). A fake's state with ``allow_chunked = True`` lets such a body through."""

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if "Transfer-Encoding" not in self.headers or getattr(self.server, "state", None) is None:
            return True
        if getattr(self.server.state, "allow_chunked", False):
            return True
        body = b"411 Length Required: this server reads a request body by its Content-Length only\n"
        self.close_connection = True  # the chunked body is left unread
        self.send_response(411)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default backlog of 5 resets connections under concurrent clients

    def __init__(self, address, handler, state: Any):
        super().__init__(address, handler)
        self.state = state
        self.connections = 0  # accepted so far (keep-alive: fewer than the requests)

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up mid-answer is routine in fault tests; anything else is printed.
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)

    def get_request(self):
        # Without TCP_NODELAY, keep-alive requests wait ~40 ms each on delayed ACKs.
        conn, address = super().get_request()
        self.connections += 1
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


class LoopbackServer:
    """A handler class served on 127.0.0.1; ``state`` is reachable from handlers as ``self.server.state``."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        state: Any = None,
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self._httpd = _Server(("127.0.0.1", port), handler, state)
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True)
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def state(self) -> Any:
        return self._httpd.state

    @property
    def connections(self) -> int:
        """The TCP connections accepted so far."""
        return self._httpd.connections

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever_cli(handler: type[BaseHTTPRequestHandler], state: Any, description: str) -> None:
    """``--port N``, and ``--latency SECONDS`` for a fake whose state has ``latency_seconds``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=8080)
    if hasattr(state, "latency_seconds"):
        parser.add_argument(
            "--latency", type=float, default=state.latency_seconds, metavar="SECONDS", help="wait before each answer"
        )
    args = parser.parse_args()
    if hasattr(state, "latency_seconds"):
        state.latency_seconds = args.latency
    server = LoopbackServer(handler, state, port=args.port)
    print(f"{description} listening on {server.base_url}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server._httpd.serve_forever()
