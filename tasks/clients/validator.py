"""Client of the validation service (the HL7/MII FHIR validator in server mode).

Note: no Prefect. See docs/development.md#service-clients.
"""

import functools
import itertools
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from tasks.core.json_shapes import as_array, as_object, as_objects, JsonObject
from tasks.clients.bounds import MB, Deadline
from tasks.clients.errors import error_from_response, json_or_none
from tasks.core.names import show_text
from tasks.core.readable import plain_text
from tasks.core.redaction import redact_strings
from tasks.clients.http import FHIR_JSON_HEADERS, ServiceClient
from tasks.core.errors import DupflowError
from tasks.core.exact_json import dumps_exact, loads_exact
from tasks.streams.ndjson import NdjsonError, parse_resource

VALIDATE_PATH = "/validateResource"
FULL_URL_BASE = "http://localhost/fhir"
FINDINGS_STATUSES = (412, 422)
ERROR_SEVERITIES = frozenset({"error", "fatal"})
REQUEST_DEADLINE = timedelta(minutes=10)
"""Whole-request deadline of one chunk (send, validate, answer); the spec has no key for it. The
validator is silent while it works on a chunk, and a 10 MB chunk can take minutes."""
DEADLINE_SETTING = "REQUEST_DEADLINE of tasks/clients/validator.py"
MAX_ANSWER_BYTES = 64 * MB
"""The most of one answer that is read: an OperationOutcome is parsed whole and kept as one report
line."""
# a finding's message or location as kept in the step's summary and report artifact
MAX_FINDING_CHARS = 500
TOO_LARGE_ANSWER_HINT = (
    "lower services.validation.bundle_chunk_size_mb so that each chunk gets a smaller answer"
)

BODY_PREFIX = b'{"resourceType":"Bundle","type":"collection","entry":['
BODY_SUFFIX = b"]}"
EMPTY_BODY_BYTES = len(BODY_PREFIX) + len(BODY_SUFFIX)

# How a report line says which chunk it answers and which resources that chunk held.
CHUNK_EXTENSION = "urn:dupflow:validation:chunk"
RESOURCE_EXTENSION = "urn:dupflow:validation:resource"

_ENTRY_INDEX = re.compile(r"^\s*Bundle\.entry\[(\d+)\]")


class ValidationServiceError(DupflowError):
    """The service answered 200 with something that is no OperationOutcome (terminal)."""


@dataclass(frozen=True)
class Chunk:
    """One request: its number in the file (from 1), body, each resource's ``Type/id``."""

    number: int
    body: bytes = field(repr=False)
    labels: tuple[str, ...]
    oversized: bool = False


def iter_chunks(
    lines: Iterable[tuple[int, bytes]], chunk_bytes: int, source: Path | str
) -> Iterator[Chunk]:
    """Cut ``(line number, resource line)`` pairs into greedy, order-preserving chunks.

    Note: each body is at most ``chunk_bytes`` (one chunk's entries held at a time); an entry alone
    over it goes alone, ``oversized``.
    """
    source, numbers = Path(source), itertools.count(1)
    entries: list[bytes] = []
    labels: list[str] = []
    size = EMPTY_BODY_BYTES
    for line_number, line in lines:
        entry, label = bundle_entry(
            parse_resource(source, line_number, line), line.strip(), line_number, source
        )
        if entries and size + 1 + len(entry) > chunk_bytes:  # 1: the comma between entries
            yield Chunk(next(numbers), join_entries(entries), tuple(labels))
            entries, labels, size = [], [], EMPTY_BODY_BYTES
        size += len(entry) + (1 if entries else 0)
        entries.append(entry)
        labels.append(label)
        if size > chunk_bytes:  # only an entry alone gets here
            yield Chunk(next(numbers), join_entries(entries), tuple(labels), oversized=True)
            entries, labels, size = [], [], EMPTY_BODY_BYTES
    if entries:
        yield Chunk(next(numbers), join_entries(entries), tuple(labels))


def join_entries(entries: list[bytes]) -> bytes:
    return BODY_PREFIX + b",".join(entries) + BODY_SUFFIX


def bundle_entry(
    resource: JsonObject, resource_json: bytes, line_number: int, source: Path
) -> tuple[bytes, str]:
    """Return the entry ``{fullUrl, resource}`` of one resource as JSON, and its label.

    Note: a Bundle whose entries lack a fullUrl is written anew with them, every number as read
    (``tasks.core.exact_json``).
    """
    if with_full_urls(resource):
        try:
            # recurses per level: orjson, which checked the line, reads 1024
            exact = loads_exact(resource_json)
            with_full_urls(exact)
            resource_json = dumps_exact(exact)
        except (TypeError, RecursionError):  # orjson writes at most 254 levels
            raise NdjsonError(
                f"{source}: line {line_number}: the Bundle is nested too deep (over 254 levels) "
                "to be validated"
            ) from None
    full_url = orjson.dumps(full_url_of(resource))
    return b'{"fullUrl":' + full_url + b',"resource":' + resource_json + b"}", resource_label(
        resource, line_number
    )


def full_url_of(resource: Any) -> str:
    """Return ``http://localhost/fhir/<Type>/<id>``, else a fresh ``urn:uuid:``.

    Note: the latter for a resource without type or id.
    """
    if isinstance(resource, dict) and resource.get("resourceType") and resource.get("id"):
        return f"{FULL_URL_BASE}/{resource['resourceType']}/{resource['id']}"
    return f"urn:uuid:{uuid.uuid4()}"


