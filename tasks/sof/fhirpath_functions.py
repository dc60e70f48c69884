"""The FHIRPath functions the engine gives fhirpathpy: SQL-on-FHIR's own and bounded replacements of its own.

Registered in fhirpathpy's invocation table (``SOF_FUNCTIONS``): ``getResourceKey``, ``getReferenceKey``,
``lowBoundary``, ``highBoundary`` and ``join`` as the SQL-on-FHIR suite reads it. Bounds, each a ``FhirPathError``:
- ``matches`` and ``replaceMatches`` run on RE2, linear in the text, where Python's ``re`` backtracks exponentially
  (``matches('^(a+)+$')`` on 35 characters: hours); a pattern with backreferences or lookaround is refused;
- ``repeat()`` stops at ``MAX_REPEAT_ELEMENTS`` elements (fhirpathpy's copies its list per element: quadratic);
- ``&``, ``+``, ``join``, ``replace``, ``replaceMatches``, ``aggregate`` and ``repeat`` make no string or collection
  of more than ``MAX_COMPUTED_SIZE`` characters (elements count one each): the ways an expression of bounded size
  builds a value of unbounded size (``.select($this & $this)`` doubles per link, ``aggregate($total & $total, '')``
  per element, ``.replace('x', 'xxxxxxxxxx')`` grows tenfold per call).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import re2
from fhirpathpy.engine.invocations import math, strings
from fhirpathpy.engine.nodes import ResourceNode

from tasks.sof.boundary import boundary
from tasks.sof.errors import FhirPathError
from tasks.sof.fhirpath_shared import (
    MAX_COMPUTED_SIZE,
    MAX_REPEAT_ELEMENTS,
    joined,
    reference_keys,
    refuse_larger,
    resource_keys,
)


def get_resource_key(ctx: dict, inputs: list) -> list[str]:
    """``Type/id`` of each resource in the input (the key ``getReferenceKey`` gives for a reference to it)."""
    return resource_keys([_data(node) for node in inputs])


def get_reference_key(ctx: dict, inputs: list, type_info: Any = None) -> list[str]:
    """``Type/id`` of each Reference (history and base URL dropped); only those of the given type, if any."""
    return reference_keys([_data(node) for node in inputs], getattr(type_info, "name", None))


def join(ctx: dict, inputs: list, separator: Any = "") -> Any:
    """FHIRPath's ``join``: the input strings joined, ``''`` for an empty input (as the SQL-on-FHIR suite expects;
    fhirpathpy's gives no value), no value for an empty separator collection."""
    return [] if isinstance(separator, list) else joined([_data(node) for node in inputs], separator)


def amp(ctx: dict, left: Any = "", right: Any = "") -> str:
    """FHIRPath's ``&`` (an empty operand counts as ``''``), refused before it builds a string too large."""
    left, right = ("" if isinstance(side, list) and not side else side for side in (left, right))
    refuse_larger("&", len(left) + len(right))
    return math.amp(ctx, left, right)


def plus(ctx: dict, left: list, right: list) -> Any:
    """FHIRPath's ``+``, its result checked (strings join as with ``&``)."""
    return _bounded("+", math.plus(ctx, left, right))


def _data(node: Any) -> Any:
    return node.data if isinstance(node, ResourceNode) else node


def _boundary(high: bool) -> Callable[..., list]:
    def invoke(ctx: dict, inputs: list, precision: Any = None) -> list:
        digits = None if precision in (None, []) else int(precision)
        results = []
        for node in inputs:
            type_path = node.path if isinstance(node, ResourceNode) else None
            if (result := boundary(_data(node), type_path, digits, high=high)) is not None:
                results.append(result)
        return results

    return invoke


@lru_cache(maxsize=256)
def regex(pattern: str, dot_matches_newline: bool) -> Any:
    """``pattern`` compiled by RE2 (once per process); a pattern RE2 cannot run is a ``FhirPathError``."""
    options = re2.Options()
    options.dot_nl = dot_matches_newline
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else reason
        raise FhirPathError(
            f"regular expression {pattern!r} is not supported ({reason}): regexes run on RE2, which has no "
            "backreferences or lookaround (they can take exponential time)"
        ) from None


def matches(ctx: dict, inputs: list, pattern: Any) -> Any:
    """fhirpathpy's ``matches`` (search, ``.`` matching newlines), on RE2; empty input or regex give no value."""
    if not inputs or isinstance(pattern, list):
        return []
    return regex(pattern, True).search(_single_string(inputs)) is not None


