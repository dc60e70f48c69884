"""A recording HTTP server: it answers scripted replies, or forwards to an upstream as a reverse proxy.

Every request is recorded (method, path, headers, body) so tests can check exactly what went over the wire.
Replies are consumed one per request from ``EchoState.replies``; when the script is empty the server answers
200 with a small JSON body. A reply can stall first (``delay``) or instead reset the connection (RST, no
answer at all). With ``upstream`` set and no scripted reply left, the request is forwarded there and the
upstream's answer relayed.

    state = EchoState(replies=[Reply(503, {"Retry-After": "2"}), Reply(200)])
    with LoopbackServer(EchoHandler, state) as server: ...
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.fakes._server import LengthOnlyHandler, serve_forever_cli

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"ok": true}'
    reset: bool = False  # abort the connection with a TCP reset instead of answering
    delay: float = 0.0  # seconds to stall before answering (to provoke client read timeouts)
    drip: float = 0.0  # seconds between the body's bytes, sent one at a time (within any read timeout)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass
class EchoState:
    replies: deque[Reply] | list[Reply] = field(default_factory=deque)
    upstream: str | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    allow_chunked: bool = True  # botocore sends chunked bodies, which S3 takes; False: a Content-Length-only server
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.replies = deque(self.replies)

    def record(self, request: RecordedRequest) -> Reply | None:
        with self.lock:
            self.requests.append(request)
            return self.replies.popleft() if self.replies else None


class EchoHandler(LengthOnlyHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def _handle(self) -> None:
        state: EchoState = self.server.state
        body = self._read_body()
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = state.record(RecordedRequest(self.command, self.path, headers, body))
        time.sleep(reply.delay if reply else 0.0)
        if reply is not None and reply.reset:
            self._reset_connection()
        elif reply is None and state.upstream:
            self._forward(state.upstream, body)
        else:
            self._answer(reply or Reply())

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle

    def _read_body(self) -> bytes:
        """The request body, de-chunked when it came with Transfer-Encoding: chunked (as botocore sends it)."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # CRLF after the chunk
        while self.rfile.readline().strip():  # trailer fields up to the empty line
            pass
        return b"".join(chunks)

    def _answer(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if "content-type" not in {name.lower() for name in reply.headers}:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self._write_body(reply)

    def _write_body(self, reply: Reply) -> None:
        if not reply.drip:
            self.wfile.write(reply.body)
            return
        try:
            for byte in reply.body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(reply.drip)
        except OSError:  # the client gave up
            pass

    def _reset_connection(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _forward(self, upstream: str, body: bytes) -> None:
        target = urlsplit(upstream)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP}
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            content = answer.read()
        finally:
            connection.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)


def operation_outcome(*diagnostics: str) -> bytes:
    """A FHIR OperationOutcome body with one error issue per diagnostics text."""
    issues = [{"severity": "error", "code": "processing", "diagnostics": text} for text in diagnostics]
    return json.dumps({"resourceType": "OperationOutcome", "issue": issues}).encode()


if __name__ == "__main__":
    serve_forever_cli(EchoHandler, EchoState(), "recording echo server")
