"""ConfigError, and the wording of every configuration problem.

Pydantic's errors are reworded (dotted path, cause and fix; never the input value or a link), so
no message carries a secret. The configuration's part of the exception tree::

    DupflowError
    └── ConfigError     every problem of a configuration, each naming its key and the fix
"""

import difflib
from collections.abc import Mapping

import annotated_types
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from config.fields import loc_path
from config.keys import model_at
from tasks.core.errors import DupflowError
from tasks.core.readable import counted


class ConfigError(DupflowError):
    """The configuration was rejected; ``problems``: key path, cause and fix of each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(
            f"invalid configuration ({counted(len(self.problems), 'problem')}):\n{lines}"
        )


_FIXED_TEXTS = {
    "missing": "is required; add it",
    **dict.fromkeys(
        ("int_parsing", "int_type", "int_from_float"), "must be a whole number (e.g. 5)"
    ),
    **dict.fromkeys(("bool_parsing", "bool_type"), "must be true or false"),
    "string_type": 'must be a text value; quote it in YAML (e.g. "123")',
    "list_type": "must be a list; write [a, b] in YAML or a,b in an environment variable or flag",
    **dict.fromkeys(
        ("model_type", "model_attributes_type", "dict_type"),
        "must be a block of keys (a YAML mapping)",
    ),
    "string_too_short": "must not be empty; set a value",
}
# the configuration bounds its numbers with ge and le alone (no gt or lt anywhere)
_RANGE_TYPES = {"greater_than_equal", "less_than_equal"}


def _describe(error: ErrorDetails) -> str:
    """Our wording for one pydantic error (never its input value or documentation URL).

    Note: an unknown key and a number out of range are worded from the model that holds the key.
    """
    kind, loc = error["type"], error["loc"]
    model = model_at(loc[:-1])
    fields = model.model_fields if model else {}
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), list(fields), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"unknown key; {hint}remove or rename it (valid keys here: {', '.join(fields)})"
    if kind in _RANGE_TYPES:
        info = fields.get(str(loc[-1]))
        bounds = {type(item): item for item in (info.metadata if info else [])}
        low, high = bounds.get(annotated_types.Ge), bounds.get(annotated_types.Le)
        if low and high:
            return f"must be between {low.ge} and {high.le}; set a value in that range"
        if low:
            return f"must be at least {low.ge}; raise it"
        if high:
            return f"must be at most {high.le}; lower it"
        return "is out of range; fix the value"
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}; set one of those"
    if kind == "value_error":
        return f"{error['ctx']['error']}"
    return _FIXED_TEXTS.get(kind, error["msg"])


def is_at_or_below(path: str, key: str) -> bool:
    return path == key or path.startswith((key + ".", key + "["))


def _origin_note(path: str, sources: Mapping[str, str]) -> str:
    """' (from APP_X)' when the offending value came from the environment or a flag."""
    for key, source in sources.items():
        if is_at_or_below(path, key) and source.startswith(("env ", "flag ")):
            return f" (from {source.split(' ', 1)[1]})"
    return ""


def validation_problems(
    error: ValidationError, sources: Mapping[str, str], skip: set[str]
) -> list[str]:
    """One message per problem of a failed validation, none at or below ``skip``.

    Note: ``skip`` holds keys already reported; ``sources`` (key -> where its value came from)
    adds the variable or flag that set an offending value.
    """
    problems: list[str] = []
    for item in error.errors(include_url=False, include_input=False):
        path = loc_path(item["loc"])
        if not any(is_at_or_below(path, key) for key in skip):
            problems.append(
                f"{path or '(top level)'}{_origin_note(path, sources)}: {_describe(item)}"
            )
    return problems
