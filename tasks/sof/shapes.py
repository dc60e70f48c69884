"""Names of the engine's recurring types."""

from typing import Any, TypeAlias

Row: TypeAlias = tuple[Any, ...]
"""A view's row: its columns' values in order."""
