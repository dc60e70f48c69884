"""FHIRPath ``lowBoundary`` / ``highBoundary`` of decimals, dates and times.

The ends of the range a value's precision allows, as the SQL-on-FHIR suite reads them (``1.5``:
[1.45, 1.55)); the rules are in docs/development.md, "The SQL-on-FHIR engine".
"""

import calendar
import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from fhirpathpy.engine.nodes import FP_DateTime, FP_Time

DEFAULT_DECIMAL_PLACES = 8
MAX_DECIMAL_PLACES = 28
MAX_SIGNIFICANT_DIGITS = 18
MILLISECOND_DIGITS = 3
_DATE = re.compile(r"^(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?$")
_DATETIME = re.compile(
    r"^(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?)?)?)?"
    r"(Z|[+-]\d{2}:\d{2})?$"
)
_TIME = re.compile(r"^(\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?$")


def boundary(value: Any, type_name: str | None, precision: int | None, *, high: bool) -> Any:
    """``value``'s ``highBoundary`` (``high``) or ``lowBoundary``; None if it has none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal | float):
        return _decimal(Decimal(str(value)), precision, high)
    if isinstance(value, FP_Time):
        value, type_name = str(value).lstrip("T"), "time"
    elif isinstance(value, FP_DateTime):
        value, type_name = str(value), None
    elif not isinstance(value, str):
        return None
    if type_name is None:  # the text tells: a time has a colon, a date-time a T
        type_name = "time" if _TIME.match(value) and ":" in value else "date"
        type_name = "dateTime" if "T" in value else type_name
    bound = {"date": _date, "dateTime": _datetime, "instant": _datetime, "time": _time}
    return bound[type_name](value, precision, high) if type_name in bound else None


def _decimal(value: Decimal, precision: int | None, high: bool) -> Decimal | None:
    places = DEFAULT_DECIMAL_PLACES if precision is None else precision
    exponent = value.as_tuple().exponent
    if not 0 <= places <= MAX_DECIMAL_PLACES or not isinstance(exponent, int):
        return None
    half = Decimal(5).scaleb(min(exponent, 0) - 1)
    try:  # a value of more digits than the decimal context holds (28) has no boundary
        bound = (value + half if high else value - half).quantize(
            Decimal(1).scaleb(-places), rounding=ROUND_CEILING if high else ROUND_FLOOR
        )
    except InvalidOperation:
        return None
    return bound if len(bound.as_tuple().digits) <= MAX_SIGNIFICANT_DIGITS else None


def _date(text: str, precision: int | None, high: bool) -> str | None:
    if _DATE.match(text) is None or precision not in (None, 4, 6, 8):
        return None
    return _datetime(text, precision or 8, high)


def _milliseconds(digits: str | None, high: bool) -> str:
    return (digits or "")[:MILLISECOND_DIGITS].ljust(MILLISECOND_DIGITS, "9" if high else "0")


def _datetime(text: str, precision: int | None, high: bool) -> str | None:
    if (match := _DATETIME.match(text)) is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    # the first (or last) month and day the digits stand for; the regex gave them 2 digits each
    month = month or ("12" if high else "01")
    day = day or (f"{calendar.monthrange(int(year), int(month))[1]}" if high else "01")
    hour = hour or ("23" if high else "00")
    minute, second = (part or ("59" if high else "00") for part in (minute, second))
    zone = zone or ("-12:00" if high else "+14:00")
    date = f"{year}-{month}-{day}"
    if precision is None or precision == 17:
        return f"{date}T{hour}:{minute}:{second}.{_milliseconds(fraction, high)}{zone}"
    cuts = {4: date[:4], 6: date[:7], 8: date, 10: f"{date}T{hour}", 12: f"{date}T{hour}:{minute}"}
    cuts[14] = f"{date}T{hour}:{minute}:{second}"
    return cuts.get(precision)


def _time(text: str, precision: int | None, high: bool) -> str | None:
    if (match := _TIME.match(text)) is None:
        return None
    hour, minute, second, fraction = match.groups()
    minute, second = (part or ("59" if high else "00") for part in (minute, second))
    if precision is None or precision == 9:
        return f"{hour}:{minute}:{second}.{_milliseconds(fraction, high)}"
    return {2: hour, 4: f"{hour}:{minute}", 6: f"{hour}:{minute}:{second}"}.get(precision)