def with_full_urls(resource: JsonObject) -> bool:
    """Give each Bundle entry (nested too) lacking a ``fullUrl`` one; True if any did."""
    if resource.get("resourceType") != "Bundle":
        return False
    changed = False
    for entry in as_objects(resource.get("entry")):  # not a list: the validator says what is wrong
        if not entry.get("fullUrl"):
            entry["fullUrl"] = full_url_of(entry.get("resource"))
            changed = True
        changed = with_full_urls(as_object(entry.get("resource"))) or changed
    return changed


def resource_label(resource: JsonObject, line_number: int) -> str:
    """Return a resource's ``Type/id`` for reports (never its content), else its line."""
    resource_type = show_text(resource.get("resourceType", "unknown type"))
    if resource.get("id"):
        return f"{resource_type}/{show_text(resource['id'])}"
    return f"{resource_type} (line {line_number})"


@dataclass(frozen=True)
class Finding:
    """One error issue: its resource, where in it (FHIRPath), what the validator said."""

    resource: str
    location: str
    message: str

    def describe(self) -> str:
        return f"{self.resource} at {self.location}: {self.message}"


@dataclass
class ChunkFindings:
    """What a chunk's OperationOutcome says: counts by severity, findings by resource."""

    errors: int = 0
    warnings: int = 0
    information: int = 0
    # indexes of the chunk's entries with an error
    resources_with_errors: set[int] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)


def read_findings(outcome: JsonObject, labels: tuple[str, ...], keep: int) -> ChunkFindings:
    """Count the issues of ``outcome`` and keep the first ``keep`` errors.

    Note: an error is tied to a resource through its FHIRPath (``Bundle.entry[i]...``); without one
    it belongs to none, except in a chunk of a single resource.
    """
    counted = ChunkFindings()
    for issue in as_objects(outcome.get("issue")):
        severity = str(issue.get("severity"))
        if severity == "warning":
            counted.warnings += 1
        elif severity not in ERROR_SEVERITIES:
            counted.information += 1
        else:
            counted.errors += 1
            paths = (issue.get(name) for name in ("expression", "location"))
            location = next(
                (p[0] for p in paths if isinstance(p, list) and p and isinstance(p[0], str)), None
            )
            if (index := entry_index(location, len(labels))) is not None:
                counted.resources_with_errors.add(index)
            if len(counted.findings) < keep:
                resource = labels[index] if index is not None else "(not tied to a resource)"
                shown = show_text(location, MAX_FINDING_CHARS) if location else "(no location)"
                counted.findings.append(Finding(resource, shown, issue_message(issue)))
    return counted


def entry_index(location: str | None, entries: int) -> int | None:
    if location and (match := _ENTRY_INDEX.match(location)):
        index = int(match.group(1))
        return index if index < entries else None
    return 0 if entries == 1 else None


def issue_message(issue: JsonObject) -> str:
    for text in (as_object(issue.get("details")).get("text"), issue.get("diagnostics")):
        if isinstance(text, str) and (shown := plain_text(text[: MAX_FINDING_CHARS * 4])):
            return shown if len(shown) <= MAX_FINDING_CHARS else shown[:MAX_FINDING_CHARS] + " …"
    return f"({show_text(issue.get('code') or 'no code')}, no message)"


def annotated(outcome: JsonObject, chunk: Chunk) -> JsonObject:
    """Return the outcome as a report line, with the chunk number and its resources.

    Note: extensions give the chunk number and every resource it held, in order.
    """
    marks = [{"url": CHUNK_EXTENSION, "valueInteger": chunk.number}]
    marks += [{"url": RESOURCE_EXTENSION, "valueString": label} for label in chunk.labels]
    return {
        "resourceType": "OperationOutcome",
        **outcome,
        "extension": as_array(outcome.get("extension")) + marks,
    }


class Validator:
    """Validates chunks through one ``ServiceClient``.

    Note: thread-safe (its callers fan out).
    """

    def __init__(
        self,
        client: ServiceClient,
        *,
        deadline: timedelta = REQUEST_DEADLINE,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        self._service = client.endpoint.name
        self._send = functools.partial(
            client.request,
            "POST",
            VALIDATE_PATH,
            deadline=functools.partial(Deadline, deadline, DEADLINE_SETTING),
            max_answer_bytes=max_answer_bytes,
            too_large_hint=TOO_LARGE_ANSWER_HINT,
            answers=FINDINGS_STATUSES,
            headers=FHIR_JSON_HEADERS,
        )

    def validate(self, chunk: Chunk, source: str) -> JsonObject:
        """Return the OperationOutcome for ``chunk``, else raise its ``ServiceError``.

        Note: an outcome is taken from a 2xx answer or a 412/422.
        """
        operation, service = f"validate {source} chunk {chunk.number}", self._service
        response = self._send(operation=operation, body=chunk.body)
        answer = as_object(json_or_none(response.content))
        if answer.get("resourceType") == "OperationOutcome":
            # every text redacted for reports, logs and artifacts
            outcome: JsonObject = redact_strings(answer)
            return outcome
        if response.is_error:
            raise error_from_response(response, operation=operation, service=service)
        raise ValidationServiceError(
            f"{service}: {operation}: the service answered HTTP {response.status_code} without an "
            "OperationOutcome; is services.validation.url the validator's root?"
        )
