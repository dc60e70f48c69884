"""``LineSplitter.numbered``: short lines cut at C speed where none needs a check, the same lines and numbers as the
one-by-one way; errors, blank lines, long lines and newline-dense data (a bomb of newlines) take that way."""

import random
import tracemalloc

import pytest

from tasks.streams.ndjson import CHUNK_SIZE, LineSplitter, LineTooLongError, NdjsonError
from tasks.streams.line_check import LineChecker

LIMIT = 64
PIECES = [
    b'{"resourceType":"Patient","id":"p"}\n',
    b'{"resourceType":"Condition","code":{"text":"x"}}\n',
    b"\n",
    b"  \n",
    b"\r\n",
    b' \t{"resourceType":"Observation"}\r\n',
    b'{"resourceType":"Encounter"}\r\n',
    b"\x0b\x0c\n",
]


def one_by_one(data_chunks: list[bytes], limit: int) -> tuple[list[tuple[int, bytes]], str | None]:
    """The reference: the lines as the one-by-one way gives them (every line and byte looked at in Python, the way
    ``numbered`` takes where a line needs a check); the error's text, if any."""
    splitter, found = LineSplitter("f.ndjson", limit), []
    try:
        for chunk in data_chunks:
            found.extend(splitter._one_by_one(chunk))
        if last := splitter.finish():
            found.append((splitter.number, last))
    except NdjsonError as exc:
        return found, str(exc)
    return found, None


def by_numbered(data_chunks: list[bytes], limit: int) -> tuple[list[tuple[int, bytes]], str | None]:
    splitter, found = LineSplitter("f.ndjson", limit), []
    try:
        for chunk in data_chunks:
            found.extend(splitter.numbered(chunk))  # one at a time: those before an error are kept
        if last := splitter.finish():
            found.append((splitter.number, last))
    except NdjsonError as exc:
        return found, str(exc)
    return found, None


def cut(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` in chunks of random sizes, some large enough to hold many lines, some a few bytes."""
    chunks, start = [], 0
    while start < len(data):
        size = rng.choice([1, 3, 17, 40, 200, 2000])
        chunks.append(data[start : start + size])
        start += size
    return chunks


@pytest.mark.parametrize("seed", range(40))
def test_numbered_gives_the_one_by_one_lines_and_numbers_however_the_data_are_cut(seed):
    rng = random.Random(seed)
    data = b"".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 300)))
    if rng.random() < 0.3:  # no final newline
        data += b'{"resourceType":"Patient"}'
    if rng.random() < 0.3:  # a line over the limit somewhere
        at = rng.randrange(len(data) + 1)
        at = data.rfind(b"\n", 0, at) + 1
        data = data[:at] + b"x" * (LIMIT + rng.randrange(1, 50)) + b"\n" + data[at:]
    if rng.random() < 0.2:  # a run of blank lines over the limit
        data += b"\n" * (LIMIT + 5) + PIECES[0]
    chunks = cut(data, rng)
    expected = one_by_one(chunks, LIMIT)
    assert by_numbered(chunks, LIMIT) == expected
    assert expected[0], "every draw gives lines"


def test_a_line_that_spans_chunks_is_numbered_where_it_ends():
    splitter = LineSplitter("f.ndjson", LIMIT)
    assert list(splitter.numbered(b'{"a":1}\n{"b"')) == [(1, b'{"a":1}')]
    assert list(splitter.numbered(b':2}\n{"c":3}\n')) == [(2, b'{"b":2}'), (3, b'{"c":3}')]
    assert splitter.number == 3


def test_short_lines_packed_densely_are_all_cut():
    """More lines than one per 16 bytes: the cut stops early, and the rest must not be kept as a pending line."""
    chunk = b"x\n" * 5000 + b"y"
    assert by_numbered([chunk, b"z\n"], 1 << 20) == one_by_one([chunk, b"z\n"], 1 << 20)
    assert by_numbered([chunk], 1 << 20)[0][-2:] == [(5000, b"x"), (5001, b"y")]


def test_lines_between_two_blank_runs_part_them():
    """Each run of blank lines counts on its own against the limit, also when the lines between them were cut at
    once."""
    splitter = LineSplitter("f.ndjson", LIMIT)
    list(splitter.numbered(b"\n" * 40))
    assert list(splitter.numbered(PIECES[0] * 2)) == [(41, PIECES[0][:-1]), (42, PIECES[0][:-1])]
    assert list(splitter.numbered(b"\n" * 40 + PIECES[0])) == [(83, PIECES[0][:-1])]


def test_a_line_over_the_limit_that_never_ends_in_the_chunk_is_an_error_after_the_lines_before_it():
    splitter = LineSplitter("f.ndjson", LIMIT)
    found = []
    with pytest.raises(LineTooLongError, match="f.ndjson: line 2"):
        for pair in splitter.numbered(b'{"a":1}\n' + b"y" * (LIMIT + 1)):
            found.append(pair)
    assert found == [(1, b'{"a":1}')]


def test_a_chunk_of_newlines_is_counted_without_a_list_of_its_lines():
    """A bomb of newlines in a chunk as large as any reader makes (1 MiB): cut by ``bytes.split`` into all its
    lines it would be a list of a million entries (8 MiB); the cut stops at one line per 16 bytes on average and
    the blank-run way counts the rest."""
    splitter = LineSplitter("f.ndjson", 16 << 20)
    chunk = b"\n" * CHUNK_SIZE
    tracemalloc.start()
    try:
        assert list(splitter.numbered(chunk)) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert splitter.number == CHUNK_SIZE
    assert peak < 2 * CHUNK_SIZE


def test_the_line_checker_reports_the_first_bad_line_of_a_chunk_with_its_number():
    checker = LineChecker("f.ndjson", LIMIT)
    good = b'{"resourceType":"Patient"}\n'
    with pytest.raises(NdjsonError, match="f.ndjson: line 3 is not valid JSON"):
        checker.feed(good * 2 + b'{"resourceType":\n' + good + b"z" * (LIMIT + 1) + b"\n")
    later = LineChecker("f.ndjson", LIMIT)
    later.feed(good * 5)
    with pytest.raises(NdjsonError, match="f.ndjson: line 7 is a JSON object without a resourceType"):
        later.feed(good + b'{"id":"x"}\n' + good)
