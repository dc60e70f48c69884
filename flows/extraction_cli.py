"""Extraction server control from the command line (``extraction …``, ``cohort preview``). Being built."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``python -m flows.run`` parser."""
