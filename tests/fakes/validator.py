"""A fake FHIR validation service (the HL7/MII validator in server mode) speaking ``POST /validateResource``.

Wire contract (spec/protocols.md, "Validation service"): ``Content-Type: application/fhir+json`` (415 otherwise),
the body a resource, usually a ``collection`` Bundle of ``{fullUrl, resource}`` entries; the answer 200 with an
``OperationOutcome``. Findings are real, not canned:

- Every entry's resource (nested Bundle entries included) is parsed by ``fhir.resources`` (FHIR R4B models, the
  closest to the R4 the MII profiles use); each validation error becomes an issue ``severity: error`` with
  ``expression``/``location`` set to the element, e.g. ``Bundle.entry[1].resource.birthDate``.
- Codes of required bindings the models do not check (administrative gender, condition clinical and verification
  status) are checked against their value sets, as the HL7 validator does: an unknown code is an error.
- A reference that matches no ``fullUrl`` of the request (relative ``Type/id`` resolve against the entries'
  ``fullUrl``) is a ``warning``, as the HL7 validator reports unresolvable references.
- With no error and no warning the answer is the validator's single ``information`` issue "All OK".

Switches (``ValidatorState``): ``latency_seconds`` per request, ``delay_for`` (extra delay by request index, so
answers finish out of order), ``fail_next``/``fail_status`` (5xx storms, a fatal OperationOutcome),
``max_body_bytes`` (413 above it), ``drip_seconds`` (the answer trickles out in small pieces over that long),
``drip_byte_seconds`` (one byte of the answer every that many seconds), ``answer_padding`` (that many spaces inside
the answer's JSON, generated as sent; ``bytes_written`` counts what went out before the client stopped reading),
``chunked_answer`` (no Content-Length: the client learns the size only by reading), ``quote`` (a text every
answer repeats in an extra error issue, as a service quoting a credential back would),
``findings_status`` (answer findings with 412/422 like older HAPI servers), ``shallow`` (count the entries and
answer "All OK" without model validation: for benchmarks of the client's throughput). Requests are recorded
with their size, entry count and status; ``most_in_flight`` is the concurrency the server saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fhir.resources.R4B import get_fhir_model_class
from pydantic import ValidationError

from tests.fakes._server import LengthOnlyHandler, LoopbackServer, ResettableState, serve_forever_cli

VALIDATE_PATH = "/validateResource"
FHIR_JSON = "application/fhir+json"
DEFAULT_MAX_BODY_BYTES = 1 << 30
DRIP_PIECES = 20
PAD_PIECE = 1 << 20

# Required bindings that fhir.resources does not enforce: element name -> allowed codes, and code system ->
# allowed codes for Codings.
GENDER_VALUE_SET = "http://hl7.org/fhir/ValueSet/administrative-gender"
REQUIRED_CODES_BY_ELEMENT = {"gender": (GENDER_VALUE_SET, {"male", "female", "other", "unknown"})}
REQUIRED_CODES_BY_SYSTEM = {
    "http://terminology.hl7.org/CodeSystem/condition-clinical": {
        "active",
        "recurrence",
        "relapse",
        "inactive",
        "remission",
        "resolved",
    },
    "http://terminology.hl7.org/CodeSystem/condition-ver-status": {
        "unconfirmed",
        "provisional",
        "differential",
        "confirmed",
        "refuted",
        "entered-in-error",
    },
}


# ---------------------------------------------------------------------------------------------------- validation


def issue(severity: str, code: str, text: str, path: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"severity": severity, "code": code, "details": {"text": text}}
    if path is not None:
        found["expression"] = [path]
        found["location"] = [path]
    return found


def validate_document(document: Any, shallow: bool = False) -> list[dict[str, Any]]:
    """The issues for one request body (a resource, usually a Bundle); ``[All OK]`` when there are none."""
    if not isinstance(document, dict) or not isinstance(document.get("resourceType"), str):
        return [issue("fatal", "structure", "the body is not a FHIR resource")]
    if shallow:
        return [issue("information", "informational", "All OK")]
    issues = resource_issues(document, document["resourceType"])
    issues += reference_issues(document, full_urls(document))
    return issues or [issue("information", "informational", "All OK")]


def resource_issues(resource: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """Model errors and required-binding errors of one resource, and of each Bundle entry as its own resource."""
    resource_type = resource.get("resourceType")
    try:
        model = get_fhir_model_class(resource_type)
    except (ValueError, TypeError, KeyError):
        return [issue("error", "structure", f"Unknown resource type {resource_type!r}", path)]
    entries = resource.get("entry") if resource_type == "Bundle" else None
    if not isinstance(entries, list):
        return model_issues(model, resource, path) + binding_issues(resource, path)
    # The Bundle with its entries' own fields (fullUrl, request, ...) in one go; each entry's resource apart.
    shells = [{k: v for k, v in e.items() if k != "resource"} if isinstance(e, dict) else e for e in entries]
    shell = {**resource, "entry": shells}
    issues = model_issues(model, shell, path) + binding_issues(shell, path)
    for index, entry in enumerate(entries):
        nested = entry.get("resource") if isinstance(entry, dict) else None
        if isinstance(nested, dict):
            issues += resource_issues(nested, f"{path}.entry[{index}].resource")
    return issues


def model_issues(model: Any, resource: dict[str, Any], path: str) -> list[dict[str, Any]]:
    try:
        model.model_validate(resource)
    except ValidationError as exc:
        return [
            issue("error", error_code(error["type"]), error["msg"], element_path(path, error["loc"]))
            for error in exc.errors()
        ]
    return []


def error_code(pydantic_type: str) -> str:
    return {"missing": "required", "extra_forbidden": "structure"}.get(pydantic_type, "value")


def element_path(path: str, loc: tuple[Any, ...]) -> str:
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            path += f".{part}"
    return path


def binding_issues(node: Any, path: str) -> list[dict[str, Any]]:
    """Codes outside a required value set, anywhere in ``node``."""
    found: list[dict[str, Any]] = []
    if isinstance(node, list):
        for index, item in enumerate(node):
            found += binding_issues(item, f"{path}[{index}]")
        return found
    if not isinstance(node, dict):
        return found
    allowed = REQUIRED_CODES_BY_SYSTEM.get(node.get("system")) if isinstance(node.get("system"), str) else None
    if allowed is not None and node.get("code") not in allowed:
        found.append(code_issue(node.get("code"), node["system"], f"{path}.code"))
    for name, value in node.items():
        value_set, codes = REQUIRED_CODES_BY_ELEMENT.get(name, (None, set()))
        if value_set is not None and isinstance(value, str) and value not in codes:
            found.append(code_issue(value, value_set, f"{path}.{name}"))
        elif isinstance(value, dict | list):
            found += binding_issues(value, f"{path}.{name}")
    return found


def code_issue(code: Any, value_set: str, path: str) -> dict[str, Any]:
    return issue("error", "code-invalid", f"The value provided ({code!r}) is not in the value set {value_set}", path)


def full_urls(document: dict[str, Any]) -> set[str]:
    """Every ``fullUrl`` of the request, nested Bundles included."""
    urls: set[str] = set()
    for entry in document.get("entry") or [] if document.get("resourceType") == "Bundle" else []:
        if isinstance(entry, dict):
            if isinstance(entry.get("fullUrl"), str):
                urls.add(entry["fullUrl"])
            if isinstance(entry.get("resource"), dict):
                urls |= full_urls(entry["resource"])
    return urls


def reference_issues(node: Any, urls: set[str], path: str = "Bundle") -> list[dict[str, Any]]:
    """A warning for each ``reference`` that resolves to no ``fullUrl`` of the request."""
    found: list[dict[str, Any]] = []
    items = enumerate(node) if isinstance(node, list) else node.items() if isinstance(node, dict) else []
    for key, value in items:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
        if key == "reference" and isinstance(value, str) and not value.startswith("#") and not resolves(value, urls):
            found.append(issue("warning", "not-found", f"Unable to resolve the reference {value!r}", where))
        elif isinstance(value, dict | list):
            found += reference_issues(value, urls, where)
    return found


def resolves(reference: str, urls: set[str]) -> bool:
    return reference in urls or any(url.endswith("/" + reference) for url in urls)


# --------------------------------------------------------------------------------------------------------- state


@dataclass
class RecordedRequest:
    path: str
    content_type: str
    size: int
    entries: int = 0
    status: int | None = None


@dataclass
class ValidatorState(ResettableState):
    """Switches and records of one fake; every mutation goes through the lock (handlers run in threads)."""

    latency_seconds: float = 0.0
    fail_next: int = 0
    fail_status: int = 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drip_seconds: float = 0.0
    findings_status: int = 200
    shallow: bool = False
    quote: str = ""
    """A text quoted back in an extra error issue of every answer (a secret a careless service repeats)."""
    drip_byte_seconds: float = 0.0
    answer_padding: int = 0
    chunked_answer: bool = False
    bytes_written: int = 0
    delay_for: Callable[[int], float] | None = None
    """Extra seconds before answering the request with this index (to make answers finish out of order)."""
    requests: list[RecordedRequest] = field(default_factory=list)
    most_in_flight: int = 0
    _open: set[int] = field(default_factory=set, repr=False)

    def enter(self, request: RecordedRequest) -> int:
        """Record a request; returns its index (0 for the first since the last reset)."""
        with self._lock:
            self.requests.append(request)
            self._open.add(id(request))
            self.most_in_flight = max(self.most_in_flight, len(self._open))
            return len(self.requests) - 1

    def leave(self, request: RecordedRequest) -> None:
        """The request is answered; one from before the last reset no longer counts."""
        with self._lock:
            self._open.discard(id(request))

    def count_written(self, size: int) -> None:
        with self._lock:
            self.bytes_written += size

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def take_failure(self) -> int | None:
        with self._lock:
            if self.fail_next <= 0:
                return None
            self.fail_next -= 1
            return self.fail_status

    @property
    def answered(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.status is not None]


# ------------------------------------------------------------------------------------------------------- handler


class ValidatorHandler(LengthOnlyHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeValidator/1.0"

    @property
    def state(self) -> ValidatorState:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silent: tests assert on ``state.requests`` instead."""

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        recorded = RecordedRequest(self.path, content_type, size)
        index = self.state.enter(recorded)
        try:
            status, answer = self._answer(recorded, index)
            recorded.status = status
        finally:
            # Before the answer goes out: a client that has read it may send its next request at once,
            # before this thread would get to count this one as answered (an in-flight count one too high).
            self.state.leave(recorded)
        self._send_json(status, answer)

    def _discard_body(self, size: int) -> None:
        """Read a refused body so the client gets to read the answer (an unread body ends in a reset)."""
        while size > 0 and (chunk := self.rfile.read(min(size, 1 << 20))):
            size -= len(chunk)

    def _answer(self, recorded: RecordedRequest, index: int) -> tuple[int, dict[str, Any]]:
        if recorded.size > self.state.max_body_bytes:
            self._discard_body(recorded.size)
            return 413, outcome([issue("error", "too-costly", f"body larger than {self.state.max_body_bytes} bytes")])
        body = self.rfile.read(recorded.size)
        delay = self.state.latency_seconds + (self.state.delay_for(index) if self.state.delay_for else 0.0)
        if delay > 0:
            time.sleep(delay)
        if (failure := self.state.take_failure()) is not None:
            return failure, outcome([issue("fatal", "exception", f"injected failure {failure}")])
        if self.path.split("?", 1)[0] != VALIDATE_PATH:
            return 404, outcome([issue("error", "not-found", f"unknown path {self.path}")])
        if recorded.content_type != FHIR_JSON:
            return 415, outcome(
                [issue("error", "not-supported", f"unsupported content type {recorded.content_type!r}")]
            )
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 400, outcome([issue("fatal", "structure", "the body is not valid JSON")])
        if isinstance(document, dict) and isinstance(document.get("entry"), list):
            recorded.entries = len(document["entry"])
        issues = validate_document(document, self.state.shallow)
        if self.state.quote:
            issues.append(issue("error", "security", f"the request came with {self.state.quote}"))
        has_errors = any(found["severity"] in ("error", "fatal") for found in issues)
        return (self.state.findings_status if has_errors else 200), outcome(issues)

    def _send_json(self, status: int, document: dict[str, Any]) -> None:
        payload = orjson.dumps(document)
        padding = self.state.answer_padding
        self.send_response(status)
        self.send_header("Content-Type", FHIR_JSON)
        if self.state.chunked_answer:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(payload) + padding))
        self.end_headers()
        if self.state.drip_byte_seconds > 0:
            return self._drip_bytes(payload)
        if padding or self.state.chunked_answer:
            return self._send_padded(payload, padding)
        if self.state.drip_seconds <= 0:
            self.wfile.write(payload)
            return
        piece = max(1, -(-len(payload) // DRIP_PIECES))
        for start in range(0, len(payload), piece):
            self.wfile.write(payload[start : start + piece])
            self.wfile.flush()
            time.sleep(self.state.drip_seconds / DRIP_PIECES)

    def _drip_bytes(self, payload: bytes) -> None:
        """One byte every ``drip_byte_seconds``: a server that never quite finishes."""
        for index in range(len(payload)):
            self.wfile.write(payload[index : index + 1])
            self.wfile.flush()
            time.sleep(self.state.drip_byte_seconds)

    def _send_padded(self, payload: bytes, padding: int) -> None:
        """The answer with ``padding`` spaces after its opening brace (the same JSON, only larger), written in
        pieces as generated, counting what went out (``bytes_written``) until the client stops reading."""
        pieces = [payload[:1], *(b" " * min(PAD_PIECE, padding - start) for start in range(0, padding, PAD_PIECE))]
        for piece in [*pieces, payload[1:]]:
            self._write_piece(piece)
            self.state.count_written(len(piece))
        if self.state.chunked_answer:
            self.wfile.write(b"0\r\n\r\n")

    def _write_piece(self, piece: bytes) -> None:
        if self.state.chunked_answer:
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        else:
            self.wfile.write(piece)


def outcome(issues: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceType": "OperationOutcome", "issue": issues}


def start_validator(**options: Any) -> LoopbackServer:
    """Start a fake on a free port with ``ValidatorState(**options)``; the caller stops it (``.stop()``)."""
    return LoopbackServer(ValidatorHandler, ValidatorState(**options)).start()


if __name__ == "__main__":
    serve_forever_cli(ValidatorHandler, ValidatorState(), "fake validation service")
