"""A text made to attack a terminal, and the check that what reached one is plain and readable."""

from __future__ import annotations

import re

HOSTILE = "run\x1b[2J\x1b]0;owned\x07\rx\x9b31m\u202eexe.gnp\u2066\u2028y\u2029z"
"""A screen clear (ESC [2J), an OSC title ended by BEL, a carriage return, a C1 CSI (U+009B), a
bidi override and isolate, the line and paragraph separators."""
NOT_PLAIN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""Every control but the line feed (C0, DEL, C1), the bidi embeddings, overrides and isolates, the
line and paragraph separators."""


def assert_plain(output: str) -> None:
    found = NOT_PLAIN.search(output)
    assert found is None, f"U+{ord(found.group()):04X} reached the terminal: {output!r}"
    assert "owned" in output and "exe.gnp" in output, output  # the text is still there to read
