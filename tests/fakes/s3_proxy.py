"""An authenticating HTTP proxy in front of an S3 store (moto in server mode), with fault switches.

It stands where a site's upstream proxy stands: every request must carry ``Proxy-Authorization: Basic`` with the
configured username and password, or it is answered ``407 Proxy Authentication Required`` (with
``Proxy-Authenticate``) and never reaches the store. Accepted requests are forwarded to ``upstream`` without the
``Proxy-Authorization`` header, bodies streamed both ways (a 1 GB upload does not sit in memory); a request in
absolute form (``PUT http://host/bucket/key``, as clients send to a forward proxy) is forwarded by its path.

Every request is recorded with its S3 operation name (``PutObject``, ``UploadPart``, …) and whether it was
authorized. Fault switches:

- ``replies``: scripted answers (``tests.fakes.echo.Reply``: status, body, stall, reset) for the next requests,
  consumed one per request, instead of forwarding;
- ``hold_parts``: each ``UploadPart`` waits, before its body is read, until ``release`` is set; ``part_held`` is set
  when the first one arrives, so a test can kill the client in the middle of a multipart upload;
- ``lose_answers``: operation names (``CompleteMultipartUpload``, ``PutObject``, …) whose next request is forwarded
  to the store, which applies it, and whose answer is then dropped with a connection reset (the store did the work,
  the client never hears of it); each name is consumed once;
- ``hold_answers``: operation names whose requests are forwarded to the store, which applies them, and whose answers
  are then held until ``release`` is set; ``answer_held`` is set when the first is held, so a test can kill the
  client after the store did the work and before it heard of it;
- ``refuse_checksums``: a request carrying the flexible checksums boto3 adds by default since 1.36
  (``x-amz-checksum-*``, ``x-amz-sdk-checksum-algorithm``, an ``aws-chunked`` body with a trailer) is answered
  ``501 NotImplemented``, as S3-compatible stores answer functionality they lack (MinIO's "A header you provided
  implies functionality that is not implemented"), and is never forwarded.

    with start_s3_proxy(moto_url, username="proxy-user", password="…") as proxy: ...
"""

from __future__ import annotations

import base64
import http.client
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.fakes._server import LoopbackServer
from tests.fakes.echo import HOP_BY_HOP, Reply

CHUNK = 1024 * 1024
HOLD_TIMEOUT_SECONDS = 60
NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code><Message>A header you provided implies '
    b"functionality that is not implemented</Message></Error>"
)
NOT_FORWARDED = HOP_BY_HOP | {"proxy-authorization", "content-length", "expect", "host"}


@dataclass(frozen=True)
class ProxiedRequest:
    method: str
    path: str
    operation: str
    authorized: bool
    proxy_authorization: str | None


