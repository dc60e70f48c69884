"""A task's result record in the job folder, checked as data before it is read.

Note: taken only as dupflow writes it (Prefect's JSON serializer, its own name, this job's folder).
No Prefect import: ``status`` reads records too.
"""

import sys
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel

from tasks.core.json_shapes import JsonObject
from tasks.core.jsonfile import MB, parse_json_document, read_limited
from tasks.job.record import FileEntry, RecordError, as_record_error

MAX_RESULT_BYTES = 64 * MB  # a batch of 3,000 files' record is some 4 MB
RESULT_SERIALIZER = {  # Prefect's JSONSerializer with its defaults: ``result_serializer="json"``
    "type": "json",
    "jsonlib": "json",
    "object_encoder": "prefect.serializers.prefect_json_object_encoder",
    "object_decoder": "prefect.serializers.prefect_json_object_decoder",
    "dumps_kwargs": {},
    "loads_kwargs": {},
}
PRODUCT_PACKAGES = ("tasks", "flows", "config")


def record_problem(path: Path, document: Any) -> str | None:
    """Say why the parsed record at ``path`` is not one this job wrote; None if it is.

    Why: Prefect decodes a record with the serializer the file names: one rewritten to name
    ``pickle`` ran code when ``continue`` looked it up.
    Why: a record copied from another job keeps that job's name and folder in its ``storage_key``.
    """
    metadata = document.get("metadata") if isinstance(document, dict) else None
    if not isinstance(metadata, dict) or not isinstance(document.get("result"), str):
        return "is no result record of Prefect's JSON form"
    if (serializer := metadata.get("serializer")) != RESULT_SERIALIZER:
        named = serializer.get("type") if isinstance(serializer, dict) else serializer
        return f"names the serializer {str(named)[:40]!r}, not the JSON one dupflow writes"
    written = PurePath(str(metadata.get("storage_key")))
    if written.name != path.name or written.parents[2].name != path.parents[2].name:
        return f"was written as {written.name[:120]!r} of job {written.parents[2].name[:40]!r}"
    return None


def checked_result(path: Path) -> bytes:
    """Give the record's bytes for Prefect to decode, once nothing names foreign code.

    Why: Prefect's JSON decoder imports the module a ``__class__`` or ``__exc_type__`` names and
    builds that class from the data; only this product's own models, already loaded, may be named.
    """
    data, document = read_result_record(path)
    with as_record_error():
        result = parse_json_document(document["result"].encode(), f"the result record {path.name}")
    if foreign := next(foreign_names(result), None):
        raise RecordError(
            f"the result record {path.name} names {foreign[:120]!r}, no result type of dupflow"
        )
    return data


def read_result_record(path: Path) -> tuple[bytes, JsonObject]:
    """The checked bytes and record at ``path``; else a ``RecordError`` naming it."""
    label = f"the result record {path.name}"
    if not path.is_file():  # a FIFO would block the read
        raise RecordError(f"{label} is no regular file")
    with as_record_error():
        data = read_limited(path, MAX_RESULT_BYTES, label)
        document: Any = parse_json_document(data, label)  # a dict once record_problem passes
    if problem := record_problem(path, document):
        raise RecordError(f"{label} {problem}")
    return data, document


def foreign_names(value: Any) -> Iterator[str]:
    """Yield the classes and exception types a decoded result names that are not ours."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "__exc_type__" in node:
                yield str(node["__exc_type__"])
            if "__class__" in node and not is_product_model(str(node["__class__"])):
                yield str(node["__class__"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def is_product_model(name: str) -> bool:
    """Whether ``name`` is a loaded model or file entry of ours (nothing is imported).

    Note: a file entry is a dataclass (``DataFile``), in a flattening batch's result.
    """
    module_name, _, attribute = name.rpartition(".")
    module = sys.modules.get(module_name) if module_name.split(".")[0] in PRODUCT_PACKAGES else None
    found = getattr(module, attribute, None)
    return isinstance(found, type) and issubclass(found, (BaseModel, FileEntry))
