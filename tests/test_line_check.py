"""The streaming line check (``LineChecker``, simdjson) accepts exactly what ``parse_resource`` (orjson) accepts
and refuses the rest in its words: the cases where the two parsers differ, and seeded random damage."""

import random

import orjson
import pytest

from tasks.streams.ndjson import NdjsonError, parse_resource
from tasks.streams.line_check import LineChecker

MB = 1024 * 1024
RESOURCE = b'{"resourceType":"Observation","id":"o1","valueQuantity":{"value":12.5,"unit":"mg/dL"},"note":"\xc3\xa4"}'


def checker_verdict(line: bytes) -> str:
    """``ok`` or the error text of a checker fed ``line`` and a valid line after it."""
    checker = LineChecker("input/a.ndjson", MB)
    try:
        checker.feed(line + b"\n" + RESOURCE + b"\n")
        checker.finish()
    except NdjsonError as exc:
        return str(exc)
    assert checker.resources == 2
    return "ok"


def orjson_verdict(line: bytes, line_number: int = 1) -> str:
    try:
        parse_resource("input/a.ndjson", line_number, line)
    except NdjsonError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        (b'{"resourceType":"A","resourceType":""}', False),  # orjson keeps the last key, simdjson finds the first
        (b'{"resourceType":"","resourceType":"A"}', True),
        (b'{"resourceType":"A","resource\\u0054ype":""}', False),  # the same key, escaped
        (b'{"resource\\u0054ype":"A"}', True),
        (b'\xef\xbb\xbf{"resourceType":"A"}', False),  # simdjson skips a byte order mark, orjson refuses it
        (b'{"resourceType":"A","v":123456789012345678901234567890}', True),  # beyond 64 bits: orjson only
        (b'{"resourceType":"A","v":-9223372036854775809}', True),
        (b'{"resourceType":"A","v":18446744073709551615}', True),
        (b'{"resourceType":"A","v":1e400}', False),
        (b'{"resourceType":"A","v":1e-400}', True),
        (b'{"resourceType":"A","v":NaN}', False),
        (b'{"resourceType":"A","v":Infinity}', False),
        (b'{"resourceType":"A","v":01}', False),
        (b'{"resourceType":"A","v":"\\ud800"}', False),  # a lone surrogate, escaped
        (b'{"resourceType":"A","v":"\\udc00"}', False),
        (b'{"resourceType":"A","v":"\\ud83d\\ude00"}', True),
        (b'{"resourceType":"A","v":"\xff"}', False),  # not UTF-8
        (b'{"resourceType":"A","v":"\xc0\xaf"}', False),  # an overlong encoding
        (b'{"resourceType":"A","v":"\xed\xa0\x80"}', False),  # a surrogate encoded in UTF-8
        (b'{"resourceType":"A","v":"a\x01"}', False),  # a raw control character
        (b'{"resourceType":"A\\u0000"}', True),
        (b'{"resourceType":"A",}', False),
        (b'{"resourceType":"A"}{"resourceType":"A"}', False),
        (b'{"resourceType":"A"}\x00', False),
        (b'{"resourceType":"A"}\x0c', False),
        (b'  {"resourceType":"A"}\t\r', True),
        (b'{"resourceType":1}', False),
        (b'{"resourceType":null}', False),
        (b'"Patient"', False),
        (b"[]", False),
        (b'{"resourceType":"A","v":' + b"[" * 1023 + b"]" * 1023 + b"}", True),  # orjson's depth limit
        (b'{"resourceType":"A","v":' + b'{"a":' * 1023 + b"1" + b"}" * 1023 + b"}", True),
        (b'{"resourceType":"A","v":' + b"[" * 1100 + b"]" * 1100 + b"}", False),
    ],
    ids=lambda value: "" if isinstance(value, bytes) else str(value),
)
def test_lines_where_simdjson_and_orjson_differ_get_orjsons_verdict(line, accepted):
    expected = orjson_verdict(line)
    assert (expected == "ok") == accepted
    assert checker_verdict(line) == expected


def test_an_error_names_file_and_line_in_orjsons_words_never_the_content():
    checker = LineChecker("input/a.ndjson", MB)
    with pytest.raises(NdjsonError) as error:
        checker.feed(RESOURCE + b"\n" + b'{"resourceType":"A","secret":"Jane Doe",}\n')
    assert str(error.value) == orjson_verdict(b'{"resourceType":"A","secret":"Jane Doe",}', line_number=2)
    assert "Jane" not in str(error.value)


def test_randomly_damaged_lines_get_the_same_verdict_as_orjson():
    rng = random.Random(15)
    lines = [
        RESOURCE,
        orjson.dumps({"resourceType": "Bundle", "entry": [{"resource": {"resourceType": "Patient", "id": "p"}}]}),
        b'{"resourceType":"Patient","name":[{"given":["J\\u00f6rg"]}],"n":[1,-2.5e3,true,false,null]}',
    ]
    pieces = [b"{", b"}", b"[", b"]", b'"', b"\\", b",", b":", b"\x00", b"\xff", b"\xc3", b"e", b"-", b"0", b"\\u"]
    refused = 0
    for _ in range(3000):
        line = bytearray(rng.choice(lines))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(line))
            match rng.randrange(3):
                case 0:
                    del line[at]
                case 1:
                    line[at:at] = rng.choice(pieces)
                case _:
                    line[at] = rng.randrange(256)
        line = bytes(line).replace(b"\n", b" ")
        if not line.strip():
            continue
        expected = orjson_verdict(line)
        assert checker_verdict(line) == expected, line
        refused += expected != "ok"
    assert refused > 1000  # the damage was real


def test_a_line_only_orjson_can_read_does_not_stop_the_lines_after_it():
    checker = LineChecker("a.ndjson", MB)
    big = b'{"resourceType":"A","v":123456789012345678901234567890}'
    checker.feed((big + b"\n" + RESOURCE + b"\n") * 3)
    checker.finish()
    assert (checker.lines, checker.resources) == (6, 6)


def test_lines_after_a_large_one_are_still_checked():
    large = b'{"resourceType":"Binary","data":"' + b"x" * (3 * MB) + b'"}'
    checker = LineChecker("a.ndjson", 8 * MB)
    checker.feed(large + b"\n" + RESOURCE + b"\n" + large + b"\n")
    with pytest.raises(NdjsonError, match="a.ndjson: line 4 is not valid JSON"):
        checker.feed(b'{"resourceType":"A"\n')
    assert (checker.lines, checker.resources) == (4, 3)


BUNDLE = b'{"resourceType":"Bundle","type":"transaction","entry":[{"resource":{"resourceType":"Patient"}},{}]}'


@pytest.mark.parametrize(
    "bundle",
    [BUNDLE, BUNDLE[:-1] + b',"n":123456789012345678901234567890}'],  # the second goes to orjson (a big integer)
    ids=["simdjson", "orjson"],
)
def test_bundles_and_their_entries_are_counted_apart_from_resources(bundle):
    checker = LineChecker("input/a.ndjson", MB)
    empty_bundle = b'{"resourceType":"Bundle","type":"transaction"}'
    checker.feed(bundle + b"\n" + RESOURCE + b"\n\n" + empty_bundle + b"\n" + bundle)
    checker.finish()
    assert checker.counts() == (4, 3, 4)  # 4 lines: 3 Bundles holding 2 + 0 + 2 resources, and one resource
