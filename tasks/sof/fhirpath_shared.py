"""What FHIRPath's two ways of evaluating share, without importing fhirpathpy.

Why: fhirpathpy's package imports its parser and evaluator (0.1 s, most of a small ``view run``'s
start), which a view of member paths never uses. ``MODEL`` is ``fhirpathpy.models.models["r4"]``,
read from its files.
"""

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from tasks.core.json_shapes import JsonObject
from tasks.sof.errors import FhirPathError

# refused when compiled: fhirpathpy's parser and evaluator recurse per level
MAX_EXPRESSION_DEPTH = 100
SHOWN_EXPRESSION_CHARS = 120
TOO_DEEP = (
    f"nested more than {MAX_EXPRESSION_DEPTH} levels deep (split it, or drop redundant parentheses)"
)
MAX_REPEAT_ELEMENTS = 10_000
MAX_COMPUTED_SIZE = 1 << 20
"""FHIR allows no string over 1 MB: a computed one larger than that is a runaway expression."""


def r4_model() -> JsonObject:
    spec = importlib.util.find_spec("fhirpathpy")
    assert spec is not None and spec.submodule_search_locations  # a dependency
    folder = Path(next(iter(spec.submodule_search_locations))) / "models" / "r4"
    return {path.stem: orjson.loads(path.read_bytes()) for path in sorted(folder.glob("*.json"))}


MODEL = r4_model()


class Item(NamedTuple):
    """One element of a collection: its JSON data and FHIR type path (None: computed)."""

    data: Any
    path: str | None = None


Env = Mapping[str, Any]


Collection = list[Any]
"""A FHIRPath collection: JSON values, or fhirpathpy's nodes and values."""
Collected = tuple[Collection, str | None | list[Any]]
"""Values collected and their type paths: one for all of them, or a list with one per value."""


def data_and_paths(items: list[Item]) -> Collected:
    return [item.data for item in items], [item.path for item in items]


def shown(expression: str) -> str:
    """The expression as error messages quote it (a long one cut short)."""
    if len(expression) <= SHOWN_EXPRESSION_CHARS:
        return repr(expression)
    return f"{expression[:SHOWN_EXPRESSION_CHARS]!r}... ({len(expression)} characters)"


def resource_keys(found: Collection) -> list[str]:
    return [
        f"{data['resourceType']}/{data['id']}"
        for data in found
        if isinstance(data, Mapping) and "resourceType" in data and "id" in data
    ]


def reference_key(reference: Any) -> str | None:
    """``Type/id`` of a literal reference (URL, ``_history`` and a last ``/`` dropped)."""
    if not isinstance(reference, str):
        return None
    parts = reference.split("/_history")[0].rstrip("/").split("/")
    return f"{parts[-2]}/{parts[-1]}" if len(parts) >= 2 else None


def reference_keys(found: Collection, wanted: str | None) -> list[str]:
    keys = [reference_key(data.get("reference")) for data in found if isinstance(data, Mapping)]
    return [key for key in keys if key and wanted in (None, key.partition("/")[0])]


def joined(found: Collection, separator: str) -> str:
    if not all(isinstance(value, str) for value in found):
        raise FhirPathError(f"join needs a collection of strings, got {found!r:.200}")
    refuse_larger("join()", sum(map(len, found)) + len(separator) * max(len(found) - 1, 0))
    return separator.join(found)


def refuse_larger(function: str, size: int) -> None:
    if size > MAX_COMPUTED_SIZE:
        raise FhirPathError(
            f"{function} makes a value of more than {MAX_COMPUTED_SIZE:,} characters"
        )
