"""Reading resources for the engine: NDJSON lines with decimals kept as written, Bundles opened into entries."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from tasks.sof.errors import ResourceLineError

_DECIMAL_NUMBER = re.compile(rb"[:\[,]\s*-?\d+(?:\.\d|[eE])")


def parse_line(source: Path | str, number: int, line: bytes) -> dict[str, Any]:
    """One NDJSON line; decimals as ``Decimal`` (they reach the CSV as written), the fast parser when there are none.

    A line "has decimals" when a number with a fraction or exponent follows ``:``, ``[`` or ``,``; a string that
    looks like that only costs the slower parser, never a wrong value.
    """
    try:
        resource = json.loads(line, parse_float=Decimal) if _DECIMAL_NUMBER.search(line) else orjson.loads(line)
    except ValueError as exc:
        raise ResourceLineError(f"{source}: line {number} is not valid JSON ({exc})") from exc
    except RecursionError:  # the decimal-keeping parser recurses per level; orjson stops at 1024 levels itself
        raise ResourceLineError(f"{source}: line {number} is nested too deeply to be a FHIR resource") from None
    if not isinstance(resource, dict):
        raise ResourceLineError(f"{source}: line {number} is not a JSON object")
    return resource


def line_resources(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The resources of one line: a Bundle's entries, or the resource itself."""
    if resource.get("resourceType") != "Bundle":
        return [resource]
    return [e["resource"] for e in resource.get("entry") or [] if isinstance((e or {}).get("resource"), dict)]
