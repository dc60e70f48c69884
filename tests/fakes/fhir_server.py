"""A small fake FHIR server for the send step's faults a real server does not produce on demand.

It speaks just enough of the FHIR REST API: ``POST /fhir`` with a transaction Bundle (answered with a
``transaction-response``, one ``201 Created`` per entry) and ``PUT /fhir/<Type>/<id>`` (answered with the stored
resource's id, the body itself is only counted). Fault switches (``FhirFakeState``):

- ``unavailable``: the next n requests get 503 with an OperationOutcome (a 503 storm);
- ``reset_mid_response``: the next n requests are read in full, then the connection is closed half-way through
  the answer's headers (an ambiguous failure: the server did the work, the client never hears of it);
- ``fail_entry``: the 0-based index of an entry that fails with ``422`` and an OperationOutcome inside an
  otherwise 200 ``transaction-response`` (``fail_entry_once`` to fail one transaction only), its OperationOutcome's
  ``details`` nested ``outcome_nesting`` objects deep (a broken server's);
- ``oauth``: an ``OAuthState`` (tests/fakes/oauth.py) whose tokens are required; a request with an unknown or
  revoked token gets 401, so a client must fetch a fresh token and try once more;
- ``echo_credentials``: every request is refused with ``echo_status`` and a body that quotes the request's
  credentials back (``"text"``: a plain-text page; ``"outcome"``: an OperationOutcome's diagnostics), as careless
  servers and proxies do: the ``Authorization`` and ``X-Api-Key`` headers, and a Basic password in plain, base64
  and URL-encoded forms (``echoed_credentials`` lists what a test must not find stored anywhere);
- ``drip_seconds``: every answer's body goes out one byte every that many seconds (a server that never finishes);
  ``drip_header_seconds`` the same for its status line and headers (no answer ever starts);
- ``answer_padding``: a successful answer carries that many extra bytes (whitespace inside the JSON), for tests of
  a client's bound on what it reads;
- ``max_body_bytes``: a request whose body is larger is refused with ``413`` and an OperationOutcome, as a server's
  (or its proxy's, nginx's ``client_max_body_size``) body limit does; nothing of it is applied;
- ``hold_from``: from that request on (1 for the first), each is read and recorded, then held unanswered and not
  applied until ``released`` is set, then its connection closed (a server that stalls mid-job); once released,
  requests are answered again.

Every request is recorded (method, path, entries or body bytes); transaction entries are kept per ``Type/id`` (or
conditional-create tag) so a test can count what arrived, and how often.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus

from tests.fakes._server import LengthOnlyHandler, LoopbackServer, serve_forever_cli
from tests.fakes.oauth import OAuthState

FHIR_JSON = "application/fhir+json"
READ_CHUNK = 1 << 20
PADDING_PIECE = 1 << 20


@dataclass
class FhirFakeState:
    unavailable: int = 0
    reset_mid_response: int = 0
    fail_entry: int | None = None
    fail_entry_once: bool = False
    outcome_nesting: int = 0
    oauth: OAuthState | None = None
    echo_credentials: str | None = None  # "text" or "outcome"
    echo_status: int = 401
    drip_seconds: float = 0.0
    drip_header_seconds: float = 0.0
    answer_padding: int = 0
    max_body_bytes: int | None = None
    hold_from: int | None = None
    released: threading.Event = field(default_factory=threading.Event)
    requests: list[dict[str, Any]] = field(default_factory=list)
    applied: Counter = field(default_factory=Counter)  # Type/id or POST tag -> times a transaction applied it
    put_bytes: dict[str, int] = field(default_factory=dict)  # Type/id -> body size of the last PUT
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.unavailable = self.reset_mid_response = 0
            self.fail_entry, self.fail_entry_once, self.oauth = None, False, None
            self.outcome_nesting = 0
            self.echo_credentials, self.echo_status = None, 401
            self.drip_seconds, self.drip_header_seconds, self.answer_padding = 0.0, 0.0, 0
            self.max_body_bytes = None
            self.hold_from, self.released = None, threading.Event()
            self.requests.clear()
            self.applied.clear()
            self.put_bytes.clear()

    def take(self, switch: str) -> bool:
        """Consume one unit of a counting fault switch."""
        with self.lock:
            if getattr(self, switch) > 0:
                setattr(self, switch, getattr(self, switch) - 1)
                return True
            return False

    @property
    def transactions(self) -> list[dict[str, Any]]:
        """The transactions the server took in (a refused body, ``refused``, is none)."""
        return [r for r in self.requests if r["method"] == "POST" and "refused" not in r]


def echoed_credentials(authorization: str, api_key: str = "") -> list[str]:
    """What the fake quotes back of a request's credentials: the header values, and a Basic password in plain,
    base64 and URL-encoded forms."""
    echoed = [authorization, api_key]
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "basic":
        _, _, password = base64.b64decode(value).decode().partition(":")
        echoed += [
            password,
            base64.b64encode(password.encode()).decode(),
            quote(password, safe=""),
            quote_plus(password),
        ]
    elif scheme.lower() == "bearer":
        echoed.append(value)
    return [text for text in echoed if text]


def outcome(code: str, text: str) -> dict:
    return {"resourceType": "OperationOutcome", "issue": [{"severity": "error", "code": code, "diagnostics": text}]}


def entry_key(entry: dict) -> str:
    request = entry.get("request") or {}
    if request.get("method") == "POST":
        return f"{request.get('url')}?{request.get('ifNoneExist', '')}"
    return str(request.get("url"))


class FhirHandler(LengthOnlyHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeFhir/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def state(self) -> FhirFakeState:
        return self.server.state

    def do_POST(self) -> None:
        body = self._read_body()
        if self._refused() or self._too_large(len(body)):
            return
        if self.path.rstrip("/") != "/fhir":
            return self._send(404, outcome("not-found", f"no route {self.path}"))
        try:
            bundle = json.loads(body)
        except ValueError:
            return self._send(400, outcome("structure", "body is not JSON"))
        entries = bundle.get("entry") or []
        with self.state.lock:
            self.state.requests.append(
                {"method": "POST", "path": self.path, "entries": [entry_key(e) for e in entries]}
            )
            failing = self.state.fail_entry
            if self.state.fail_entry_once:
                self.state.fail_entry = None
            hold_from = self.state.hold_from
            held = hold_from is not None and len(self.state.requests) >= hold_from and not self.state.released.is_set()
        if held:
            self.state.released.wait()
            self.close_connection = True
            return
        if failing is not None and failing < len(entries):
            answers = [{"response": {"status": "200 OK"}} for _ in entries]
            said = outcome("processing", f"{entry_key(entries[failing])}: profile validation failed")
            for _ in range(self.state.outcome_nesting):
                said["issue"][0]["details"] = {"extension": said["issue"][0].get("details", {})}
            answers[failing] = {"response": {"status": "422 Unprocessable Entity", "outcome": said}}
            return self._send(200, {"resourceType": "Bundle", "type": "transaction-response", "entry": answers})
        with self.state.lock:
            self.state.applied.update(entry_key(e) for e in entries)
        if self.state.take("reset_mid_response"):
            return self._reset()
        answers = [{"response": {"status": "201 Created", "location": f"{entry_key(e)}/_history/1"}} for e in entries]
        self._send(200, {"resourceType": "Bundle", "type": "transaction-response", "entry": answers})

    def do_PUT(self) -> None:
        size = self._count_body()
        if self._refused() or self._too_large(size):
            return
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) != 3 or parts[0] != "fhir":
            return self._send(404, outcome("not-found", f"no route {self.path}"))
        key = f"{parts[1]}/{parts[2]}"
        with self.state.lock:
            self.state.requests.append({"method": "PUT", "path": self.path, "bytes": size})
            created = key not in self.state.put_bytes
            self.state.put_bytes[key] = size
            self.state.applied[key] += 1
        if self.state.take("reset_mid_response"):
            return self._reset()
        self._send(201 if created else 200, {"resourceType": parts[1], "id": parts[2]})

    def _refused(self) -> bool:
        """Answer a fault (503, 401, an echo of the credentials) instead of the request; True when one was answered."""
        if self.state.echo_credentials is not None:
            self._echo_credentials()
            return True
        if self.state.take("unavailable"):
            self._send(503, outcome("transient", "the server is busy, try again later"))
            return True
        oauth = self.state.oauth
        if oauth is not None:
            header = self.headers.get("Authorization", "")
            token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
            if not oauth.is_valid(token):
                self._send(401, outcome("login", "the access token is missing, expired or revoked"))
                return True
        return False

    def _too_large(self, size: int) -> bool:
        """Answer 413 for a body over ``max_body_bytes``; True when one was answered."""
        limit = self.state.max_body_bytes
        if limit is None or size <= limit:
            return False
        with self.state.lock:
            self.state.requests.append({"method": self.command, "path": self.path, "refused": 413, "bytes": size})
        self._send(413, outcome("too-costly", f"the request body of {size} bytes is larger than {limit} bytes"))
        return True

    def _echo_credentials(self) -> None:
        """Each form on its own line (text) or in its own issue (outcome), so one redaction cannot hide another."""
        quoted = echoed_credentials(self.headers.get("Authorization", ""), self.headers.get("X-Api-Key", ""))
        lines = [f"you sent Authorization: {self.headers.get('Authorization', '')}", *(f"you sent {q}" for q in quoted)]
        if self.state.echo_credentials == "outcome":
            issues = [outcome("security", line)["issue"][0] for line in lines]
            return self._send(self.state.echo_status, {"resourceType": "OperationOutcome", "issue": issues})
        text = "request refused\n" + "\n".join(lines)
        data = text.encode()
        self.send_response(self.state.echo_status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("WWW-Authenticate", f'Basic realm="{lines[-1]}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _count_body(self) -> int:
        """Read and discard the body (a Binary may be large), returning its size."""
        remaining = int(self.headers.get("Content-Length") or 0)
        size = remaining
        while remaining:
            chunk = self.rfile.read(min(READ_CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
        return size

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        padding = self.state.answer_padding if status < 300 else 0
        if self.state.drip_header_seconds > 0:
            return self._drip_headers(status, len(data) + padding)
        self.send_response(status)
        self.send_header("Content-Type", FHIR_JSON)
        self.send_header("Content-Length", str(len(data) + padding))
        self.end_headers()
        if self.state.drip_seconds > 0:
            return self._drip(data)
        self.wfile.write(data[:1])
        self._pad(padding)
        self.wfile.write(data[1:])

    def _drip_headers(self, status: int, length: int) -> None:
        """The status line and headers one byte every ``drip_header_seconds`` (the body never comes)."""
        head = f"HTTP/1.1 {status} OK\r\nContent-Type: {FHIR_JSON}\r\nContent-Length: {length}\r\n" + "X-Slow: x" * 100
        for index in range(len(head)):
            self.wfile.write(head[index : index + 1].encode())
            self.wfile.flush()
            time.sleep(self.state.drip_header_seconds)

    def _pad(self, size: int) -> None:
        """Whitespace after the answer's opening brace: still the same JSON, only larger."""
        while size > 0:
            piece = min(size, PADDING_PIECE)
            self.wfile.write(b" " * piece)
            size -= piece

    def _drip(self, data: bytes) -> None:
        """One byte every ``drip_seconds``, until the client gives up (or, eventually, the answer is complete)."""
        for index in range(len(data)):
            self.wfile.write(data[index : index + 1])
            self.wfile.flush()
            time.sleep(self.state.drip_seconds)

    def _reset(self) -> None:
        """Start the answer, then reset the connection (RST) half-way through its headers."""
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/fhir+json\r\n")
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True


def start_fhir_fake(state: FhirFakeState | None = None) -> LoopbackServer:
    return LoopbackServer(FhirHandler, state or FhirFakeState()).start()


if __name__ == "__main__":
    serve_forever_cli(FhirHandler, FhirFakeState(), "fake FHIR server")
