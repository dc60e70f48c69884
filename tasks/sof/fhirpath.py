"""FHIRPath for ViewDefinitions: compiled once, member paths without fhirpathpy.

Everything else goes to ``tasks.sof.fhirpath_interpreter``, imported for the first such expression:
a view of member paths never loads fhirpathpy. See docs/development.md, "The SQL-on-FHIR engine".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeAlias

from tasks.sof.errors import FhirPathError
from tasks.sof.fhirpath_shared import (
    MODEL,
    Collected,
    Collection,
    Env,
    Item,
    data_and_paths,
    joined,
    reference_keys,
    resource_keys,
)

if TYPE_CHECKING:
    from tasks.sof.fhirpath_interpreter import Interpreted

_CHOICES: dict[str, list[str]] = MODEL["choiceTypePaths"]
_ELSEWHERE: dict[str, str] = MODEL["pathsDefinedElsewhere"]
_TYPES: dict[str, str] = MODEL["path2Type"]
_PARENTS: dict[str, str] = MODEL["type2Parent"]

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_KEYWORD = "(?:and|or|xor|implies|div|mod|in|contains|is|as|true|false)"  # no member's name
_SEGMENT = re.compile(  # each way to write a step is a group around it: ``lastgroup`` names it
    rf"(?P<first>first\(\))|(?P<exists>exists\(\))|(?P<resourceKey>getResourceKey\(\))"
    rf"|(?P<join>join\(\s*(?:'(?P<separator>[^'\\]*)'\s*)?\))"
    rf"|(?P<referenceKey>getReferenceKey\(\s*(?P<referenceType>{_IDENTIFIER})?\s*\))"
    rf"|(?P<where>where\(\s*(?P<whereMember>{_IDENTIFIER})\s*=\s*'(?P<literal>[^'\\]*)'\s*\))"
    rf"|(?P<member>(?P<name>(?!{_KEYWORD}\b){_IDENTIFIER})(?:\.ofType\((?P<type>{_IDENTIFIER})\))?)"
)


def compile_path(expression: str) -> Compiled:
    """The expression compiled once; ``FhirPathError`` when it does not parse."""
    if not expression.strip():  # a string: view.py's _compile, its caller, refuses others
        raise FhirPathError(f"expected a FHIRPath expression, got {expression!r}")
    steps = member_steps(expression)
    return _interpreted(expression) if steps is None else MemberPath(expression, steps)


def plain(value: Any) -> Any:
    """A value as a column gives it: a float as a decimal, a system value as its text.

    Note: system values (``FP_Quantity``, a date-time) come only from the interpreter."""
    if type(value) is str:
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if (nodes := sys.modules.get("fhirpathpy.engine.nodes")) is not None and isinstance(
        value, nodes.FP_Type
    ):
        return str(value)
    return value


TypePath = str | None
"""A FHIR type path (``Patient.name``, ``HumanName``); None where it is not known."""
Operation = tuple[str, str, str | None, TypePath]
"""A plan's step: kind, JSON key, argument, and the type path of the data it reads."""
Step = tuple[str, str, str | None]
"""``("member", name, ofType)``, ``("first", "", None)``, ``("where", member, literal)``; first of
all perhaps a type filter ``("type", name, None)``; last of all perhaps a function giving computed
values: ``("exists", "", None)``, ``("join", "", separator)``, ``("resourceKey", "", None)``,
``("referenceKey", "", type)``."""
_FUNCTIONS = ("exists", "join", "resourceKey", "referenceKey")


def member_steps(expression: str) -> list[Step] | None:
    """The steps of a plain member path, else None.

    Note: members, ``member.ofType(Type)``, ``first()`` and ``where(member = 'text')``
    joined by dots, optionally ended by one of ``_FUNCTIONS``; ``$this`` is no step. A
    leading capitalised name is a type filter (``Patient.name``): ``("type", name, None)``."""
    text = expression.strip()
    if text == "$this":
        return []
    steps: list[Step] = []
    position = 0
    while True:
        if (match := _SEGMENT.match(text, position)) is None or (
            steps and steps[-1][0] in _FUNCTIONS
        ):
            return None
        if (step := _step(match, first=not steps)) is None:
            return None
        steps.append(step)
        position = match.end()
        if position == len(text):
            return steps
        if text[position] != ".":
            return None
        position += 1


