"""What the machine was doing while a benchmark ran, printed beside its figures."""

from __future__ import annotations

import os


def load() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` shows them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())
