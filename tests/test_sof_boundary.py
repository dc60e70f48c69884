"""lowBoundary / highBoundary beyond what the SQL-on-FHIR suite's fn_boundary.json shows: the FHIRPath specification's
own examples, an explicit precision, zero and negative values, the digit limit, and decimals that reach the CSV without
an exponent."""

from __future__ import annotations

import csv
import io
import random
from decimal import Decimal

import pytest

from tasks.sof.output import CsvWriter, cell, csv_cells
from tasks.sof.resources import parse_line
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


def test_integers_beyond_64_bits_keep_their_digits_and_a_huge_exponent_stays_a_short_cell():
    """orjson made a float of 12345678901234567890123 (12345678901234568000000 in the CSV) and refused it inside an
    object cell; 1e50000000 became a cell of 50 MB."""
    big = b'"valueQuantity":{"value":12345678901234567890123,"unit":"mg"}'
    obs = parse_line("in.ndjson", 1, b'{"resourceType":"Observation","id":"o1",' + big + b"}")
    assert csv_cells(tuple(column_values("value.ofType(Quantity).value", [obs]))) == ["12345678901234567890123"]
    quantity = csv_cells(tuple(column_values("value.ofType(Quantity)", [obs])))
    assert quantity == ['{"value":12345678901234567890123,"unit":"mg"}']
    negative = b'{"resourceType":"Observation","id":"o3","valueQuantity":{"value":-9999999999999999999}}'
    below = parse_line("in.ndjson", 3, negative)  # 19 digits, below -2**63
    assert csv_cells(tuple(column_values("value.ofType(Quantity).value", [below]))) == ["-9999999999999999999"]
    bomb = parse_line("in.ndjson", 2, b'{"resourceType":"Observation","id":"o2","valueQuantity":{"value":1e50000000}}')
    assert csv_cells(tuple(column_values("value.ofType(Quantity).value", [bomb]))) == ["1E+50000000"]
    assert csv_cells((Decimal("1E-7"), {"v": Decimal("1E-7")})) == ["0.0000001", '{"v":0.0000001}']


def test_batched_csv_lines_are_what_python_csv_writes_for_every_kind_of_cell():
    """The batch path (CSV made from the rows' JSON) against ``csv``: cells that need quoting, nulls in runs, the
    text "null", brackets, non-ASCII, control characters, large ints, one-column rows."""
    rng = random.Random(7)
    cells = [
        "",
        "a",
        "null",
        "nul",
        ",",
        "a,b",
        '"',
        'x"y',
        "\n",
        "\r",
        "a\rb",
        "\\",
        "[",
        "]",
        "],[",
        "[null]",
        "[null",
        "a]b",
        "\t",
        "\x00",
        " lead",
        "é€😀",
        "\u2028",
        None,
        None,
        None,
        True,
        False,
        0,
        -12,
        2**63,
        2**70,
    ]
    strings = [value for value in cells if isinstance(value, str)]  # the rows of CompiledView.csv_rows
    for width in (1, 2, 3, 7):
        for attempt in range(400):
            chosen = strings if attempt % 2 else cells
            rows = [tuple(rng.choice(chosen) for _ in range(width)) for _ in range(rng.randint(1, 6))]
            ours, theirs = io.StringIO(), io.StringIO()
            CsvWriter(ours).writerows(rows)
            reference = csv.writer(theirs, lineterminator="\n")
            for row in (tuple(cell(value) if isinstance(value, bool) else value for value in row) for row in rows):
                if any(isinstance(value, str) and "\r" in value for value in row):
                    continue  # a bare CR is quoted by CsvWriter, where csv leaves it (tested above)
                reference.writerow(row)
            kept = [row for row in rows if not any(isinstance(value, str) and "\r" in value for value in row)]
            if len(kept) == len(rows):
                assert ours.getvalue() == theirs.getvalue(), rows


def test_batched_lines_written_as_bytes_keep_their_place_among_text_lines(tmp_path):
    """To a UTF-8 file the batch path writes bytes under the text layer: header, batches and rows ``csv`` writes
    stay in order, the same as written to a string."""
    calls = [[("é", None, 1)], [("a,b", "c", True)], [("x", "y", 2)] * 3, [("\r", "z", None)], [("€", "", False)]]
    path, text = tmp_path / "rows.csv", io.StringIO()
    with path.open("w", encoding="utf-8", newline="") as stream:
        for target in (CsvWriter(stream), CsvWriter(text)):
            target.writerow(["h1", "h2", "h3"])
            for rows in calls:
                target.writerows(rows)
    assert path.read_bytes().decode() == text.getvalue()
    assert text.getvalue().splitlines()[:3] == ["h1,h2,h3", "é,,1", '"a,b",c,true']