def _step(match: re.Match[str], first: bool) -> Step | None:
    kind = str(match.lastgroup)
    if kind != "member":
        arguments = {
            "join": match["separator"] or "",
            "referenceKey": match["referenceType"],
            "where": match["literal"],
        }
        return (kind, match["whereMember"] or "", arguments.get(kind))
    member = match["name"]
    if first and member[0].isupper():  # a type filter (``Patient.id``)
        return None if match["type"] else ("type", member, None)
    return ("member", member, match["type"])


class MemberPath:
    """A member path as plain dict walks, planned once per focus type.

    Note: ``collect`` gives the JSON values and one type path for all. Where a child's type
    depends on the data (a choice element without ``ofType``, a resource, data whose
    ``resourceType`` says otherwise, a primitive's ``_element`` where a function counts or
    joins values) it goes the general way: items with their own type paths, or the
    interpreter for a path ending in a function."""

    def __init__(self, expression: str, steps: list[Step]):
        self.expression = expression
        self.function = steps[-1] if steps and steps[-1][0] in _FUNCTIONS else None
        self.members = steps[:-1] if self.function else steps
        self.fallback = _interpreted(expression) if self.function else None
        self.plans: dict[TypePath, Plan | None] = {}
        self.leading_types = [steps[0][1]] if steps and steps[0][0] == "type" else []
        """The type filter it starts with (``Patient`` of ``Patient.id``), as Interpreted's"""

    def plan(self, path: TypePath) -> Plan | None:
        """The plan for focus type ``path`` (made once); None where the data decides types."""
        try:
            return self.plans[path]
        except KeyError:
            plan = self.plans[path] = _plan(self.members, path, counted=self.function is not None)
            return plan

    def collect(self, data: Any, path: TypePath, env: Env) -> Collected:
        if (plan := self.plan(path)) is None:
            return self._general(data, path, env)
        found = _member_of(data, plan.key, plan.at) if plan.key else _walk(plan, data)
        if found is None:
            return self._general(data, path, env)
        return (
            (found, plan.path) if self.function is None else (_computed(self.function, found), None)
        )

    def _general(self, data: Any, path: TypePath, env: Env) -> Collected:
        if self.fallback is not None:
            return self.fallback.collect(data, path, env)
        return data_and_paths(_walk_items(self.members, Item(data, path)))


def single_keys(columns: list[Any], path: TypePath) -> tuple[str, ...] | None:
    """Each column's JSON key if every column is one single-valued member at ``path``."""
    keys = []
    for column in columns:
        evaluate = column.evaluate
        if column.collection or not isinstance(evaluate, MemberPath):
            return None
        if (plan := evaluate.plan(path)) is None or not plan.key:
            return None
        keys.append(plan.key)
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class Plan:
    """A member path for one focus type: ``(kind, key, argument, type path)`` per step."""

    operations: tuple[Operation, ...]
    path: TypePath
    counted: bool
    # of one member step to a child, no function counting its values (``_member_of`` walks it):
    # its JSON key (else "") and the type path of the data it reads
    key: str = ""
    at: TypePath = None


def _plan(steps: list[Step], path: TypePath, counted: bool) -> Plan | None:
    """The steps resolved at focus type ``path``; None where the data decides a type."""
    operations: list[Operation] = []
    for kind, name, argument in steps:
        if kind == "type":  # no step on a resource of that type; anything else: the data decides
            if path is None or name != path or not holds_resources(path):
                return None
            continue
        if kind == "first":
            operations.append(("first", "", None, path))
            continue
        if (resolved := _resolve(path, name, argument if kind == "member" else None)) is None:
            return None
        key, child_path = resolved
        if kind == "where":
            operations.append(("where", key, argument, path))
            continue
        operations.append(("member", key, None, path))
        path = child_path
    if len(operations) == 1 and operations[0][0] == "member" and not counted:
        return Plan(tuple(operations), path, counted, operations[0][1], operations[0][3])
    return Plan(tuple(operations), path, counted)


