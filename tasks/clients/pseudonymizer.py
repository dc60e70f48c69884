"""Client of the pseudonymization service (FHIR Pseudonymizer / DIMP).

Note: ``POST {url}/fhir/$de-identify``, per spec/protocols.md ("Pseudonymization service"); no
Prefect. See docs/development.md#service-clients.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tasks.core.json_shapes import as_array, as_object, JsonObject
from tasks.core.errors import StepError
from tasks.core.exact_json import dumps_exact, loads_exact
from tasks.core.jsonfile import read_settings_file
from tasks.core.names import show_name, show_text
from tasks.clients.bounds import MB, Deadline
from tasks.clients.errors import BODY_LIMIT, json_or_none
from tasks.core.redaction import redact
from tasks.clients.http import FHIR_JSON_HEADERS, ServiceClient

DE_IDENTIFY_PATH = "/fhir/$de-identify"
CONFIG_KEY = "services.pseudonymizer.anonymization_config"
MAX_ANSWER_BYTES = 100 * MB
"""The most of one answer that is read, unless the step says otherwise:
pipeline.max_ndjson_line_size_mb's default, since the answer becomes one line of the step's
output."""
DEADLINE_SETTING = "services.pseudonymizer.timeout; raise it for large bundles"
TOO_LARGE_ANSWER_HINT = (
    "the de-identified resource is larger than an output line may be; raise "
    "pipeline.max_ndjson_line_size_mb"
)


class PseudonymizationError(StepError):
    """A resource that cannot be sent, or an unusable answer; the message says why."""


class EntryTooLargeError(PseudonymizationError):
    """One Bundle entry alone does not fit in a request below the split threshold."""

    def __init__(self, entry: Any, index: int, size: int, threshold_bytes: int, overhead: int):
        fields = (
            " and the Bundle's own fields (all but its entries, sent with every chunk) "
            f"{overhead / MB:.1f} MB:"
        )
        together = f"{fields} together more than" if size <= threshold_bytes else ", larger than"
        super().__init__(
            f"Bundle entry {index} ({resource_label(entry)}) is {size / MB:.1f} MB{together} "
            f"the split threshold of {threshold_bytes // MB} MB, so it cannot be sent on its own; "
            "raise services.pseudonymizer.bundle_split_threshold_mb (up to 100) and, if needed, "
            f"{BODY_LIMIT}"
        )


@dataclass(frozen=True)
class AnonymizationConfig:
    """The anonymization YAML sent with each request.

    Why: its bytes stay out of reprs: they may hold a hash key.
    """

    path: str
    data: bytes = field(repr=False)

    @classmethod
    def read(cls, path: str | Path, key: str = CONFIG_KEY) -> AnonymizationConfig:
        """Read the file once, within bounds (``read_settings_file``).

        Note: a ``JsonFileError`` naming ``key`` if it cannot.
        """
        path = Path(path).expanduser()
        return cls(str(path), read_settings_file(path, key))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Pseudonymized:
    """One de-identified resource as an NDJSON line (no newline), and what it took."""

    line: bytes
    requests: int
    split: bool


def request_body(config: AnonymizationConfig | None) -> Callable[[bytes], bytes]:
    """What makes ``$de-identify`` bodies of a resource's JSON bytes, as they are."""
    if config is None:
        return lambda resource_json: resource_json
    attachment = {"contentType": "application/yaml", "data": base64.b64encode(config.data).decode()}
    config_part = orjson.dumps({"name": "config", "valueAttachment": attachment})
    prefix = (
        b'{"resourceType":"Parameters","parameter":[%b,{"name":"resource","resource":' % config_part
    )
    return lambda resource_json: prefix + resource_json + b"}]}"


