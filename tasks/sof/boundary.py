"""FHIRPath ``lowBoundary`` / ``highBoundary`` for decimals, dates, date-times and times, as SQL-on-FHIR reads them.

A value stands for every value that starts with its digits: ``1.5`` for [1.5, 1.6), ``2010-10`` for October 2010,
``12:34`` for that minute. The boundaries are that range's ends, filled with the lowest or highest digits:

- decimals to 8 places unless a precision is given (``1.5`` gives 1.50000000 and 1.59999999), the digits filled
  regardless of sign, as the SQL-on-FHIR suite (``fn_boundary.json``) and Pathling have it. The FHIRPath
  specification's examples read a decimal as half a unit either side instead (0.95 / 1.05 for 1.0); views are written
  for SQL-on-FHIR engines, and rows that agree with theirs are what their users compare. A boundary needing more than
  18 significant digits, the precision every xs:decimal processor (and so every FHIR decimal) must hold, is empty;
- date-times and times to nanoseconds unless a precision is given (17 for a date-time, 9 for a time: milliseconds;
  fewer cut the value, e.g. 4 year, 6 month, 8 day). A date-time without a time zone may be in any zone: its low
  boundary is in +14:00, its high boundary in -12:00.
"""

from __future__ import annotations

import calendar
import re
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any

from fhirpathpy.engine.nodes import FP_DateTime, FP_Time

DEFAULT_DECIMAL_PLACES = 8
MAX_DECIMAL_PLACES = 28
MAX_SIGNIFICANT_DIGITS = 18
FRACTION_DIGITS = 9
MILLISECOND_DIGITS = 3
_DATE = re.compile(r"^(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?$")
_DATETIME = re.compile(
    r"^(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?)?)?)?"
    r"(Z|[+-]\d{2}:\d{2})?$"
)
_TIME = re.compile(r"^(\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?$")
_DATE_TYPES = {"date"}
_DATETIME_TYPES = {"dateTime", "instant"}


def boundary(value: Any, type_name: str | None, precision: int | None, *, high: bool) -> Any:
    """``value``'s ``highBoundary`` (``high``) or ``lowBoundary``; None where it has none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | Decimal | float):
        return _decimal(Decimal(str(value)), precision, high)
    if isinstance(value, FP_Time):
        return _time(str(value).lstrip("T"), precision, high)
    if isinstance(value, FP_DateTime):
        text = str(value)
        return _datetime(text, precision, high) if "T" in text else _date(text, precision, high)
    if not isinstance(value, str):
        return None
    if type_name in _DATE_TYPES:
        return _date(value, precision, high)
    if type_name in _DATETIME_TYPES:
        return _datetime(value, precision, high)
    if type_name == "time" or (type_name is None and _TIME.match(value) and ":" in value):
        return _time(value, precision, high)
    if type_name is None and "T" in value:
        return _datetime(value, precision, high)
    if type_name is None and _DATE.match(value):
        return _date(value, precision, high)
    return None


def _decimal(value: Decimal, precision: int | None, high: bool) -> Decimal | None:
    places = DEFAULT_DECIMAL_PLACES if precision is None else precision
    exponent = value.as_tuple().exponent
    if not 0 <= places <= MAX_DECIMAL_PLACES or not isinstance(exponent, int):
        return None
    known = min(max(-exponent, 0), places)
    unit, step = Decimal(1).scaleb(-known), Decimal(1).scaleb(-places)
    try:  # a value of more digits than the decimal context holds (28) has no boundary
        kept = value.quantize(unit, rounding=ROUND_DOWN)
        bound = (kept.copy_abs() + (unit - step if high else 0)).copy_sign(value).quantize(step)
    except InvalidOperation:
        return None
    return bound if len(bound.as_tuple().digits) <= MAX_SIGNIFICANT_DIGITS else None


def _date(text: str, precision: int | None, high: bool) -> str | None:
    match = _DATE.match(text)
    if match is None:
        return None
    date = _full_date(*match.groups(), high)
    return date if precision is None else {4: date[:4], 6: date[:7], 8: date}.get(precision)


def _full_date(year: str, month: str | None, day: str | None, high: bool) -> str:
    """The first (or last) day the digits stand for."""
    year_number = int(year)
    month_number = int(month) if month else (12 if high else 1)
    day_number = int(day) if day else (calendar.monthrange(year_number, month_number)[1] if high else 1)
    return f"{year_number:04d}-{month_number:02d}-{day_number:02d}"


def _fraction(digits: str | None, precision: int | None, high: bool) -> str:
    """The fraction of a second: nanoseconds by default, milliseconds at the precision that names them."""
    width = FRACTION_DIGITS if precision is None else MILLISECOND_DIGITS
    return (digits or "")[:width].ljust(width, "9" if high else "0")


def _datetime(text: str, precision: int | None, high: bool) -> str | None:
    match = _DATETIME.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    hour = hour or ("23" if high else "00")
    minute = minute or ("59" if high else "00")
    second = second or ("59" if high else "00")
    zone = zone or ("-12:00" if high else "+14:00")
    date = _full_date(year, month, day, high)
    if precision is None or precision == 17:
        return f"{date}T{hour}:{minute}:{second}.{_fraction(fraction, precision, high)}{zone}"
    cuts = {4: date[:4], 6: date[:7], 8: date, 10: f"{date}T{hour}", 12: f"{date}T{hour}:{minute}"}
    cuts[14] = f"{date}T{hour}:{minute}:{second}"
    return cuts.get(precision)


def _time(text: str, precision: int | None, high: bool) -> str | None:
    match = _TIME.match(text)
    if match is None:
        return None
    hour, minute, second, fraction = match.groups()
    minute = minute or ("59" if high else "00")
    second = second or ("59" if high else "00")
    if precision is None or precision == 9:
        return f"{hour}:{minute}:{second}.{_fraction(fraction, precision, high)}"
    cuts = {2: hour, 4: f"{hour}:{minute}", 6: f"{hour}:{minute}:{second}"}
    return cuts.get(precision)
