"""The engine's errors: one sub-tree under ``tasks.core.errors.DupflowError``, so a caller catches ``SofError`` for
anything the engine refuses. Each is also a ``ValueError`` (bad input, not a broken program), which the command
line's handlers rely on.
"""

from __future__ import annotations

from pathlib import Path

from tasks.core.errors import DupflowError


class SofError(DupflowError, ValueError):
    """Input the engine cannot use; the message says what and where."""


class ResourceLineError(SofError):
    """A line that is not a JSON object; the message names the file and line."""


class FhirPathError(SofError):
    """An expression that cannot be parsed or evaluated; the message names the expression."""


class ViewError(SofError):
    """A ViewDefinition that cannot be used or run; the message says why."""


class ViewDefinitionError(ViewError):
    """The ViewDefinition itself is invalid (found before any resource is read)."""


class ViewEvaluationError(ViewError):
    """Running a valid ViewDefinition over a resource failed (e.g. several values for a non-collection column)."""


class LookupFileError(SofError):
    """A lookup file that cannot be used; ``problems`` lists every problem found."""

    def __init__(self, path: Path | str, problems: list[str]):
        self.problems = problems
        super().__init__(f"lookup file {path}: " + "; ".join(problems))


class CrtdlError(SofError):
    """A CRTDL whose attribute groups cannot be read (no dataExtraction, a group without groupReference)."""
