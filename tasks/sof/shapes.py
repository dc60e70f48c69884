"""Names of the engine's recurring types."""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
"""A parsed JSON object: a resource, a ViewDefinition, a CRTDL, or a part of one."""
Row: TypeAlias = tuple[Any, ...]
"""A view's row: its columns' values in order."""