class Pseudonymizer:
    """De-identifies resources through one ``ServiceClient``.

    Note: thread-safe (its callers fan out).
    """

    def __init__(
        self,
        client: ServiceClient,
        *,
        config: AnonymizationConfig | None = None,
        split_threshold_mb: int = 10,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        """Send through ``client``, each whole request within its endpoint's timeout.

        Note: that is the configured ``services.pseudonymizer.timeout``.
        """
        self._send = functools.partial(
            client.request,
            "POST",
            # joined to the service's URL once (httpx would parse and join it for every request)
            client.http.build_request("POST", DE_IDENTIFY_PATH).url,
            deadline=functools.partial(Deadline, client.endpoint.timeout, DEADLINE_SETTING),
            max_answer_bytes=max_answer_bytes,
            too_large_hint=TOO_LARGE_ANSWER_HINT,
            headers=FHIR_JSON_HEADERS,
        )
        self._body = request_body(config)
        self.split_threshold_bytes = split_threshold_mb * MB

    def pseudonymize(self, resource_json: bytes, resource: JsonObject) -> Pseudonymized:
        """De-identify one resource given as its JSON bytes and parsed form.

        Note: a large Bundle is split, and put back together from the answers.
        """
        if not needs_split(resource, self.split_threshold_bytes):
            return Pseudonymized(self._deidentify(resource_json, resource), 1, False)
        # the chunks and the Bundle put back keep every number's digits
        exact = loads_exact(resource_json)
        chunks = split_bundle(exact, self.split_threshold_bytes)
        fields, *answers = [
            loads_exact(self._deidentify(dumps_exact(part), part))
            for part in [without_entries(exact), *chunks]
        ]
        return Pseudonymized(
            dumps_exact(reassemble_bundle(exact, fields, answers)), len(chunks) + 1, True
        )

    def _deidentify(self, resource_json: bytes, resource: JsonObject) -> bytes:
        operation = f"de-identify {show_text(resource.get('resourceType'))}"
        response = self._send(operation=operation, body=self._body(resource_json))
        return checked_answer(response.content, resource)


def checked_answer(content: bytes, sent: JsonObject) -> bytes:
    """Return the answer as one NDJSON line, checked.

    Note: it must be a resource of the sent type with all its entries.
    """
    if (answer := json_or_none(content)) is None:
        raise PseudonymizationError("the service answered with something that is not JSON")
    sent_type = sent.get("resourceType")
    if not isinstance(answer, dict) or answer.get("resourceType") != sent_type:
        got = (
            show_name(str(answer.get("resourceType")))
            if isinstance(answer, dict)
            else type(answer).__name__
        )
        sent_shown = show_text(sent_type)
        raise PseudonymizationError(
            redact(f"the service answered with {got} instead of a de-identified {sent_shown}")
        )
    if sent_type == "Bundle" and _entry_count(answer) != _entry_count(sent):
        raise PseudonymizationError(
            f"the service answered with {_entries_said(answer)} for "
            f"{_entries_said(sent, short=True)} sent; refusing to lose resources"
        )
    # the answer's own bytes, numbers as written, as one line: a line break can only stand between
    # JSON tokens (a string holds it escaped), so each becomes a space
    return content.strip().replace(b"\r", b" ").replace(b"\n", b" ")


def _entry_count(bundle: JsonObject) -> int | None:
    """Count the Bundle's entries (None: its ``entry`` is no array, sent as it is)."""
    entries = bundle.get("entry")
    return None if entries is not None and not isinstance(entries, list) else len(entries or [])


def _entries_said(bundle: JsonObject, short: bool = False) -> str:
    if (count := _entry_count(bundle)) is None:
        return "a Bundle whose entry is not an array"
    return str(count) if short else f"{count} Bundle entries"


def compact_size(resource: Any) -> int:
    try:
        return len(dumps_exact(resource))
    except orjson.JSONEncodeError as exc:  # nested deeper than JSON is written (254 levels)
        raise PseudonymizationError(
            f"the resource cannot be written as JSON again ({exc}); it is no FHIR resource"
        ) from None


def needs_split(resource: JsonObject, threshold_bytes: int) -> bool:
    # an entry that is no array is sent as it is: the service says what is wrong
    return (
        resource.get("resourceType") == "Bundle"
        and bool(_entry_count(resource))
        and compact_size(resource) > threshold_bytes
    )


def split_bundle(bundle: JsonObject, threshold_bytes: int) -> list[JsonObject]:
    """Cut ``entry[]`` into greedy, order-preserving chunk Bundles.

    Note: each Bundle holds at most ``threshold_bytes`` of compact JSON, with the Bundle-level
    fields (so the service de-identifies them too) and id ``<bundle id>-chunk-<i>``.
    """
    entries = bundle.get("entry") or []
    bundle_id = bundle.get("id", "bundle")
    skeleton = without_entries(bundle)
    # The largest chunk id bounds the overhead of every chunk.
    overhead = compact_size({**skeleton, "id": f"{bundle_id}-chunk-{len(entries)}", "entry": []})
    groups: list[list[Any]] = [[]]
    size = overhead
    for index, entry in enumerate(entries):
        entry_size = compact_size(entry)
        if overhead + entry_size > threshold_bytes:
            raise EntryTooLargeError(
                as_object(entry).get("resource"), index, entry_size, threshold_bytes, overhead
            )
        if groups[-1] and size + 1 + entry_size > threshold_bytes:  # 1: the comma between entries
            groups.append([])
            size = overhead
        size += entry_size + (1 if groups[-1] else 0)
        groups[-1].append(entry)
    return [
        {**skeleton, "id": f"{bundle_id}-chunk-{i}", "entry": group}
        for i, group in enumerate(groups)
    ]


def without_entries(bundle: JsonObject) -> JsonObject:
    """The Bundle's own fields, id and ``meta`` included, without its entries."""
    return {name: value for name, value in bundle.items() if name != "entry"}


def reassemble_bundle(
    original: JsonObject, fields: JsonObject, chunks: list[JsonObject]
) -> JsonObject:
    """Put one Bundle together from de-identified chunks.

    Note: every entry in order, the original ``type`` and ``timestamp``.
    Why: with the fields of the Bundle de-identified without entries, not the first chunk's: its id
    ``<id>-chunk-0`` would give another pseudonymous id than the Bundle sent whole (issue 33).
    """
    kept = {name: original[name] for name in ("type", "timestamp") if name in original}
    entries = [entry for chunk in chunks for entry in as_array(chunk.get("entry"))]
    return without_entries(fields) | kept | {"entry": entries}


def resource_label(resource: Any) -> str:
    """``Type/id`` of a resource for messages (never its content)."""
    if not isinstance(resource, dict):
        return "no resource"
    resource_type = show_text(resource.get("resourceType", "unknown type"))
    return f"{resource_type}/{show_text(resource.get('id', '(no id)'))}"
