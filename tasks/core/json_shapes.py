"""A parsed JSON document of someone else's: an array or object where one belongs.

Why: iterating what is not a list failed with a bare TypeError (a number), or read a string
character by character; ``.get`` on what is not an object, with an AttributeError.
"""

from typing import Any, TypeAlias

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
"""A parsed JSON document (``json.loads``, orjson, msgspec): what the engine and clients use."""
JsonObject: TypeAlias = dict[str, Any]
"""A parsed JSON object: a resource, a ViewDefinition, an API's answer, or a part of one."""

# The items are Any, not JSON, until the callers (tasks/sof, tasks/clients) narrow what they read.


def as_array(value: JSON) -> list[Any]:
    return value if isinstance(value, list) else []


def as_object(value: JSON) -> JsonObject:
    return value if isinstance(value, dict) else {}


def as_objects(value: JSON) -> list[JsonObject]:
    """The objects of an array, anything else in it skipped."""
    return [item for item in as_array(value) if isinstance(item, dict)]
