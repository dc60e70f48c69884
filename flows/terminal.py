"""What every command shares: its command groups, its lines for the person.

Note: the person's lines are apart from the command's output.
"""

import argparse
import sys
from typing import TypeAlias

# where ``register`` adds a command, or a group its subcommands
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def command_group(commands: Commands, name: str, text: str) -> Commands:
    """Add the command ``name`` (help ``text``); give where its subcommands go."""
    return commands.add_parser(name, help=text).add_subparsers(required=True, metavar="SUBCOMMAND")


def print_stderr(text: str) -> None:
    """Print ``text`` on stderr: a note, warning or error, never among the output."""
    print(text, file=sys.stderr)
