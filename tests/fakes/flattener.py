"""A fake MII flattening service (fhir-flattener) answering ``$run`` with the embedded SQL-on-FHIR engine.

Wire contract (spec/protocols.md, "Flattening service"):

- ``GET /fhir/metadata``: a CapabilityStatement listing operation ``$run`` on ``ViewDefinition``.
- ``POST /fhir/ViewDefinition/$run?_format=ndjson`` with ``Content-Type: application/fhir+json`` (415 otherwise)
  and a ``Parameters`` body: a ``viewDefinition`` part, then ``resources`` parts. The answer is NDJSON
  (``application/x-ndjson``), one object per row keyed by column name; null cells are left out of the object,
  as the real service does with absent values. Errors are OperationOutcomes: 400 (bad body or ViewDefinition),
  413 (body over ``max_body_bytes``), 415, 500.

Switches on ``FlattenerState``: ``not_a_flattener`` (metadata is a CapabilityStatement without ``$run``),
``fail_next`` (that many ``$run`` calls answer 500), ``max_body_bytes``, ``repeat_rows`` (the answer's rows that
many times over, generated as sent: an answer larger than memory; ``bytes_written`` counts what went out before
the client stopped reading, ``streams_ended`` how many such answers ended, written whole or not),
``drip_byte_seconds`` (one byte of the answer every that many seconds; ``drip_header_seconds`` the same for its
status line and headers). Every ``$run`` is recorded (``runs``:
resources per request, body size).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tasks.sof.errors import ViewError
from tasks.sof.view import compile_view
from tasks.sof.output import json_bytes
from tests.fakes._server import LengthOnlyHandler, LoopbackServer, serve_forever_cli

RUN_PATH = "/fhir/ViewDefinition/$run"
METADATA_PATH = "/fhir/metadata"

CAPABILITY_STATEMENT = {
    "resourceType": "CapabilityStatement",
    "status": "active",
    "kind": "instance",
    "fhirVersion": "4.0.1",
    "format": ["json", "ndjson"],
    "rest": [
        {
            "mode": "server",
            "resource": [
                {
                    "type": "ViewDefinition",
                    "operation": [{"name": "run", "definition": "http://sql-on-fhir.org/OperationDefinition/$run"}],
                }
            ],
        }
    ],
}
NOT_A_FLATTENER = {
    "resourceType": "CapabilityStatement",
    "status": "active",
    "kind": "instance",
    "rest": [{"mode": "server", "resource": [{"type": "Patient", "interaction": [{"code": "read"}]}]}],
}


@dataclass
class RunRecord:
    resources: int
    body_bytes: int
    view_name: str | None


@dataclass
class FlattenerState:
    not_a_flattener: bool = False
    fail_next: int = 0
    max_body_bytes: int = 100 * 1024 * 1024
    repeat_rows: int = 1
    drip_byte_seconds: float = 0.0
    drip_header_seconds: float = 0.0
    bytes_written: int = 0
    streams_ended: int = 0
    runs: list[RunRecord] = field(default_factory=list)
    metadata_reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, **switches: Any) -> None:
        with self.lock:
            self.not_a_flattener, self.fail_next, self.max_body_bytes = False, 0, 100 * 1024 * 1024
            self.repeat_rows, self.drip_byte_seconds, self.bytes_written, self.streams_ended = 1, 0.0, 0, 0
            self.drip_header_seconds = 0.0
            self.runs, self.metadata_reads = [], 0
            for name, value in switches.items():
                setattr(self, name, value)


class FlattenerHandler(LengthOnlyHandler):
    server_version = "fake-flattener/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return

    @property
    def state(self) -> FlattenerState:
        return self.server.state  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        if self.path.split("?")[0] != METADATA_PATH:
            return self._outcome(404, f"unknown path {self.path}")
        with self.state.lock:
            self.state.metadata_reads += 1
        statement = NOT_A_FLATTENER if self.state.not_a_flattener else CAPABILITY_STATEMENT
        self._send(200, "application/fhir+json", json.dumps(statement).encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path.split("?")[0] != RUN_PATH:
            return self._outcome(404, f"unknown path {self.path}")
        if not (self.headers.get("Content-Type") or "").startswith("application/fhir+json"):
            return self._outcome(415, "Content-Type must be application/fhir+json")
        if length > self.state.max_body_bytes:
            return self._outcome(413, f"request body of {length} bytes is over the limit")
        with self.state.lock:
            if self.state.fail_next > 0:
                self.state.fail_next -= 1
                return self._outcome(500, "injected failure")
        try:
            view, resources = read_parameters(body)
            compiled = compile_view(view)
            rows = [
                dict(zip(compiled.columns, row, strict=True))
                for resource in resources
                for row in compiled.rows(resource)
            ]
        except (ValueError, ViewError) as exc:
            return self._outcome(400, str(exc))
        with self.state.lock:
            self.state.runs.append(RunRecord(len(resources), length, view.get("name")))
        lines = b"".join(json_bytes({k: v for k, v in row.items() if v is not None}) + b"\n" for row in rows)
        if self.state.drip_header_seconds > 0:
            return self._drip_headers()
        if self.state.repeat_rows > 1 or self.state.drip_byte_seconds > 0:
            return self._send_streamed(lines)
        self._send(200, "application/x-ndjson", lines)

    def _drip_headers(self) -> None:
        """The status line and headers one byte every ``drip_header_seconds`` (no row ever comes)."""
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n" + b"X-Slow: x\r\n" * 100
        for index in range(len(head)):
            self.wfile.write(head[index : index + 1])
            self.wfile.flush()
            time.sleep(self.state.drip_header_seconds)

    def _send_streamed(self, lines: bytes) -> None:
        """The rows ``repeat_rows`` times (generated as sent, counted in ``bytes_written`` until the client stops
        reading), or one byte every ``drip_byte_seconds``."""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Content-Length", str(len(lines) * self.state.repeat_rows))
        self.end_headers()
        pieces = [lines[i : i + 1] for i in range(len(lines))] if self.state.drip_byte_seconds > 0 else [lines]
        try:
            for _ in range(self.state.repeat_rows):
                for piece in pieces:
                    self.wfile.write(piece)
                    with self.state.lock:
                        self.state.bytes_written += len(piece)
                    if self.state.drip_byte_seconds > 0:
                        self.wfile.flush()
                        time.sleep(self.state.drip_byte_seconds)
        finally:
            with self.state.lock:
                self.state.streams_ended += 1

    def _outcome(self, status: int, text: str) -> None:
        severity = "fatal" if status >= 500 else "error"
        outcome = {
            "resourceType": "OperationOutcome",
            "issue": [{"severity": severity, "code": "processing", "diagnostics": text}],
        }
        self._send(status, "application/fhir+json", json.dumps(outcome).encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def read_parameters(body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ViewDefinition and resources of a ``$run`` Parameters body (decimals kept as written)."""
    parameters = json.loads(body, parse_float=Decimal)
    if not isinstance(parameters, dict) or parameters.get("resourceType") != "Parameters":
        raise ValueError("the body must be a Parameters resource")
    view, resources = None, []
    for part in parameters.get("parameter") or []:
        if part.get("name") == "viewDefinition":
            view = part.get("resource")
        elif part.get("name") == "resources":
            resources.append(part.get("resource"))
    if not isinstance(view, dict):
        raise ValueError("no viewDefinition part")
    return view, resources


def start_flattener(**switches: Any) -> LoopbackServer:
    state = FlattenerState()
    state.reset(**switches)
    return LoopbackServer(FlattenerHandler, state).start()


if __name__ == "__main__":
    serve_forever_cli(FlattenerHandler, FlattenerState(), "fake flattening service")
