"""The transaction Bundles of direct_resource_load, in batches from an NDJSON file.

Note: each entry a PUT (with an id) or a conditional create; no Prefect. See
docs/development.md#service-clients.
"""

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tasks.core.errors import StepError
from tasks.core.exact_json import dumps_exact, loads_exact
from tasks.core.json_shapes import JsonObject, as_object
from tasks.streams.ndjson import iter_lines, parse_resource

UNWRAPPED_BUNDLE_TYPES = ("transaction", "collection", "searchset")
SEND_ENTRY_TAG_SYSTEM = "urn:dupflow:send-entry"


@dataclass
class Batch:
    """A transaction's entries (JSON each), their Type/id labels, the next one's start."""

    number: int
    entries: list[bytes] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    next_line: int = 0
    next_entry: int = 0

    def body(self) -> bytes:
        return (
            b'{"resourceType":"Bundle","type":"transaction","entry":['
            + b",".join(self.entries)
            + b"]}"
        )


def iter_batches(
    source: Path,
    batch_size: int,
    *,
    tag_prefix: str,
    max_line_bytes: int,
    start_line: int = 0,
    start_entry: int = 0,
    first_number: int = 1,
) -> Iterator[Batch]:
    """Yield the transaction batches of ``source`` from an entry of a line on.

    Note: from entry ``start_entry`` of line ``start_line``; earlier lines are skipped unparsed.
    Why: a line's entries (an unwrapped Bundle's) that fit in one batch are never cut in two, so
    references between them (``urn:uuid:``, a Patient and its Conditions) resolve in one
    transaction.
    """
    batch = Batch(first_number)
    for line_number, line in iter_lines(source, max_line_bytes):
        if line_number < start_line:
            continue
        skip = start_entry if line_number == start_line else 0
        entries = list(enumerate(line_entries(source, line_number, line, tag_prefix)))[skip:]
        if batch.entries and len(batch.entries) + len(entries) > batch_size >= len(entries):
            yield batch
            batch = Batch(batch.number + 1)
        for index, (entry, label) in entries:
            batch.entries.append(entry)
            batch.labels.append(label)
            batch.next_line, batch.next_entry = line_number, index + 1
            if len(batch.entries) == batch_size:
                yield batch
                batch = Batch(batch.number + 1)
    if batch.entries:
        yield batch


def line_entries(
    source: Path, line_number: int, line: bytes, tag_prefix: str
) -> Iterator[tuple[bytes, str]]:
    """Yield the resource of one NDJSON line, or those of an unwrapped Bundle.

    Note: but not a search's own OperationOutcome.
    """
    resource = parse_resource(source, line_number, line)  # an NdjsonError is a StepError
    where = f"{source.name} line {line_number}"
    unwrapped = (
        resource.get("resourceType") == "Bundle" and resource.get("type") in UNWRAPPED_BUNDLE_TYPES
    )
    if unwrapped or not resource.get("id"):  # taken apart and written anew: ``1.50`` stays ``1.50``
        try:
            resource = loads_exact(line)
        except RecursionError:
            raise StepError(
                f"{where}: the resource is nested too deep to be taken apart; send it as it is"
            ) from None
    if unwrapped:
        if not isinstance(entries := resource.get("entry", []), list | None):
            raise StepError(
                f"{where}: the Bundle's entry is not an array, so it holds no resource to send; "
                "fix it"
            )
        for index, item in enumerate(entries or []):
            inner = as_object(item).get("resource")
            # not a search's own OperationOutcome (``search.mode: outcome``): sending it would
            # store the source server's messages on the destination
            if isinstance(inner, dict) and as_object(item.get("search")).get("mode") != "outcome":
                tag = f"{tag_prefix}:{line_number}:{index}"
                yield transaction_entry(
                    inner, None, tag, f"{where} entry {index + 1}", item.get("fullUrl")
                )
        return
    yield transaction_entry(resource, line, f"{tag_prefix}:{line_number}", where)


def written(resource: JsonObject, where: str) -> bytes:
    """``resource`` as JSON with its numbers as read (FHIR's decimal precision counts)."""
    try:
        return dumps_exact(resource)
    except (TypeError, RecursionError):  # orjson writes at most 254 levels
        raise StepError(
            f"{where}: the resource is nested too deep (over 254 levels) to be sent"
        ) from None


def transaction_entry(
    resource: JsonObject, raw: bytes | None, tag: str, where: str, full_url: str | None = None
) -> tuple[bytes, str]:
    """Return ``(entry JSON, "Type/id")``: a PUT with an id, else a conditional POST.

    Note: ``PUT Type/id`` with an id, else a conditional ``POST Type`` on a tag.
    Why: ``raw`` (the JSON as read, or None) is sent as is, saving a re-serialisation.
    """
    resource_type, resource_id = resource.get("resourceType"), resource.get("id")
    if not isinstance(resource_type, str) or not resource_type:
        raise StepError(
            f"{where}: the resource has no resourceType; it cannot be sent to a FHIR server"
        )
    if resource_id is not None and not isinstance(resource_id, str):
        raise StepError(f"{where}: {resource_type}.id is not a string")
    prefix = b'{"fullUrl":' + orjson.dumps(full_url) + b"," if full_url else b"{"
    if resource_id:
        label = f"{resource_type}/{resource_id}"
        request = {"method": "PUT", "url": label}
        body = raw if raw is not None else written(resource, where)
    else:
        label = f"{resource_type} (no id)"
        code = entry_tag(tag, written(resource, where))
        request = {
            "method": "POST",
            "url": resource_type,
            "ifNoneExist": f"_tag={SEND_ENTRY_TAG_SYSTEM}|{code}",
        }
        body = written(with_tag(resource, code, where), where)
    return prefix + b'"resource":' + body + b',"request":' + orjson.dumps(request) + b"}", label


def entry_tag(position: str, content: bytes) -> str:
    """The tag code of a POST entry: stable for job, file, position and content.

    Why: a file written anew is sent again: its new content at a position must be created too.
    """
    return hashlib.sha256(position.encode() + b"\n" + content).hexdigest()[:32]


def with_tag(resource: JsonObject, code: str, where: str) -> JsonObject:
    """Return ``resource`` with the tag its conditional create looks for.

    Note: a ``meta`` or ``meta.tag`` not shaped as FHIR's is refused (the tag could not be added
    without dropping or mangling it).
    """
    meta = resource.get("meta", {})
    if not isinstance(meta, dict) or not isinstance(meta.get("tag", []), list):
        raise StepError(
            f"{where}: the resource's meta is not an object with a tag array; fix the resource"
        )
    tag = [*meta.get("tag", []), {"system": SEND_ENTRY_TAG_SYSTEM, "code": code}]
    return {**resource, "meta": {**meta, "tag": tag}}
