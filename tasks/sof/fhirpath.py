"""FHIRPath for ViewDefinitions: each expression compiled once, plain member paths without the interpreter.

``compile_path`` turns an expression into a callable ``(focus, env) -> list[Item]``. A focus is an ``Item``: the
element's data plus its FHIR type path (``Patient.name``, ``HumanName``, …) so that expressions evaluated later on
it still resolve choice types (``value.ofType(Quantity)``) the way fhirpathpy does with its R4 model.

Two ways to evaluate:

- **Member paths** such as ``code.coding``, ``name.first().given``, ``value.ofType(Quantity).value`` or ``$this``
  are walked directly over the JSON (dict lookups and the model's type tables, the same rules fhirpathpy's member
  navigation applies). They are most paths in real views and cost a few microseconds instead of tens.
- Everything else goes through fhirpathpy's parser and evaluator, once parsed. The functions SQL-on-FHIR adds to
  FHIRPath (``getResourceKey``, ``getReferenceKey``, ``lowBoundary``, ``highBoundary``) are registered through
  fhirpathpy's invocation table (its extension point for user functions).

Bounds, each a ``FhirPathError`` naming the expression (data or a lookup file must not hang or exhaust a step):

- ``matches`` and ``replaceMatches`` run on RE2 (``google-re2``), in time linear in the text, where Python's ``re``
  backtracks exponentially (``matches('^(a+)+$')`` on 35 characters: hours). RE2 has no backreferences or
  lookaround; such a pattern is an error that says so.
- ``repeat()`` stops at ``MAX_REPEAT_ELEMENTS`` elements (fhirpathpy's copies its list per element: quadratic).
- An expression nested more than ``MAX_EXPRESSION_DEPTH`` levels (its parse tree; about half as many parentheses)
  is refused when compiled: the parser and the evaluator recurse once or more per level and would exhaust
  Python's stack. A stack that still runs out while evaluating (deeply nested data compared whole) is reported
  as such, never as a bare ``RecursionError``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import re2
from fhirpathpy.engine import do_eval
from fhirpathpy.engine.invocations.constants import constants as fhirpath_constants
from fhirpathpy.engine.nodes import FP_Quantity, FP_Type, ResourceNode
from fhirpathpy.engine.util import arraify
from fhirpathpy.models import models
from antlr4 import CommonTokenStream, InputStream, Token
from antlr4.error.ErrorListener import ErrorListener
from antlr4.tree.Tree import ParseTreeWalker
from fhirpathpy.parser.ASTPathListener import ASTPathListener
from fhirpathpy.parser.generated.FHIRPathLexer import FHIRPathLexer
from fhirpathpy.parser.generated.FHIRPathParser import FHIRPathParser

from tasks.sof.boundary import high_boundary, low_boundary
from tasks.sof.errors import FhirPathError

MODEL = models["r4"]
_CHOICES: dict[str, list[str]] = MODEL["choiceTypePaths"]
_ELSEWHERE: dict[str, str] = MODEL["pathsDefinedElsewhere"]
_TYPES: dict[str, str] = MODEL["path2Type"]
_PARENTS: dict[str, str] = MODEL["type2Parent"]

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_SEGMENT = re.compile(
    rf"(?P<first>first\(\))|(?P<exists>exists\(\))|(?P<resourceKey>getResourceKey\(\))"
    rf"|(?P<join>join)\(\s*(?:'(?P<separator>[^'\\]*)'\s*)?\)"
    rf"|(?P<referenceKey>getReferenceKey)\(\s*(?P<referenceType>{_IDENTIFIER})?\s*\)"
    rf"|where\(\s*(?P<where>{_IDENTIFIER})\s*=\s*'(?P<literal>[^'\\]*)'\s*\)"
    rf"|(?P<member>{_IDENTIFIER})(?:\.ofType\((?P<type>{_IDENTIFIER})\))?"
)
_KEYWORDS = {"and", "or", "xor", "implies", "div", "mod", "in", "contains", "is", "as", "true", "false"}
MAX_EXPRESSION_DEPTH = 100
MAX_REPEAT_ELEMENTS = 10_000
SHOWN_EXPRESSION_CHARS = 120


@dataclass(frozen=True, slots=True)
class Item:
    """One element of a collection: its JSON data and its FHIR type path (None for computed values)."""

    data: Any
    path: str | None = None


Env = Mapping[str, Any]


def compile_path(expression: str) -> Compiled:
    """The expression as a callable over one focus item; raises ``FhirPathError`` when it does not parse."""
    if not isinstance(expression, str) or not expression.strip():
        raise FhirPathError(f"expected a FHIRPath expression, got {expression!r}")
    steps = member_steps(expression)
    if steps is not None:
        return MemberPath(expression, steps)
    return _interpreted(expression)


def values(items: list[Item]) -> list[Any]:
    """The plain values of a result (FHIRPath system types as their text)."""
    return [plain(item.data) for item in items]


def plain(value: Any) -> Any:
    if type(value) is str:
        return value
    if isinstance(value, FP_Quantity):
        return str(value)
    if isinstance(value, FP_Type):
        return str(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    return value


# --- member paths, walked directly ------------------------------------------------------------------------------


Step = tuple[str, str, str | None]
"""``("member", name, ofType)``, ``("first", "", None)``, ``("where", member, literal)``, or last of all a
function giving computed values: ``("exists", "", None)``, ``("join", "", separator)``, ``("resourceKey", "", None)``,
``("referenceKey", "", type)``."""
_FUNCTIONS = ("exists", "join", "resourceKey", "referenceKey")


def member_steps(expression: str) -> list[Step] | None:
    """The steps of a plain member path, else None (the interpreter evaluates it).

    Plain: members (``code.coding``), ``member.ofType(Type)``, ``first()`` and ``where(member = 'text')`` joined
    by dots, optionally ended by ``exists()``, ``join('separator')``, ``getResourceKey()`` or
    ``getReferenceKey(Type)``; ``$this`` alone is no step at all. A leading capitalised name (a type filter such as
    ``Patient.name``), operators, other literals, indexes and other functions are left to the interpreter.
    """
    text = expression.strip()
    if text == "$this":
        return []
    steps: list[Step] = []
    position = 0
    while True:
        match = _SEGMENT.match(text, position)
        if match is None or (steps and steps[-1][0] in _FUNCTIONS):
            return None
        step = _step(match, first=not steps)
        if step is None:
            return None
        steps.append(step)
        position = match.end()
        if position == len(text):
            return steps
        if text[position] != ".":
            return None
        position += 1


def _step(match: re.Match, first: bool) -> Step | None:
    for kind in ("first", "exists", "resourceKey"):
        if match[kind]:
            return (kind, "", None)
    if match["join"]:
        return ("join", "", match["separator"] or "")
    if match["referenceKey"]:
        return ("referenceKey", "", match["referenceType"])
    if match["where"]:
        return ("where", match["where"], match["literal"])
    member = match["member"]
    if member in _KEYWORDS or (first and member[0].isupper()):
        return None
    return ("member", member, match["type"])


class MemberPath:
    """A member path compiled to plain dict walks, planned once per focus type (``_plan``).

    ``collect(data, type_path, env)`` gives ``(values, type path)``: the values are the JSON data themselves, no
    wrapper per element, and their type path is one for all. Where the type of a child depends on the data (a choice
    element without ``ofType``, an element holding a resource, data whose ``resourceType`` says otherwise, a
    primitive's ``_element`` where a function counts or joins values) the path goes the general way: elements with
    their own type paths, or the interpreter for paths ending in a function.
    """

    def __init__(self, expression: str, steps: list[Step]):
        self.steps = steps
        self.function = steps[-1] if steps and steps[-1][0] in _FUNCTIONS else None
        self.members = steps[:-1] if self.function else steps
        self.fallback = _interpreted(expression) if self.function else None
        self.plans: dict[str | None, Plan | None] = {}

    def __call__(self, focus: Item, env: Env) -> list[Item]:
        found, paths = self.collect(focus.data, focus.path, env)
        return items_of(found, paths)

    def plan(self, path: str | None) -> Plan | None:
        """The path's plan for focus type ``path`` (made once per type), None where the data decides the types."""
        try:
            return self.plans[path]
        except KeyError:
            plan = self.plans[path] = _plan(self.members, path, counted=self.function is not None)
            return plan

    def collect(self, data: Any, path: str | None, env: Env) -> tuple[list, Paths]:
        plan = self.plan(path)
        if plan is None:
            return self._general(data, path, env)
        found = _member_of(data, plan.key, plan.at) if plan.single else _walk(plan, data)
        if found is None:
            return self._general(data, path, env)
        if self.function is None:
            return found, plan.path
        return _computed(self.function, found), None

    def _general(self, data: Any, path: str | None, env: Env) -> tuple[list, Paths]:
        if self.fallback is not None:
            return self.fallback.collect(data, path, env)
        items = _walk_items(self.members, Item(data, path))
        return [item.data for item in items], [item.path for item in items]


Paths = str | None | list
"""The type paths of collected values: one for all of them, or a list with one per value."""


def items_of(found: list, paths: Paths) -> list[Item]:
    if isinstance(paths, list):
        return [Item(value, path) for value, path in zip(found, paths, strict=True)]
    return [Item(value, paths) for value in found]


@dataclass(frozen=True, slots=True)
class Plan:
    """A member path for one focus type: each step as ``(kind, key, argument, type path of the data it reads)``."""

    operations: tuple[tuple[str, str, str | None, str | None], ...]
    path: str | None
    counted: bool
    single: bool  # one member step, no function counting its values: ``_member_of`` walks it
    key: str = ""  # a single step's JSON key and the type path of the data it reads
    at: str | None = None


def _plan(steps: list[Step], path: str | None, counted: bool) -> Plan | None:
    """The steps resolved against the focus type ``path``, or None where a child's type depends on the data."""
    operations = []
    for kind, name, argument in steps:
        if kind == "first":
            operations.append(("first", "", None, path))
            continue
        resolved = _resolve(path, name, argument if kind == "member" else None)
        if resolved is None:
            return None
        key, child_path = resolved
        if kind == "where":
            operations.append(("where", key, argument, path))
            continue
        operations.append(("member", key, None, path))
        path = child_path
    if len(operations) == 1 and operations[0][0] == "member" and not counted:
        return Plan(tuple(operations), path, counted, True, operations[0][1], operations[0][3])
    return Plan(tuple(operations), path, counted, False)


@lru_cache(maxsize=4096)
def _resolve(path: str | None, member: str, of_type: str | None) -> tuple[str, str | None] | None:
    """``child_items``' bookkeeping once per type: the JSON key and the child's type path (key ``""``: never any
    child), or None when they depend on the data."""
    child_path = f"{path}.{member}" if path else f".{member}"
    child_path = _ELSEWHERE.get(child_path, child_path)
    choices = _CHOICES.get(child_path)
    key = member
    if choices:
        if of_type is None:
            return None
        wanted = of_type[0].upper() + of_type[1:]
        if wanted not in choices:
            return "", None
        key, child_path = member + wanted, child_path + wanted
    elif member == "extension":
        child_path = "Extension"
    child_path = _TYPES.get(child_path, child_path)
    if of_type is not None and not choices and child_path != of_type:
        return "", None
    if _holds_resources(child_path):
        return None
    return key, child_path


@lru_cache(maxsize=1024)
def _holds_resources(type_path: str) -> bool:
    """Whether elements of this type are resources (their own ``resourceType`` then decides their type)."""
    seen = set()
    while type_path and type_path not in seen:
        if type_path == "Resource":
            return True
        seen.add(type_path)
        type_path = _PARENTS.get(type_path)
    return False


def _walk(plan: Plan, data: Any) -> list | None:
    """The plan run over ``data``; None when the data takes it elsewhere (see ``MemberPath``)."""
    found = [data]
    counted = plan.counted
    for kind, key, argument, path in plan.operations:
        if kind == "first":
            found = found[:1]
            continue
        if not key:
            return []
        children: list = []
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


def _member_of(data: Any, key: str, path: str | None) -> list | None:
    """``_walk`` of a plan that is one member step (most column paths: ``system``, ``code``)."""
    if not isinstance(data, dict) or not key:
        return []
    if data.get("resourceType", path) != path:
        return None
    child = data.get(key)
    if type(child) is list:
        return _present(child)
    return [] if child is None else [child]


def _present(values: list) -> list:
    """The elements but nulls (arrays of primitives hold nulls where only an extension is): the list itself when it
    has none (no caller changes it)."""
    return [element for element in values if element is not None] if None in values else values


def _computed(function: Step, found: list) -> list:
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
        elif kind == "where":
            items = [item for item in items if _values_of(item, name) == [argument]]
        else:
            found: list[Item] = []
            for item in items:
                found.extend(child_items(item, name, argument))
            items = found
        if not items:
            break
    return items


def _values_of(item: Item, member: str) -> list[Any]:
    return [child.data for child in child_items(item, member)]


def child_items(item: Item, member: str, of_type: str | None = None) -> list[Item]:
    """``item.member`` (or ``item.member.ofType(T)`` on a choice element), with fhirpathpy's type bookkeeping."""
    data = item.data
    if not isinstance(data, Mapping):
        return []
    path = data.get("resourceType") if "resourceType" in data else item.path
    child_path = f"{path}.{member}" if path else f".{member}"
    child_path = _ELSEWHERE.get(child_path, child_path)
    choices = _CHOICES.get(child_path)
    if choices:
        value = None
        wanted = [of_type[0].upper() + of_type[1:]] if of_type else choices
        for choice in wanted:
            if choice in choices and (value := data.get(member + choice)) is not None:
                child_path += choice
                break
    else:
        value = data.get(member)
        if member == "extension":
            child_path = "Extension"
    if value is None:
        return []
    child_path = _TYPES.get(child_path, child_path)
    if of_type is not None and not choices and child_path != of_type:
        return []
    if isinstance(value, list):
        return [Item(v, child_path) for v in value if v is not None]
    return [Item(value, child_path)]


# --- everything else: fhirpathpy --------------------------------------------------------------------------------


class _RaisingErrorListener(ErrorListener):
    def syntaxError(self, recognizer, offendingSymbol, line, column, msg, e):  # noqa: N802, N803 - ANTLR's names
        raise FhirPathError(f"column {column + 1}: {msg}")


def parse(expression: str) -> dict[str, Any]:
    """fhirpathpy's parse tree of ``expression``, strictly: fhirpathpy's own ``parse`` recovers from syntax errors
    silently (``status.where(`` parses), so its lexer and parser run here with a listener that raises."""
    listener = _RaisingErrorListener()
    lexer = FHIRPathLexer(InputStream(expression))
    lexer.removeErrorListeners()
    lexer.addErrorListener(listener)
    tokens = CommonTokenStream(lexer)
    parser = FHIRPathParser(tokens)
    parser.buildParseTrees = True
    parser.removeErrorListeners()
    parser.addErrorListener(listener)
    try:
        tree = parser.expression()
    except RecursionError:
        raise FhirPathError(_too_deep()) from None
    if tokens.LA(1) != Token.EOF:
        raise FhirPathError(f"unexpected {tokens.LT(1).text!r} at column {tokens.LT(1).column + 1}")
    ast = ASTPathListener()
    try:
        ParseTreeWalker().walk(ast, tree)
    except RecursionError:
        raise FhirPathError(_too_deep()) from None
    parsed = ast.parentStack[0]
    if tree_depth(parsed) > MAX_EXPRESSION_DEPTH:
        raise FhirPathError(_too_deep())
    return parsed


def tree_depth(node: dict[str, Any]) -> int:
    """Levels of a parse tree (walked with a list, not recursion)."""
    deepest, pending = 0, [(node, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in node.get("children") or ())
    return deepest


def _too_deep() -> str:
    return f"nested more than {MAX_EXPRESSION_DEPTH} levels deep (split it, or drop redundant parentheses)"


def shown(expression: str) -> str:
    """The expression as error messages quote it (a long one cut short)."""
    if len(expression) <= SHOWN_EXPRESSION_CHARS:
        return repr(expression)
    return repr(expression[:SHOWN_EXPRESSION_CHARS]) + f"... ({len(expression)} characters)"


def _interpreted(expression: str) -> Interpreted:
    try:
        parsed = parse(expression)
    except Exception as exc:  # FhirPathError from the listener, bare exceptions from fhirpathpy's AST builder
        raise FhirPathError(f"cannot parse FHIRPath {shown(expression)}: {exc}") from exc
    return Interpreted(expression, parsed["children"][0])


@dataclass(frozen=True)
class Interpreted:
    """An expression fhirpathpy evaluates (parsed once); ``collect`` as ``MemberPath``'s."""

    expression: str
    root: dict[str, Any]

    def __call__(self, focus: Item, env: Env) -> list[Item]:
        node = ResourceNode.create_node(focus.data, focus.path)
        data_root = arraify(node)
        ctx = {
            "dataRoot": data_root,
            "$this": data_root,
            "vars": {"context": node, "ucum": "http://unitsofmeasure.org", **env},
            "model": MODEL,
            "userInvocationTable": SOF_FUNCTIONS,
        }
        fhirpath_constants.reset()
        try:
            result = do_eval(ctx, data_root, self.root)
        except FhirPathError as exc:
            raise FhirPathError(f"FHIRPath {shown(self.expression)}: {exc}") from exc
        except RecursionError:
            raise FhirPathError(
                f"FHIRPath {shown(self.expression)} ran out of Python's stack: the expression, or the data it "
                "compares, is nested too deeply"
            ) from None
        except Exception as exc:
            raise FhirPathError(f"FHIRPath {shown(self.expression)} failed: {exc}") from exc
        return [_as_item(value) for value in arraify(result) if not _is_primitive_extension_only(value)]

    def collect(self, data: Any, path: str | None, env: Env) -> tuple[list, Paths]:
        items = self(Item(data, path), env)
        return [item.data for item in items], [item.path for item in items]


Compiled = MemberPath | Interpreted


def _as_item(value: Any) -> Item:
    if isinstance(value, ResourceNode):
        return Item(value.data, value.path)
    return Item(value)


def _is_primitive_extension_only(value: Any) -> bool:
    """fhirpathpy yields ``_element`` siblings (extensions of primitives) as their own nodes; they are no values."""
    return isinstance(value, ResourceNode) and isinstance(value.data, Mapping) and list(value.data) == ["extension"]


# --- SQL-on-FHIR's FHIRPath functions ---------------------------------------------------------------------------


def get_resource_key(ctx: dict, inputs: list) -> list[str]:
    """``Type/id`` of each resource in the input (the key ``getReferenceKey`` gives for a reference to it)."""
    return resource_keys([_data(node) for node in inputs])


def resource_keys(found: list) -> list[str]:
    return [
        f"{data['resourceType']}/{data['id']}"
        for data in found
        if isinstance(data, Mapping) and "resourceType" in data and "id" in data
    ]


def get_reference_key(ctx: dict, inputs: list, type_info: Any = None) -> list[str]:
    """``Type/id`` of each Reference (history and base URL dropped); only those of the given type, if any."""
    return reference_keys([_data(node) for node in inputs], getattr(type_info, "name", None))


def reference_keys(found: list, wanted: str | None) -> list[str]:
    keys = []
    for data in found:
        reference = data.get("reference") if isinstance(data, Mapping) else None
        if not isinstance(reference, str):
            continue
        parts = reference.split("/_history")[0].split("/")
        if len(parts) < 2:
            continue
        if wanted is None or parts[-2] == wanted:
            keys.append(f"{parts[-2]}/{parts[-1]}")
    return keys


def join(ctx: dict, inputs: list, separator: Any = "") -> Any:
    """FHIRPath's ``join``: the input strings joined, ``''`` for an empty input (as the SQL-on-FHIR suite expects;
    fhirpathpy's gives no value), no value for an empty separator collection."""
    if isinstance(separator, list):
        return []
    return joined([_data(node) for node in inputs], separator)


def joined(found: list, separator: str) -> str:
    if not all(isinstance(value, str) for value in found):
        raise FhirPathError(f"join needs a collection of strings, got {found!r:.200}")
    return separator.join(found)


def _data(node: Any) -> Any:
    return node.data if isinstance(node, ResourceNode) else node


def _boundary(compute: Callable[[Any, str | None, int | None], Any]) -> Callable[..., list]:
    def invoke(ctx: dict, inputs: list, precision: Any = None) -> list:
        digits = None if precision in (None, []) else int(precision)
        results = []
        for node in inputs:
            type_path = node.path if isinstance(node, ResourceNode) else None
            result = compute(_data(node), type_path, digits)
            if result is not None:
                results.append(result)
        return results

    return invoke


# --- bounded replacements of fhirpathpy functions -----------------------------------------------------------------


@lru_cache(maxsize=256)
def regex(pattern: str, dot_matches_newline: bool) -> Any:
    """``pattern`` compiled by RE2 (once per process); a pattern RE2 cannot run is a ``FhirPathError``."""
    options = re2.Options()
    options.dot_nl = dot_matches_newline
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise FhirPathError(
            f"regular expression {pattern!r} is not supported ({_text(exc)}): regexes run on RE2, which has no "
            "backreferences or lookaround (they can take exponential time)"
        ) from None


def _text(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else exc
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def matches(ctx: dict, inputs: list, pattern: Any) -> Any:
    """fhirpathpy's ``matches`` (search, ``.`` matching newlines), on RE2; empty input or regex give no value."""
    if not inputs or isinstance(pattern, list):
        return []
    return regex(pattern, True).search(_single_string(inputs)) is not None


def replace_matches(ctx: dict, inputs: list, pattern: Any, replacement: Any) -> Any:
    """fhirpathpy's ``replaceMatches`` (``$1`` for the first group), on RE2; empty input, regex or substitution
    give no value."""
    if not inputs or isinstance(pattern, list) or isinstance(replacement, list):
        return []
    text = _single_string(inputs)
    return regex(pattern, False).sub(re.sub(r"\$(\d+)", r"\\\1", replacement), text)


def _single_string(inputs: list) -> str:
    if len(inputs) == 1:
        data = _data(inputs[0])
        if isinstance(data, str):
            return data
    raise FhirPathError(f"expected one string, got {inputs!r:.200}")


def repeat(ctx: dict, inputs: Any, expression: Callable[[Any], list]) -> list:
    """fhirpathpy's ``repeat`` (breadth first, each element once), in linear time and bounded."""
    if not isinstance(inputs, list):
        return []
    found: list = []
    seen: set = set()
    pending = deque(inputs)
    while pending:
        fresh = [element for element in expression(pending.popleft()) if element not in seen]
        seen.update(fresh)
        found.extend(fresh)
        pending.extend(fresh)
        if len(found) > MAX_REPEAT_ELEMENTS:
            raise FhirPathError(f"repeat() reaches more than {MAX_REPEAT_ELEMENTS:,} elements")
    return found


SOF_FUNCTIONS: dict[str, dict[str, Any]] = {
    "getResourceKey": {"fn": get_resource_key, "arity": {0: []}},
    "getReferenceKey": {"fn": get_reference_key, "arity": {0: [], 1: ["TypeSpecifier"]}},
    "lowBoundary": {"fn": _boundary(low_boundary), "arity": {0: [], 1: ["Integer"]}},
    "highBoundary": {"fn": _boundary(high_boundary), "arity": {0: [], 1: ["Integer"]}},
    "matches": {"fn": matches, "arity": {1: ["String"]}, "nullable_input": True},
    "replaceMatches": {"fn": replace_matches, "arity": {2: ["String", "String"]}, "nullable_input": True},
    "repeat": {"fn": repeat, "arity": {1: ["Expr"]}},
    "join": {"fn": join, "arity": {0: [], 1: ["String"]}},
}
