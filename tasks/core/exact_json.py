"""JSON keeping its numbers' digits: decimals as ``Decimal``, big integers whole.

Why: orjson drops a decimal's trailing zeros (``1.50``) and makes a float of an integer beyond
64 bits, while FHIR's decimal precision is significant. For the data a step passes on after
taking it apart (a split Bundle). Import-light.
"""

import functools
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is no JSON number")


EXACT_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=_refuse_constant)
"""Made once (``json.loads(parse_float=...)`` makes one per call); refuses ``NaN``, as orjson."""


def loads_exact(data: bytes) -> Any:  # JSON with Decimal numbers: its callers index it freely
    return EXACT_DECODER.decode(data.decode("utf-8"))


def dumps_exact(value: object, decimal_text: Callable[[Decimal], str] = str) -> bytes:
    """Compact JSON of ``value``: a ``Decimal`` as ``decimal_text`` says, ints whole."""
    fragment = _fragment_writer(decimal_text)
    try:
        return orjson.dumps(value, default=fragment)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_big_ints_as_decimals(value), default=fragment)


@functools.cache
def _fragment_writer(decimal_text: Callable[[Decimal], str]) -> Callable[[object], orjson.Fragment]:
    """orjson's ``default`` for ``decimal_text``, made once per function.

    Why: a closure per call cost 15 % of a cell.
    """

    def fragment(item: object) -> orjson.Fragment:
        if isinstance(item, Decimal):
            return orjson.Fragment(decimal_text(item))
        raise TypeError(f"cannot write {type(item).__name__} as JSON")

    return fragment


def _big_ints_as_decimals(value: object) -> object:
    if isinstance(value, dict):
        return {key: _big_ints_as_decimals(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_big_ints_as_decimals(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return Decimal(value)
    return value
