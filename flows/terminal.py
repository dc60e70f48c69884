"""The command line's lines for the person at the terminal, apart from its output."""

import sys


def print_stderr(text: str) -> None:
    """Print ``text`` on stderr: a note, warning or error, never among the output."""
    print(text, file=sys.stderr)
