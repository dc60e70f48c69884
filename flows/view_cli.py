"""``view run``: run one SQL-on-FHIR ViewDefinition over NDJSON resources with the embedded engine. Being built."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``python -m flows.run`` parser."""