@dataclass
class S3ProxyState:
    upstream: str
    username: str | None = None  # None: no Proxy-Authorization demanded
    password: str | None = None
    replies: deque[Reply] = field(default_factory=deque)
    hold_parts: bool = False
    dropped_headers: set[str] = field(default_factory=set)  # lower-case names left out of every relayed answer
    lose_answers: set[str] = field(default_factory=set)  # operations forwarded once, then answered with a reset
    hold_answers: set[str] = field(default_factory=set)  # operations forwarded, their answers held until release
    refuse_checksums: bool = False
    answer_held: threading.Event = field(default_factory=threading.Event)
    part_held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[ProxiedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def expected_header(self) -> str | None:
        if self.username is None:
            return None
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"

    def operations(self) -> list[str]:
        with self.lock:
            return [request.operation for request in self.requests]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.replies.clear()
        self.hold_parts = False
        self.dropped_headers = set()
        self.lose_answers, self.hold_answers = set(), set()
        self.refuse_checksums = False
        self.part_held.clear()
        self.answer_held.clear()
        self.release.clear()

    def take_lost_answer(self, operation: str) -> bool:
        with self.lock:
            if operation in self.lose_answers:
                self.lose_answers.discard(operation)
                return True
            return False

    def record(self, request: ProxiedRequest) -> Reply | None:
        with self.lock:
            self.requests.append(request)
            return self.replies.popleft() if self.replies and request.authorized else None


def s3_operation(method: str, target: str) -> str:
    """The S3 API operation of a path-style request, as botocore names it."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    on_object = "/" in parts.path.strip("/")
    if "uploadId" in query:
        return {"PUT": "UploadPart", "POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload"}.get(
            method, "ListParts"
        )
    if "uploads" in query:
        return "CreateMultipartUpload" if method == "POST" else "ListMultipartUploads"
    if not on_object:
        return {"PUT": "CreateBucket", "HEAD": "HeadBucket", "DELETE": "DeleteBucket"}.get(method, "ListObjects")
    return {"PUT": "PutObject", "HEAD": "HeadObject", "GET": "GetObject", "DELETE": "DeleteObject"}.get(method, method)


class S3ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _handle(self) -> None:
        state: S3ProxyState = self.server.state
        path = self._origin_form(self.path)
        header = self.headers.get("Proxy-Authorization")
        authorized = state.expected_header is None or header == state.expected_header
        operation = s3_operation(self.command, path)
        reply = state.record(ProxiedRequest(self.command, path, operation, authorized, header))
        if not authorized:
            self._drain_body()
            self._answer(Reply(407, {"Proxy-Authenticate": 'Basic realm="s3"'}, b"Proxy Authentication Required"))
        elif reply is not None:
            self._play(reply)
        elif state.refuse_checksums and self._carries_checksums():
            self._drain_body()
            self._answer(Reply(501, {"Content-Type": "application/xml"}, NOT_IMPLEMENTED))
        else:
            if state.hold_parts and operation == "UploadPart":
                state.part_held.set()
                state.release.wait(HOLD_TIMEOUT_SECONDS)
            lose_answer, hold_answer = state.take_lost_answer(operation), operation in state.hold_answers
            self._forward(state.upstream, path, lose_answer=lose_answer, hold_answer=hold_answer)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

    def _carries_checksums(self) -> bool:
        names = [name.lower() for name in self.headers]
        flexible = any(name.startswith(("x-amz-checksum-", "x-amz-sdk-checksum-", "x-amz-trailer")) for name in names)
        return flexible or "aws-chunked" in self.headers.get("Content-Encoding", "").lower()

    @staticmethod
    def _origin_form(target: str) -> str:
        if target.startswith(("http://", "https://")):
            parts = urlsplit(target)
            return parts.path + (f"?{parts.query}" if parts.query else "")
        return target

    def _play(self, reply: Reply) -> None:
        time.sleep(reply.delay)
        if reply.reset:
            return self._reset()
        self._drain_body()
        self._answer(reply)

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _answer(self, reply: Reply) -> None:
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _is_chunked(self) -> bool:
        return "chunked" in self.headers.get("Transfer-Encoding", "").lower()

    def _body(self) -> Iterator[bytes]:
        """The request body in pieces of at most ``CHUNK`` bytes, de-chunked when it came chunked."""
        if not self._is_chunked():
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                piece = self.rfile.read(min(CHUNK, remaining))
                if not piece:
                    raise ConnectionError("client closed the connection mid-body")
                remaining -= len(piece)
                yield piece
            return
        while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
            yield self.rfile.read(size)
            self.rfile.readline()  # CRLF after the chunk
        while self.rfile.readline().strip():  # trailer fields up to the empty line
            pass

    def _drain_body(self) -> None:
        for _ in self._body():
            pass

    def _forward(self, upstream: str, path: str, *, lose_answer: bool = False, hold_answer: bool = False) -> None:
        target = urlsplit(upstream)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
        try:
            headers = {name: value for name, value in self.headers.items() if name.lower() not in NOT_FORWARDED}
            headers["Host"] = self.headers.get("Host", target.netloc)
            if self._is_chunked():
                connection.request(self.command, path, body=self._body(), headers=headers, encode_chunked=True)
            else:
                headers["Content-Length"] = self.headers.get("Content-Length") or "0"
                connection.request(self.command, path, body=self._body(), headers=headers)
            answer = connection.getresponse()
            if hold_answer:
                self.server.state.answer_held.set()
                self.server.state.release.wait(HOLD_TIMEOUT_SECONDS)
            if lose_answer:
                answer.read()  # the store has applied the request
                return self._reset()
            self._relay(answer)
        finally:
            connection.close()

    def _relay(self, answer: http.client.HTTPResponse) -> None:
        length = answer.getheader("Content-Length")
        content = None if length is not None or self.command == "HEAD" else answer.read()
        self.send_response(answer.status)
        dropped = HOP_BY_HOP | {"content-length"} | self.server.state.dropped_headers
        for name, value in answer.getheaders():
            if name.lower() not in dropped:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)) if content is not None else length or "0")
        self.end_headers()
        if self.command == "HEAD":
            return
        if content is not None:
            self.wfile.write(content)
            return
        while piece := answer.read(CHUNK):
            self.wfile.write(piece)


def start_s3_proxy(upstream: str, *, username: str | None = None, password: str | None = None) -> LoopbackServer:
    """The proxy on a free loopback port, started, forwarding to ``upstream``."""
    return LoopbackServer(S3ProxyHandler, S3ProxyState(upstream, username, password)).start()
