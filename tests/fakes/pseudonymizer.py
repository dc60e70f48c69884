"""A fake FHIR pseudonymization service (FHIR-Pseudonymizer / DIMP) speaking ``POST /fhir/$de-identify``.

Wire contract (see spec/protocols.md, "Pseudonymization service"):

- ``Content-Type: application/fhir+json`` or ``application/json`` is required (415 otherwise), like the real
  service, which consumes both.
- The body is either the bare resource (or Bundle), de-identified with the server's own config, or a
  ``Parameters`` with a ``config`` part (``valueAttachment`` with base64 YAML) and a ``resource`` part; the
  response is always the de-identified resource itself, never wrapped.
- Errors are OperationOutcomes: 400 (bad config, missing resource part, bad JSON), 401 (API key), 413 (body over
  ``max_body_bytes``), 415 (content type), 500 (fatal, also via the failure switches).

Pseudonyms are deterministic: ``cryptoHash`` is an HMAC-SHA256 (hex) keyed per config. The key is derived from
``master_key`` and either ``parameters.keyDerivationContext`` of the config or, without it, the hash of the config
bytes; ``parameters.cryptoHashKey`` sets the key directly. So the same config gives the same output and two
different configs give different output.

Rules are applied like the real service: in order, the first rule that reaches a node wins, and a node handled
by a rule shields its descendants from later rules. Understood rule paths (a practical subset of FHIRPath):

- ``<ResourceType>.a.b.c`` and ``Resource.a.b`` / ``DomainResource.a.b`` (plain member navigation, lists are
  flattened), e.g. ``Patient.name``, ``Resource.id``, ``Bundle.entry.fullUrl``.
- ``nodesByType('<Type>')`` optionally followed by ``.a.b``, for the types in ``_NODE_TYPE_CLASSIFIERS``
  (Reference, Identifier, HumanName, Address, ContactPoint, CodeableConcept, Narrative), recognised by shape and
  field name since the fake has no StructureDefinitions.

Understood methods: ``redact`` (remove the element; containers left empty are removed too), ``keep``,
``cryptoHash`` (optional ``truncateToMaxLength``) and ``pseudonymize`` (an HMAC over ``domain:value``, standing in
for the pseudonym service). A string shaped like a reference (``Type/id``, ``.../Type/id/_history/v``,
``urn:uuid:x``) has only its id part hashed, so hashed references keep resolving to hashed ids, and Bundle
``fullUrl`` / ``request.url`` stay consistent with the entries. A rule whose path is understood but whose method is
not (generalize, dateshift, ...) acts like ``keep``; rules whose path is not understood (``where(...)``, other
types) are ignored. Both kinds are listed in ``AnonymizationConfig.unsupported_rules``.

Nested resources (Bundle entries, contained resources) are de-identified on their own with the same rules,
so Bundles keep their entry order.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import hmac
import json
import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
import yaml

from tests.fakes._server import LengthOnlyHandler, LoopbackServer, ResettableState, serve_forever_cli

DE_IDENTIFY_PATH = "/fhir/$de-identify"
FHIR_JSON = "application/fhir+json"
ACCEPTED_CONTENT_TYPES = (FHIR_JSON, "application/json")
DEFAULT_MAX_BODY_BYTES = 30 * 1024 * 1024
PAD_PIECE = 1 << 20

DEFAULT_SERVER_CONFIG = b"""\
fhirVersion: R4
fhirPathRules:
  - path: Resource.id
    method: cryptoHash
  - path: Bundle.entry.fullUrl
    method: cryptoHash
  - path: Bundle.entry.request.url
    method: cryptoHash
  - path: nodesByType('Reference').reference
    method: cryptoHash
  - path: Provenance.entity
    method: keep
  - path: nodesByType('Identifier').value
    method: cryptoHash
  - path: nodesByType('HumanName')
    method: redact
  - path: nodesByType('Address')
    method: redact
  - path: nodesByType('ContactPoint')
    method: redact