def replace_matches(ctx: dict, inputs: list, pattern: Any, replacement: Any) -> Any:
    """fhirpathpy's ``replaceMatches`` (``$1`` for the first group), on RE2; empty input, regex or substitution
    give no value."""
    if not inputs or isinstance(pattern, list) or isinstance(replacement, list):
        return []
    text, compiled = _single_string(inputs), regex(pattern, False)
    size = len(text)
    for _ in compiled.finditer(text):  # counted only as far as the bound: every match adds a replacement
        if (size := size + len(replacement)) > MAX_COMPUTED_SIZE:
            break
    refuse_larger("replaceMatches()", size)
    return _bounded("replaceMatches()", compiled.sub(re.sub(r"\$(\d+)", r"\\\1", replacement), text))


def replace(ctx: dict, inputs: list, pattern: Any, substitution: Any) -> Any:
    """fhirpathpy's ``replace``, refused before it builds a string larger than ``MAX_COMPUTED_SIZE``."""
    if inputs and isinstance(pattern, str) and isinstance(substitution, str):
        text = _single_string(inputs)
        count = len(text) + 1 if pattern == "" else text.count(pattern)
        refuse_larger("replace()", len(text) + count * (len(substitution) - len(pattern)))
    return strings.replace(ctx, inputs, pattern, substitution)


def aggregate(ctx: dict, inputs: list, expression: Callable[[Any], Any], initial: Any = None) -> Any:
    """fhirpathpy's ``aggregate``, its ``$total`` checked after each element."""
    ctx["$total"] = initial
    for index, element in enumerate(inputs):
        ctx["$index"] = index
        ctx["$total"] = _bounded("aggregate()", expression(element))
    return ctx["$total"]


def _bounded(function: str, value: Any) -> Any:
    refuse_larger(function, _size(value if isinstance(value, list) else [value]))
    return value


def _size(values: list) -> int:
    """A collection's size as the bound counts it: one per element, and each string's characters."""
    return len(values) + sum(len(item) for item in values if isinstance(item, str))


def _single_string(inputs: list) -> str:
    if len(inputs) == 1 and isinstance(data := _data(inputs[0]), str):
        return data
    raise FhirPathError(f"expected one string, got {inputs!r:.200}")


def repeat(ctx: dict, inputs: Any, expression: Callable[[Any], list]) -> list:
    """fhirpathpy's ``repeat`` (breadth first, each element once), in linear time and bounded."""
    if not isinstance(inputs, list):
        return []
    found: list = []
    seen: set = set()
    pending = deque(inputs)
    size = 0
    while pending:
        fresh = [element for element in expression(pending.popleft()) if element not in seen]
        size += _size(fresh)
        refuse_larger("repeat()", size)
        seen.update(fresh)
        found.extend(fresh)
        pending.extend(fresh)
        if len(found) > MAX_REPEAT_ELEMENTS:
            raise FhirPathError(f"repeat() reaches more than {MAX_REPEAT_ELEMENTS:,} elements")
    return found


SOF_FUNCTIONS: dict[str, dict[str, Any]] = {
    "getResourceKey": {"fn": get_resource_key, "arity": {0: []}},
    "getReferenceKey": {"fn": get_reference_key, "arity": {0: [], 1: ["TypeSpecifier"]}},
    "lowBoundary": {"fn": _boundary(high=False), "arity": {0: [], 1: ["Integer"]}},
    "highBoundary": {"fn": _boundary(high=True), "arity": {0: [], 1: ["Integer"]}},
    "matches": {"fn": matches, "arity": {1: ["String"]}, "nullable_input": True},
    "replaceMatches": {"fn": replace_matches, "arity": {2: ["String", "String"]}, "nullable_input": True},
    "repeat": {"fn": repeat, "arity": {1: ["Expr"]}},
    "replace": {"fn": replace, "arity": {2: ["String", "String"]}, "nullable_input": True},
    "&": {"fn": amp, "arity": {2: ["String", "String"]}},
    "+": {"fn": plus, "arity": {2: ["Any", "Any"]}, "nullable": True},
    "aggregate": {"fn": aggregate, "arity": {1: ["Expr"], 2: ["Expr", "Any"]}},
    "join": {"fn": join, "arity": {0: [], 1: ["String"]}},
}
