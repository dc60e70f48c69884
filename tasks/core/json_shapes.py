"""Reading a parsed JSON document of someone else's (a server's answer, a data line, a CRTDL): an array where one
belongs, or an object, else nothing. Iterating what is not a list failed with a bare TypeError (a number), or read
a string character by character; ``.get`` on what is not an object, with an AttributeError."""

from __future__ import annotations

from typing import Any, TypeAlias

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
"""A parsed JSON document (``json.loads``, orjson, msgspec): what the engine and the clients read and write."""


def as_array(value: Any) -> list:
    return value if isinstance(value, list) else []


def as_object(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_objects(value: Any) -> list[dict]:
    """The objects of an array, anything else in it skipped."""
    return [item for item in as_array(value) if isinstance(item, dict)]