"""
"""The server's own config, used for bare-resource requests (like the file the real service reads at start). It keeps
``Provenance.entity`` as the MII configuration does (shared/testdata/pseudonymizer/anonymization.yaml): TORCH names
the attribute group there, and flattening routes by it."""


class ConfigError(ValueError):
    """The anonymization YAML cannot be used; answered with 400."""


# --------------------------------------------------------------------------------------------- rules and config


@dataclass(frozen=True)
class Rule:
    path: str
    method: str
    truncate_to: int | None = None
    domain: str | None = None


@dataclass(frozen=True)
class _MemberPath:
    """``<ResourceType>.a.b`` where ResourceType may be ``Resource`` / ``DomainResource`` (any type)."""

    resource_type: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class _NodesByTypePath:
    node_type: str
    members: tuple[str, ...]


_Path = _MemberPath | _NodesByTypePath
_SUPPORTED_METHODS = frozenset({"redact", "keep", "cryptoHash", "pseudonymize"})


@dataclass(frozen=True)
class _CompiledRule:
    rule: Rule
    path: _Path
    method: str  # the method the fake applies: an unsupported method on an understood path becomes "keep"


@dataclass(frozen=True)
class AnonymizationConfig:
    rules: tuple[_CompiledRule, ...]
    key: bytes
    unsupported_rules: tuple[str, ...]
    """``"<path> (<method>)"`` of every rule the fake does not implement (ignored, or treated as keep)."""


def parse_config(config_bytes: bytes, master_key: bytes) -> AnonymizationConfig:
    """Parse an anonymization YAML; raises ConfigError for anything the real service would reject."""
    try:
        document = yaml.safe_load(config_bytes.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"anonymization config is not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError("anonymization config must be a YAML mapping")
    raw_rules = document.get("fhirPathRules") or []
    if not isinstance(raw_rules, list):
        raise ConfigError("fhirPathRules must be a list")
    rules = [_read_rule(raw, index) for index, raw in enumerate(raw_rules)]
    compiled, unsupported = _compile_rules(rules)
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ConfigError("parameters must be a mapping")
    return AnonymizationConfig(tuple(compiled), _derive_key(config_bytes, parameters, master_key), tuple(unsupported))


def _read_rule(raw: Any, index: int) -> Rule:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str) or not isinstance(raw.get("method"), str):
        raise ConfigError(f"fhirPathRules[{index}] needs a string path and a string method")
    truncate = raw.get("truncateToMaxLength")
    if truncate is not None and (not isinstance(truncate, int) or truncate < 1):
        raise ConfigError(f"fhirPathRules[{index}].truncateToMaxLength must be a positive integer")
    return Rule(raw["path"], raw["method"], truncate, raw.get("domain"))


def _compile_rules(rules: list[Rule]) -> tuple[list[_CompiledRule], list[str]]:
    compiled: list[_CompiledRule] = []
    unsupported: list[str] = []
    for rule in rules:
        path = _parse_path(rule.path)
        understood = path is not None and rule.method in _SUPPORTED_METHODS
        if not understood:
            unsupported.append(f"{rule.path} ({rule.method})")
        if path is not None:
            compiled.append(_CompiledRule(rule, path, rule.method if understood else "keep"))
    return compiled, unsupported


_MEMBER_PATH = re.compile(r"^([A-Z][A-Za-z]*)((?:\.[a-z][A-Za-z0-9]*)*)$")
_NODES_BY_TYPE_PATH = re.compile(r"^nodesByType\('([A-Za-z]+)'\)((?:\.[a-z][A-Za-z0-9]*)*)$")


def _parse_path(text: str) -> _Path | None:
    text = text.strip()
    if match := _NODES_BY_TYPE_PATH.match(text):
        if match.group(1) not in _NODE_TYPE_CLASSIFIERS:
            return None
        return _NodesByTypePath(match.group(1), _split_members(match.group(2)))
    if match := _MEMBER_PATH.match(text):
        return _MemberPath(match.group(1), _split_members(match.group(2)))
    return None


def _split_members(tail: str) -> tuple[str, ...]:
    return tuple(part for part in tail.split(".") if part)


def _derive_key(config_bytes: bytes, parameters: dict[str, Any], master_key: bytes) -> bytes:
    if isinstance(parameters.get("cryptoHashKey"), str):
        return parameters["cryptoHashKey"].encode("utf-8")
    context = parameters.get("keyDerivationContext")
    if isinstance(context, str) and context:
        label = b"context:" + context.encode("utf-8")
    else:
        label = b"config:" + hashlib.sha256(config_bytes).digest()
    return hmac.new(master_key, label, hashlib.sha256).digest()


# ----------------------------------------------------------------------------------------------- de-identification

_REDACTED = object()
_Location = tuple[Any, ...]  # keys and list indices from the resource root


def deidentify(resource: dict[str, Any], config: AnonymizationConfig) -> dict[str, Any]:
    """Return a de-identified deep copy of ``resource`` (and of every resource nested in it)."""
    result = copy.deepcopy(resource)
    _deidentify_in_place(result, config)
    return result


def _deidentify_in_place(resource: dict[str, Any], config: AnonymizationConfig) -> None:
    handled: set[_Location] = set()
    for compiled in config.rules:
        for location in _matching_locations(resource, compiled.path):
            if not _is_shielded(location, handled):
                handled.add(location)
                _apply(resource, location, compiled, config.key)
    _drop_redacted(resource)
    for nested in _nested_resources(resource):
        _deidentify_in_place(nested, config)


def _is_shielded(location: _Location, handled: set[_Location]) -> bool:
    return any(location[:length] in handled for length in range(len(location) + 1))


def _apply(resource: dict[str, Any], location: _Location, compiled: _CompiledRule, key: bytes) -> None:
    value = _value_at(resource, location)
    if compiled.method == "redact":
        _set_at(resource, location, _REDACTED)
    elif compiled.method == "cryptoHash" and isinstance(value, str):
        _set_at(resource, location, _hash_preserving_reference(key, value, compiled.rule.truncate_to))
    elif compiled.method == "pseudonymize" and isinstance(value, str):
        _set_at(resource, location, _hmac_hex(key, f"{compiled.rule.domain or ''}:{value}", None))


_REFERENCE_LIKE = re.compile(
    r"^(?P<prefix>(?:.*/)?[A-Z][A-Za-z]+/)(?P<id>[A-Za-z0-9\-.]{1,64})(?P<rest>/_history/.+)?$"
)


def _hash_preserving_reference(key: bytes, value: str, truncate_to: int | None) -> str:
    """Hash only the id part of reference-shaped strings so hashed references match hashed resource ids."""
    if value.startswith("urn:uuid:"):
        return "urn:uuid:" + _hmac_hex(key, value[len("urn:uuid:") :], truncate_to)
    if match := _REFERENCE_LIKE.match(value):
        return match["prefix"] + _hmac_hex(key, match["id"], truncate_to) + (match["rest"] or "")
    return _hmac_hex(key, value, truncate_to)


def _hmac_hex(key: bytes, value: str, truncate_to: int | None) -> str:
    digest = hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()
    return digest[:truncate_to] if truncate_to else digest


def _matching_locations(resource: dict[str, Any], path: _Path) -> list[_Location]:
    if isinstance(path, _MemberPath):
        if path.resource_type not in ("Resource", "DomainResource", resource.get("resourceType")):
            return []
        starts: list[tuple[Any, _Location]] = [(resource, ())]
    else:
        classify = _NODE_TYPE_CLASSIFIERS[path.node_type]
        starts = [(node, loc) for node, loc, field_name in _walk(resource, ()) if classify(field_name, node)]
    return [location for _, location in _navigate(starts, path.members) if location]


def _navigate(nodes: list[tuple[Any, _Location]], members: tuple[str, ...]) -> list[tuple[Any, _Location]]:
    for member in members:
        next_nodes: list[tuple[Any, _Location]] = []
        for node, location in nodes:
            if not isinstance(node, dict) or member not in node or _is_resource(node[member]):
                continue
            child = node[member]
            if isinstance(child, list):
                next_nodes.extend(
                    (item, location + (member, i)) for i, item in enumerate(child) if not _is_resource(item)
                )
            else:
                next_nodes.append((child, location + (member,)))
        nodes = next_nodes
    return nodes


def _walk(node: Any, location: _Location, field_name: str = "") -> Iterator[tuple[Any, _Location, str]]:
    """Every element of one resource (not descending into nested resources), with the field it sits in."""
    if isinstance(node, dict):
        if location:
            yield node, location, field_name
        for name, child in node.items():
            if isinstance(child, list):
                for index, item in enumerate(child):
                    if not _is_resource(item):
                        yield from _walk(item, location + (name, index), name)
            elif not _is_resource(child):
                yield from _walk(child, location + (name,), name)
    elif location:
        yield node, location, field_name


def _is_resource(node: Any) -> bool:
    return isinstance(node, dict) and isinstance(node.get("resourceType"), str)


def _nested_resources(resource: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for entry in resource.get("entry") or []:
        if isinstance(entry, dict) and _is_resource(entry.get("resource")):
            yield entry["resource"]
    for contained in resource.get("contained") or []:
        if _is_resource(contained):
            yield contained


def _is_dict_in(*field_names: str) -> Callable[[str, Any], bool]:
    return lambda field_name, node: isinstance(node, dict) and field_name in field_names


_NODE_TYPE_CLASSIFIERS: dict[str, Callable[[str, Any], bool]] = {
    "Reference": lambda _field, node: isinstance(node, dict) and isinstance(node.get("reference"), str),
    "Identifier": _is_dict_in("identifier"),
    "HumanName": _is_dict_in("name"),
    "Address": _is_dict_in("address"),
    "ContactPoint": _is_dict_in("telecom"),
    "CodeableConcept": lambda _field, node: isinstance(node, dict) and isinstance(node.get("coding"), list),
    "Narrative": lambda field_name, node: field_name == "text" and isinstance(node, dict) and "div" in node,
}
"""How the fake recognises a FHIR data type without StructureDefinitions: by field name and shape."""


def _value_at(root: Any, location: _Location) -> Any:
    for step in location:
        root = root[step]
    return root


def _set_at(root: Any, location: _Location, value: Any) -> None:
    _value_at(root, location[:-1])[location[-1]] = value


def _drop_redacted(node: Any) -> bool:
    """Remove redacted elements and the containers they leave empty; True if ``node`` itself became empty."""
    if isinstance(node, dict):
        touched = False
        for name in list(node):
            if node[name] is _REDACTED or (_drop_redacted(node[name]) and not _is_resource(node[name])):
                del node[name]
                touched = True
        return touched and not node
    if isinstance(node, list):
        kept = [item for item in node if item is not _REDACTED and not _drop_redacted(item)]
        touched = len(kept) != len(node)
        node[:] = kept
        return touched and not node
    return False


# -------------------------------------------------------------------------------------------------------- state


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str] = field(repr=False)
    """Lower-cased header names (left out of the repr: they may carry the API key)."""
    size: int
    body_kind: str = "unread"
    """"resource", "bundle", "parameters", "invalid-json", or "unread" (rejected before the body was parsed)."""
    resource_type: str | None = None
    """Type of the resource to de-identify (the ``resource`` part for Parameters)."""
    parameter_names: list[str] = field(default_factory=list)
    """Part names of a Parameters body, in wire order."""
    config_sha256: str | None = None
    status: int | None = None
    """The answered status; 0 when the fake reset the connection instead."""


StatusHook = Callable[[RecordedRequest], int | None]


@dataclass
class PseudonymizerState(ResettableState):
    """Switches and records of one fake; every mutation goes through the lock (handlers run in threads)."""

    server_config: bytes = DEFAULT_SERVER_CONFIG
    master_key: bytes = b"dupflow-fake-pseudonymizer-master-key"
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    latency_seconds: float = 0.0
    fail_next: int = 0
    fail_status: int = 500
    reset_next: int = 0
    answer_padding: int = 0
    """Spaces added inside every 200 answer's JSON (generated as sent): an answer larger than memory."""
    status_hook: StatusHook | None = None
    """Called per request after recording; a returned status is answered with an OperationOutcome."""
    requests: list[RecordedRequest] = field(default_factory=list)
    config_parses: int = 0
    """How many times a config was parsed (the cache keyed by the bytes' hash avoids repeats)."""
    unsupported_rules: set[str] = field(default_factory=set)
    _config_cache: dict[str, AnonymizationConfig] = field(default_factory=dict, repr=False)

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def take_reset(self) -> bool:
        with self._lock:
            if self.reset_next <= 0:
                return False
            self.reset_next -= 1
            return True

    def take_failure(self) -> int | None:
        with self._lock:
            if self.fail_next <= 0:
                return None
            self.fail_next -= 1
            return self.fail_status

    def config_for(self, config_bytes: bytes) -> AnonymizationConfig:
        digest = hashlib.sha256(config_bytes).hexdigest()
        with self._lock:
            if digest not in self._config_cache:
                config = parse_config(config_bytes, self.master_key)
                self._config_cache[digest] = config
                self.config_parses += 1
                self.unsupported_rules.update(config.unsupported_rules)
            return self._config_cache[digest]


