"""Duration values of the configuration, up to ``MAX_DURATION``.

ISO 8601 (``P1DT2H``; no years or months: their length varies), short forms (``1h30m``,
``500ms``: d, h, m, s, ms) or a bare ``0`` (for some keys "the default"), in any case. Another
bare number is refused: ``30`` could be seconds or minutes. docs/configuration.md says more.
"""

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

ACCEPTED_FORMS = (
    "use ISO 8601 (PT30M, PT5S, PT1M30S, P1D, PT0.5S) or a short form (30m, 30s, 1h30m, 500ms)"
)

_NUMBER = r"(\d+(?:\.\d+)?)"
# a number after P and after T: "P", "PT" and "P1DT" are no durations
_ISO_PATTERN = re.compile(
    rf"P(?=\d|T\d)(?:{_NUMBER}W)?(?:{_NUMBER}D)?"
    rf"(?:T(?=\d)(?:{_NUMBER}H)?(?:{_NUMBER}M)?(?:{_NUMBER}S)?)?",
    re.IGNORECASE,
)
_SHORT_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)", re.IGNORECASE)
_SHORT_PATTERN = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+", re.IGNORECASE)
_SHORT_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ISO_UNIT_SECONDS = (604800.0, 86400.0, 3600.0, 60.0, 1.0)  # W, D, H, M, S
MAX_DURATION = timedelta(days=3650)
"""Longer values are refused: no wait lasts 10 years, and sleeping that long overflows."""
MAX_SHOWN_CHARS = 40


def parse_duration(text: str) -> timedelta:
    """Parse one duration string; a ValueError naming the accepted forms if it is none."""
    value = text.strip()
    if value == "0":
        return timedelta(0)
    if re.fullmatch(r"[+-]?\d+(\.\d+)?", value):
        raise ValueError(
            f"'{value[:MAX_SHOWN_CHARS]}' has no unit, which is ambiguous; {ACCEPTED_FORMS}"
        )
    shown = value if len(value) <= MAX_SHOWN_CHARS else value[:MAX_SHOWN_CHARS] + "…"
    if iso := _ISO_PATTERN.fullmatch(value):
        parts = zip(iso.groups(), _ISO_UNIT_SECONDS, strict=True)
        return _bounded(sum(float(part or 0) * unit for part, unit in parts), shown)
    if _SHORT_PATTERN.fullmatch(value):
        total = sum(
            float(number) * _SHORT_UNIT_SECONDS[unit.lower()]
            for number, unit in _SHORT_PART.findall(value)
        )
        return _bounded(total, shown)
    raise ValueError(f"'{shown}' is not a duration; {ACCEPTED_FORMS}")


def _bounded(seconds: float, shown: str) -> timedelta:
    if not seconds <= MAX_DURATION.total_seconds():  # also inf and nan, of absurdly long numbers
        raise ValueError(
            f"'{shown}' is longer than the maximum of {format_duration(MAX_DURATION)} (10 years)"
        )
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Format a timedelta as a compact ISO 8601 duration (PT1M30S, P1D, PT0.5S, PT0S)."""
    total_ms = round(value.total_seconds() * 1000)
    days, rest_ms = divmod(total_ms, 86_400_000)
    hours, rest_ms = divmod(rest_ms, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    parts = ((hours, "H"), (minutes, "M"), (rest_ms / 1000, "S"))
    time_part = "".join(f"{amount:g}{unit}" for amount, unit in parts if amount)
    if not days and not time_part:
        return "PT0S"
    return "P" + (f"{days}D" if days else "") + ("T" + time_part if time_part else "")


def _validate_duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool):
        message = "must be a duration, not true/false"
    elif isinstance(value, (int, float)):
        if value == 0:
            return timedelta(0)
        message = f"a bare number ({value}) is ambiguous because it has no unit"
    else:
        message = "must be a duration"
    raise ValueError(f"{message}; {ACCEPTED_FORMS}")


Duration = Annotated[
    timedelta,
    BeforeValidator(_validate_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A timedelta field written as an ISO 8601 or short-form duration."""
