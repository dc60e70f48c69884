"""The engine's errors, its sub-tree of ``tasks.core.errors.DupflowError``::

    SofError                        input the engine cannot use (a CRTDL's groups, a lookup file)
    ├── ResourceLineError           a line that is no JSON object; names the file and line
    ├── FhirPathError               an expression that cannot be parsed or evaluated
    └── ViewError                   a ViewDefinition that cannot be used or run
        ├── ViewDefinitionError     the ViewDefinition itself, found before any resource is read
        └── ViewEvaluationError     running a valid one over a resource failed

Each is a ``ValueError`` too (bad input, not a broken program): the command line's handlers rely on
it.
"""

from tasks.core.errors import DupflowError


class SofError(DupflowError, ValueError):
    """Input the engine cannot use; the message says what and where."""


class ResourceLineError(SofError):
    """A line that is not a JSON object; the message names the file and line."""


class FhirPathError(SofError):
    """An expression that cannot be parsed or evaluated; the message names it."""


class ViewError(SofError):
    """A ViewDefinition that cannot be used or run; the message says why."""


class ViewDefinitionError(ViewError):
    """The ViewDefinition itself is invalid (found before any resource is read)."""


class ViewEvaluationError(ViewError):
    """Running a valid ViewDefinition over a resource failed (two values for a column)."""
