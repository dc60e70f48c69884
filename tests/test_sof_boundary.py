"""lowBoundary / highBoundary beyond what the SQL-on-FHIR suite's fn_boundary.json shows: the FHIRPath specification's
own examples, an explicit precision, zero and negative values, the digit limit, and decimals that reach the CSV without
an exponent."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest

from tasks.sof.output import CsvWriter, csv_cells
from tests.support.sof import column_values


def observation_values(path: str, value: str) -> list:
    return column_values(path, [{"resourceType": "Observation", "valueQuantity": {"value": Decimal(value)}}])


@pytest.mark.parametrize(
    ("value", "low", "high"),
    [
        ("1.0", "0.95000000", "1.05000000"),
        ("1.587", "1.58650000", "1.58750000"),
        ("-1.587", "-1.58750000", "-1.58650000"),
        ("5", "4.50000000", "5.50000000"),
        ("0", "-0.50000000", "0.50000000"),
        ("1234567890.5", "1234567890.45000000", "1234567890.55000000"),
        ("12345678901.5", None, None),
        ("1E+30", None, None),
        ("123456789012345678901234567890.5", None, None),
    ],
)
def test_decimal_boundaries_are_half_a_unit_either_side_to_eight_places(value, low, high):
    found_low = observation_values("value.ofType(Quantity).value.lowBoundary()", value)
    found_high = observation_values("value.ofType(Quantity).value.highBoundary()", value)
    assert found_low == [None if low is None else Decimal(low)]
    assert found_high == [None if high is None else Decimal(high)]
    if low is not None:
        assert str(found_low[0]) == low and str(found_high[0]) == high


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("value.ofType(Quantity).value.lowBoundary(2)", "1.58"),
        ("value.ofType(Quantity).value.highBoundary(2)", "1.59"),
        ("value.ofType(Quantity).value.lowBoundary(6)", "1.586500"),
        ("value.ofType(Quantity).value.highBoundary(4)", "1.5875"),
        ("value.ofType(Quantity).value.lowBoundary(0)", "1"),
    ],
)
def test_a_precision_rounds_the_boundary_outwards(path, expected):
    assert observation_values(path, "1.587") == [Decimal(expected)]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("birthDate.lowBoundary(4)", "2003-05", "2003"),
        ("birthDate.highBoundary(6)", "2003", "2003-12"),
        ("deceased.ofType(dateTime).lowBoundary(17)", "2010-10-10T15:21:18.123456", "2010-10-10T15:21:18.123+14:00"),
        ("deceased.ofType(dateTime).highBoundary(17)", "2010-10-10T15:21", "2010-10-10T15:21:59.999-12:00"),
        ("deceased.ofType(dateTime).highBoundary(12)", "2010-10-10", "2010-10-10T23:59"),
        ("deceased.ofType(dateTime).highBoundary()", "2010-10-10T15:21Z", "2010-10-10T15:21:59.999Z"),
        ("deceased.ofType(dateTime).lowBoundary()", "2010-10-10T15:21:18.123456Z", "2010-10-10T15:21:18.123Z"),
    ],
)
def test_dates_and_date_times_at_a_precision(path, value, expected):
    key = "birthDate" if path.startswith("birthDate") else "deceasedDateTime"
    assert column_values(path, [{"resourceType": "Patient", key: value}]) == [expected]


def test_decimals_reach_the_csv_without_an_exponent_row_by_row_and_in_batches():
    row = (Decimal("0E-8"), Decimal("1E-7"), Decimal("1E+2"), Decimal("1.50"))
    one, batched = io.StringIO(), io.StringIO()
    CsvWriter(one).writerow(csv_cells(row))
    CsvWriter(batched).writerows([row, ("text", 3, None, Decimal("-2E-3"))])  # the embedded engine's way
    assert one.getvalue().strip() == "0.00000000,0.0000001,100,1.50"
    assert batched.getvalue().splitlines() == ["0.00000000,0.0000001,100,1.50", "text,3,,-0.002"]