@lru_cache(maxsize=4096)
def _keys(path: TypePath, member: str, of_type: str | None) -> tuple[tuple[str, str], ...]:
    """The JSON keys ``path.member`` (or ``.ofType(T)``) may be at, with type paths.

    Note: fhirpathpy's bookkeeping; a choice element without ``ofType`` gives each choice,
    in the model's order."""
    child_path = f"{path}.{member}" if path else f".{member}"
    child_path = _ELSEWHERE.get(child_path, child_path)
    if choices := _CHOICES.get(child_path):
        wanted = choices if of_type is None else [of_type[0].upper() + of_type[1:]]
        return tuple(
            (member + c, _TYPES.get(child_path + c, child_path + c)) for c in wanted if c in choices
        )
    child_path = "Extension" if member == "extension" else child_path
    child_path = _TYPES.get(child_path, child_path)
    return () if of_type is not None and child_path != of_type else ((member, child_path),)


def _resolve(path: TypePath, member: str, of_type: str | None) -> tuple[str, TypePath] | None:
    """The JSON key and the child's type path, once per type (``""``: no child).

    Note: None when they depend on the data (a choice element without ``ofType``, a
    child that is a resource)."""
    if not (keys := _keys(path, member, of_type)):
        return "", None
    key, child_path = keys[0]
    if (of_type is None and key != member) or holds_resources(child_path):
        return None
    return key, child_path


@lru_cache(maxsize=1024)
def holds_resources(type_path: str) -> bool:
    """Whether elements of this type are resources (their ``resourceType`` decides)."""
    current: TypePath = type_path
    while current and current != "Resource":
        current = _PARENTS.get(current)
    return current == "Resource"


def _walk(plan: Plan, data: Any) -> Collection | None:
    """The plan run over ``data``; None where the data goes elsewhere (``MemberPath``)."""
    found = [data]
    counted = plan.counted
    for kind, key, argument, path in plan.operations:
        if kind == "first":
            found = found[:1]
            continue
        if not key:
            return []
        children: Collection = []
        for value in found:
            if not isinstance(value, dict):
                continue
            if value.get("resourceType", path) != path or (counted and "_" + key in value):
                return None
            child = value.get(key)
            if kind == "where":
                if child == argument or (type(child) is list and _present(child) == [argument]):
                    children.append(value)
            elif type(child) is list:
                children.extend(_present(child))
            elif child is not None:
                children.append(child)
        found = children
        if not found:
            break
    return found


def _member_of(data: Any, key: str, path: TypePath) -> Collection | None:
    """``_walk`` of a plan of one member step (most column paths: ``code``, ``system``."""
    if not isinstance(data, dict):
        return []
    if data.get("resourceType", path) != path:
        return None
    child = data.get(key)
    if type(child) is list:
        return _present(child)
    return [] if child is None else [child]


def _present(values: Collection) -> Collection:
    """The elements but nulls (where only an extension is); the list itself if none."""
    return [element for element in values if element is not None] if None in values else values


def _computed(function: Step, found: Collection) -> Collection:
    kind, _, argument = function
    if kind == "exists":
        return [bool(found)]
    if kind == "join":
        return [joined(found, argument or "")]
    if kind == "resourceKey":
        return resource_keys(found)
    return reference_keys(found, argument)


def _walk_items(steps: list[Step], focus: Item) -> list[Item]:
    items = [focus]
    for kind, name, argument in steps:
        if kind == "first":
            items = items[:1]
        elif kind == "type":  # fhirpathpy's type filter: resources of that type
            items = [
                item
                for item in items
                if isinstance(item.data, Mapping) and item.data.get("resourceType") == name
            ]
        elif kind == "where":
            items = [
                item
                for item in items
                if [child.data for child in child_items(item, name)] == [argument]
            ]
        else:
            items = [child for item in items for child in child_items(item, name, argument)]
        if not items:
            break
    return items


def child_items(item: Item, member: str, of_type: str | None = None) -> list[Item]:
    """``item.member`` (or ``.ofType(T)`` of a choice), typed as fhirpathpy does."""
    data = item.data
    if not isinstance(data, Mapping):
        return []
    path = data.get("resourceType", item.path)
    if not isinstance(path, str | None):  # data's own resourceType: a list would not hash
        path = f"{path}" if path else None
    for key, child_path in _keys(path, member, of_type):
        if (value := data.get(key)) is not None:
            if isinstance(value, list):
                return [Item(v, child_path) for v in value if v is not None]
            return [Item(value, child_path)]
    return []


def _interpreted(expression: str) -> Interpreted:
    # fhirpathpy: only for an expression that needs it
    from tasks.sof.fhirpath_interpreter import interpreted

    return interpreted(expression)


Compiled: TypeAlias = "MemberPath | Interpreted"