# ------------------------------------------------------------------------------------------------------ handler


class _Rejection(Exception):
    def __init__(self, status: int, diagnostics: str, code: str = "invalid"):
        super().__init__(diagnostics)
        self.status, self.diagnostics, self.code = status, diagnostics, code


class _ConnectionReset(Exception):
    """The fake reset the connection on purpose; nothing is left to answer."""


def operation_outcome(diagnostics: str, code: str = "invalid", severity: str = "error") -> dict[str, Any]:
    return {
        "resourceType": "OperationOutcome",
        "issue": [{"severity": severity, "code": code, "diagnostics": diagnostics}],
    }


class PseudonymizerHandler(LengthOnlyHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakePseudonymizer/1.0"

    @property
    def state(self) -> PseudonymizerState:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silent: tests assert on ``state.requests`` instead."""

    def do_GET(self) -> None:
        if self.path == "/fhir/metadata":
            self._send_json(200, {"resourceType": "CapabilityStatement", "status": "active", "kind": "instance"})
        else:
            self._send_json(404, operation_outcome(f"unknown path {self.path}", "not-found"))

    def do_POST(self) -> None:
        recorded = RecordedRequest(
            method="POST",
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            size=int(self.headers.get("Content-Length") or 0),
        )
        self.state.record(recorded)
        self._unread_body = self._body_chunks()
        try:
            self._injected_faults(recorded)
            body = self._checked_body(recorded)
            result = self._deidentify_body(body, recorded)
        except _Rejection as rejection:
            recorded.status = rejection.status
            severity = "fatal" if rejection.status >= 500 else "error"
            outcome = operation_outcome(rejection.diagnostics, rejection.code, severity)
            self._discard_unread_body()
            self._send_json(rejection.status, outcome)
            return
        except _ConnectionReset:
            return
        recorded.status = 200
        self._send_json(200, result)

    def _injected_faults(self, recorded: RecordedRequest) -> None:
        if self.state.latency_seconds > 0:
            time.sleep(self.state.latency_seconds)
        if self.state.take_reset():
            recorded.status = 0
            self._reset_connection()
            raise _ConnectionReset
        status = self.state.take_failure() or (self.state.status_hook(recorded) if self.state.status_hook else None)
        if status is not None:
            raise _Rejection(status, f"injected failure {status}", "exception")

    def _checked_body(self, recorded: RecordedRequest) -> bytes:
        """Authorisation, routing, content type and size, in that order; returns the body."""
        expected_key = self.state.api_key
        if expected_key is not None and not hmac.compare_digest(
            self.headers.get("X-Api-Key", "").encode(), expected_key.encode()
        ):
            raise _Rejection(401, "missing or wrong API key", "login")
        if self.path.split("?", 1)[0] != DE_IDENTIFY_PATH:
            raise _Rejection(404, f"unknown path {self.path}", "not-found")
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type not in ACCEPTED_CONTENT_TYPES:
            expected = " or ".join(ACCEPTED_CONTENT_TYPES)
            raise _Rejection(415, f"unsupported content type {content_type!r}, expected {expected}", "not-supported")
        body = self._read_body_within(self.state.max_body_bytes, recorded.size)
        recorded.size = len(body)
        return body

    def _read_body_within(self, limit: int, declared_size: int) -> bytes:
        too_large = _Rejection(413, f"request body larger than {limit} bytes", "too-costly")
        if declared_size > limit:
            raise too_large
        chunks: list[bytes] = []
        total = 0
        for chunk in self._unread_body:
            total += len(chunk)
            if total > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def _body_chunks(self) -> Iterator[bytes]:
        """The request body in pieces, for Content-Length and chunked bodies; consumes it from the socket."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                yield self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk

    def _discard_unread_body(self) -> None:
        """Read what is left of a rejected body so the client gets to read our answer (and keep-alive works)."""
        for _ in self._unread_body:
            pass

    def _deidentify_body(self, body: bytes, recorded: RecordedRequest) -> dict[str, Any]:
        try:
            document = json.loads(body, parse_float=Decimal)  # a FHIR server keeps a decimal's precision
        except ValueError:
            recorded.body_kind = "invalid-json"
            raise _Rejection(400, "body is not valid JSON", "structure") from None
        if not _is_resource(document):
            recorded.body_kind = "invalid-json"
            raise _Rejection(400, "body is not a FHIR resource", "structure")
        config_bytes, resource = self.state.server_config, document
        if document["resourceType"] == "Parameters":
            recorded.body_kind = "parameters"
            config_bytes, resource = _unwrap_parameters(document, recorded, self.state.server_config)
        else:
            recorded.body_kind = "bundle" if document["resourceType"] == "Bundle" else "resource"
        recorded.resource_type = resource["resourceType"]
        recorded.config_sha256 = hashlib.sha256(config_bytes).hexdigest()
        try:
            config = self.state.config_for(config_bytes)
        except ConfigError as exc:
            raise _Rejection(400, str(exc)) from None
        try:
            return deidentify(resource, config)
        except Exception as exc:  # a bug or an unexpected shape: answer like the real service does
            raise _Rejection(500, f"de-identification failed: {type(exc).__name__}", "exception") from None

    def _send_json(self, status: int, document: dict[str, Any]) -> None:
        payload = orjson.dumps(document, default=_decimal_as_written)
        padding = self.state.answer_padding if status == 200 else 0
        self.send_response(status)
        self.send_header("Content-Type", FHIR_JSON)
        self.send_header("Content-Length", str(len(payload) + padding))
        self.end_headers()
        self.wfile.write(payload[:1])
        for start in range(0, padding, PAD_PIECE):  # spaces inside the JSON: the same answer, only larger
            self.wfile.write(b" " * min(PAD_PIECE, padding - start))
        self.wfile.write(payload[1:])

    def _reset_connection(self) -> None:
        """Close with SO_LINGER 0 so the client sees a TCP reset, not a clean end of stream."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()


def _unwrap_parameters(
    parameters: dict[str, Any], recorded: RecordedRequest, server_config: bytes
) -> tuple[bytes, dict[str, Any]]:
    """Split a ``$de-identify`` Parameters into (config bytes, resource); the server config when no config part."""
    parts = [part for part in parameters.get("parameter") or [] if isinstance(part, dict)]
    recorded.parameter_names = [str(part.get("name")) for part in parts]
    by_name = {part.get("name"): part for part in parts}
    resource = (by_name.get("resource") or {}).get("resource")
    if not _is_resource(resource):
        raise _Rejection(400, "Parameters has no 'resource' part holding a resource", "required")
    if "config" not in by_name:
        return server_config, resource
    attachment = by_name["config"].get("valueAttachment") or {}
    try:
        return base64.b64decode(attachment.get("data") or "", validate=True), resource
    except (binascii.Error, ValueError):
        raise _Rejection(400, "config attachment data is not valid base64") from None


def _decimal_as_written(value: object) -> orjson.Fragment:
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def start_pseudonymizer(**options: Any) -> LoopbackServer:
    """Start a fake on a free port with ``PseudonymizerState(**options)``; the caller stops it (``.stop()``)."""
    return LoopbackServer(PseudonymizerHandler, PseudonymizerState(**options)).start()


if __name__ == "__main__":
    serve_forever_cli(PseudonymizerHandler, PseudonymizerState(), "fake pseudonymization service")
