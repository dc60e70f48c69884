"""Paths starting with a type (``Patient.id``), checked when compiled.

A path starting with a type its focus can never have is refused, naming the view and column. See
docs/development.md, "The SQL-on-FHIR engine".
"""

from typing import Any

from tasks.sof.errors import ViewDefinitionError
from tasks.sof.fhirpath import Compiled, MemberPath, holds_resources

View = Any  # a tasks.sof.view.CompiledView, and below a Select (view imports this module)
Select = Any
Focus = tuple[str | None, str]
"""The type of a select's focus (None: not known before the data) and how messages call it."""


def refuse_other_types(view: View) -> None:
    """Refuse a path whose type filter never matches its focus: ViewDefinitionError."""
    focus = (view.resource, f"each {view.resource}")
    for index, evaluate in enumerate(view.where):
        _check(evaluate, focus, f"view {view.name!r}, where[{index}]")
    _check_select(view.root, focus, view.name)


def _check_select(select: Select, focus: Focus, view: str) -> None:
    for evaluate in select.iterate:
        _check(evaluate, focus, f"view {view!r}, {select.iteration} {evaluate.expression!r}")
    if select.iteration is not None:
        repeat = select.iteration == "repeat"
        kind = None if repeat else _element_type(select.iterate[0], focus[0])
        focus = (kind, f"each {kind} of {select.iteration} {select.iterate[0].expression!r}")
    for column in select.columns:
        _check(column.evaluate, focus, f"view {view!r}, column {column.name!r}")
    for nested in select.selects + select.union:
        _check_select(nested, focus, view)


def _element_type(evaluate: Compiled, focus: str | None) -> str | None:
    """The type of the elements a ``forEach`` gives where its plan knows it, else None."""
    if focus is None or not isinstance(evaluate, MemberPath) or evaluate.function is not None:
        return None
    plan = evaluate.plan(focus)
    return None if plan is None else plan.path


def _check(evaluate: Compiled, focus: Focus, where: str) -> None:
    kind, shown = focus
    for name in evaluate.leading_types:
        if kind is not None and (name != kind or not holds_resources(kind)):
            also = f" (or with {kind}.)" if holds_resources(kind) else ""
            raise ViewDefinitionError(
                f"{where}: the path {evaluate.expression!r} starts with the type {name}, but it is "
                f"evaluated on {shown}, so it would never give a value; start it with a member of "
                f"{kind}{also}"
            )
