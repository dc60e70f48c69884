# mypy: disallow-untyped-calls=False
# (this module calls into fhirpathpy, whose functions carry no annotations)
"""FHIRPath expressions that are no member paths, run by fhirpathpy, bounded.

Imported only where a view has one; its functions and their bounds (each a ``FhirPathError``) are in
docs/development.md, "The SQL-on-FHIR engine".
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2
from antlr4 import CommonTokenStream, InputStream, Token
from antlr4.error.ErrorListener import ErrorListener
from antlr4.tree.Tree import ParseTreeWalker
from fhirpathpy.engine import do_eval
from fhirpathpy.engine.invocations import math, strings
from fhirpathpy.engine.invocations.constants import constants as fhirpath_constants
from fhirpathpy.engine.nodes import ResourceNode
from fhirpathpy.engine.util import arraify
from fhirpathpy.parser.ASTPathListener import ASTPathListener
from fhirpathpy.parser.generated.FHIRPathLexer import FHIRPathLexer
from fhirpathpy.parser.generated.FHIRPathParser import FHIRPathParser

from tasks.core.json_shapes import JsonObject
from tasks.sof.boundary import boundary
from tasks.sof.errors import FhirPathError
from tasks.sof.fhirpath_shared import (
    MAX_COMPUTED_SIZE,
    MAX_EXPRESSION_DEPTH,
    MAX_REPEAT_ELEMENTS,
    MODEL,
    TOO_DEEP,
    Collected,
    Collection,
    Env,
    Item,
    data_and_paths,
    joined,
    reference_keys,
    refuse_larger,
    resource_keys,
    shown,
)

Ctx = dict[str, Any]
"""fhirpathpy's evaluation context (its data, variables, model and functions)."""


class _RaisingErrorListener(ErrorListener):  # type: ignore[misc]  # antlr4 ships no types
    def syntaxError(self, *args: Any) -> None:  # noqa: N802 - ANTLR's name
        """ANTLR's (recognizer, offendingSymbol, line, column, msg, e): column and message."""
        column, msg = args[3:5]
        raise FhirPathError(f"column {column + 1}: {msg}")


class _DepthListener(ASTPathListener):
    """fhirpathpy's parse tree builder, noting the most levels it reached."""

    levels = 0

    def pushNode(self, *args: Any) -> None:  # noqa: N802 - fhirpathpy's name
        super().pushNode(*args)
        self.levels = max(self.levels, len(self.parentStack))


def parse(expression: str) -> JsonObject:
    """fhirpathpy's parse tree, strictly.

    Why: its own ``parse`` silently recovers from syntax errors (``status.where(``)."""
    listener = _RaisingErrorListener()
    lexer = FHIRPathLexer(InputStream(expression))
    lexer.removeErrorListeners()
    lexer.addErrorListener(listener)
    tokens = CommonTokenStream(lexer)
    parser = FHIRPathParser(tokens)
    parser.removeErrorListeners()
    parser.addErrorListener(listener)
    ast = _DepthListener()
    try:
        tree = parser.expression()
        if tokens.LA(1) != Token.EOF:
            raise FhirPathError(
                f"unexpected {tokens.LT(1).text!r} at column {tokens.LT(1).column + 1}"
            )
        ParseTreeWalker().walk(ast, tree)
    except RecursionError:
        raise FhirPathError(TOO_DEEP) from None
    if ast.levels > MAX_EXPRESSION_DEPTH:
        raise FhirPathError(TOO_DEEP)
    return ast.parentStack[0]


def interpreted(expression: str) -> Interpreted:
    """``expression`` parsed once for fhirpathpy; else a ``FhirPathError``."""
    try:
        parsed = parse(expression)
    # FhirPathError from the listener, bare exceptions from fhirpathpy's AST builder
    except Exception as exc:
        raise FhirPathError(f"cannot parse FHIRPath {shown(expression)}: {exc}") from exc
    root = parsed["children"][0]
    filters = type_filters(root)
    leading = [name for name, argument in filters if not argument]
    return Interpreted(expression, root, leading, bool(filters))


def type_filters(node: JsonObject) -> list[tuple[str, bool]]:
    """The type filters that start its paths (``Patient`` of ``Patient.id``).

    Note: left to right, each with whether it is in a function's arguments (whose focus
    may be another)."""
    found, pending = [], [(node, False)]
    while pending:
        node, argument = pending.pop()
        kind, children = node.get("type"), node.get("children") or []
        if kind == "MemberInvocation":  # it starts a path: a chain's later members are not walked
            if (name := children[0]["text"].replace("`", ""))[:1].isupper():
                found.append((name, argument))
            continue
        if kind == "InvocationExpression" and children[1].get("type") != "FunctionInvocation":
            children = children[:1]
        argument = argument or kind == "FunctionInvocation"
        pending += [(child, argument) for child in reversed(children)]
    return found


@dataclass(frozen=True)
class Interpreted:
    """An expression fhirpathpy evaluates (parsed once); ``collect`` as MemberPath's."""

    expression: str
    root: JsonObject
    leading_types: list[str]
    """The type filters starting its paths at its focus (not in a function's arguments)"""
    typed: bool
    """Whether it has a type filter: a resource at its focus is then a ``_Resource``"""

    def collect(self, data: Any, path: str | None, env: Env) -> Collected:
        resource = self.typed and isinstance(data, Mapping) and "resourceType" in data
        node = (_Resource if resource else ResourceNode.create_node)(data, path)
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
                f"FHIRPath {shown(self.expression)} ran out of Python's stack: the expression, or "
                "the data it compares, is nested too deeply"
            ) from None
        except Exception as exc:
            raise FhirPathError(f"FHIRPath {shown(self.expression)} failed: {exc}") from exc
        return data_and_paths(
            [
                Item(value.data, value.path) if isinstance(value, ResourceNode) else Item(value)
                for value in arraify(result)
                if not _is_primitive_extension_only(value)
            ]
        )


class _Resource(ResourceNode):
    """A resource at the focus, which fhirpathpy's type filter reads.

    Why: the filter (``Patient.id``) reads ``resourceType`` by subscript, as of the JSON its
    own ``evaluate`` is given; of a plain node it read nothing, and the path gave no value."""

    def __getitem__(self, key: Any) -> Any:
        if key != "resourceType":  # nothing else: iterating a node fails as it does on any node
            raise TypeError("a resource node is subscripted for its resourceType alone")
        return self.data[key]


def _is_primitive_extension_only(value: Any) -> bool:
    """Whether ``value`` is an ``_element`` sibling (a primitive's extensions): none."""
    return (
        isinstance(value, ResourceNode)
        and isinstance(value.data, Mapping)
        and list(value.data) == ["extension"]
    )


def get_resource_key(ctx: Ctx, inputs: Collection) -> list[str]:
    return resource_keys([_data(node) for node in inputs])


def get_reference_key(ctx: Ctx, inputs: Collection, type_info: Any = None) -> list[str]:
    return reference_keys([_data(node) for node in inputs], getattr(type_info, "name", None))


def join(ctx: Ctx, inputs: Collection, separator: Any = "") -> Any:
    """FHIRPath's ``join``; no value for an empty separator collection.

    Note: ``''`` for an empty input, as the SQL-on-FHIR suite expects (fhirpathpy's: none)."""
    return (
        [] if isinstance(separator, list) else joined([_data(node) for node in inputs], separator)
    )


def amp(ctx: Ctx, left: Any, right: Any) -> str:
    """FHIRPath's ``&`` (an empty operand counts as ``''``), bounded before it is made."""
    left, right = ("" if isinstance(side, list) and not side else side for side in (left, right))
    refuse_larger("&", len(left) + len(right))
    return math.amp(ctx, left, right)  # type: ignore[no-any-return]  # fhirpathpy is unannotated


def plus(ctx: Ctx, left: Collection, right: Collection) -> Any:
    """FHIRPath's ``+``, its result checked (strings join as with ``&``)."""
    return _bounded("+", math.plus(ctx, left, right))


def _data(node: Any) -> Any:
    return node.data if isinstance(node, ResourceNode) else node


def _boundary(high: bool) -> Callable[..., Collection]:
    def invoke(ctx: Ctx, inputs: Collection, precision: Any = None) -> Collection:
        digits = None if precision in (None, []) else int(precision)
        found = [
            boundary(
                _data(node),
                node.path if isinstance(node, ResourceNode) else None,
                digits,
                high=high,
            )
            for node in inputs
        ]
        return [result for result in found if result is not None]

    return invoke


@lru_cache(maxsize=256)
def regex(pattern: str, dot_matches_newline: bool) -> Any:
    """``pattern`` compiled by RE2, once per process; ``FhirPathError`` if RE2 cannot."""
    options = re2.Options()
    options.dot_nl = dot_matches_newline
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    # its compiler's reason, as bytes (its one other error, a str pattern with LATIN1, is not set)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace")
        raise FhirPathError(
            f"regular expression {pattern!r} is not supported ({reason}): regexes run on RE2, "
            "which has no backreferences or lookaround (they can take exponential time)"
        ) from None


def matches(ctx: Ctx, inputs: Collection, pattern: Any) -> Any:
    """fhirpathpy's ``matches`` (search, ``.`` matching newlines), on RE2."""
    if isinstance(pattern, list):
        return []
    return regex(pattern, True).search(_single_string(inputs)) is not None


def replace_matches(ctx: Ctx, inputs: Collection, pattern: Any, replacement: Any) -> Any:
    """fhirpathpy's ``replaceMatches`` (``$1`` for the first group), on RE2."""
    if isinstance(pattern, list) or isinstance(replacement, list):
        return []
    text, compiled = _single_string(inputs), regex(pattern, False)
    size = len(text)
    # counted only as far as the bound: every match adds a replacement
    for _ in compiled.finditer(text):
        if (size := size + len(replacement)) > MAX_COMPUTED_SIZE:
            break
    refuse_larger("replaceMatches()", size)
    return _bounded(
        "replaceMatches()", compiled.sub(re.sub(r"\$(\d+)", r"\\\1", replacement), text)
    )


def replace(ctx: Ctx, inputs: Collection, pattern: Any, substitution: Any) -> Any:
    """fhirpathpy's ``replace``, refused before it builds a string over the bound."""
    if isinstance(pattern, str) and isinstance(substitution, str):
        text = _single_string(inputs)
        count = len(text) + 1 if pattern == "" else text.count(pattern)
        refuse_larger("replace()", len(text) + count * (len(substitution) - len(pattern)))
    return strings.replace(ctx, inputs, pattern, substitution)


def aggregate(
    ctx: Ctx, inputs: Collection, expression: Callable[[Any], Any], initial: Any = None
) -> Any:
    """fhirpathpy's ``aggregate``, its ``$total`` checked after each element."""
    ctx["$total"] = initial
    for index, element in enumerate(inputs):
        ctx["$index"] = index
        ctx["$total"] = _bounded("aggregate()", expression(element))
    return ctx["$total"]


def _bounded(function: str, value: Any) -> Any:
    refuse_larger(function, _size(value if isinstance(value, list) else [value]))
    return value


def _size(values: Collection) -> int:
    """A collection's size for the bound: one per element, plus each string's length."""
    return len(values) + sum(len(item) for item in values if isinstance(item, str))


def _single_string(inputs: Collection) -> str:
    if len(inputs) == 1 and isinstance(data := _data(inputs[0]), str):
        return data
    raise FhirPathError(f"expected one string, got {inputs!r:.200}")


def repeat(ctx: Ctx, inputs: Any, expression: Callable[[Any], Collection]) -> Collection:
    """fhirpathpy's ``repeat`` (breadth first, each element once), linear and bounded."""
    if not isinstance(inputs, list):
        return []
    found: Collection = []
    seen: set[Any] = set()
    pending = deque(inputs)
    size = 0
    while pending:
        fresh = [element for element in expression(pending.popleft()) if element not in seen]
        size += _size(fresh)
        refuse_larger("repeat()", size)
        seen.update(fresh)
        found.extend(fresh)
        pending.extend(fresh)
        if len(found) > MAX_REPEAT_ELEMENTS:
            raise FhirPathError(f"repeat() reaches more than {MAX_REPEAT_ELEMENTS:,} elements")
    return found


# nullable_input: fhirpathpy gives no value for no input without calling the function
SOF_FUNCTIONS: dict[str, dict[str, Any]] = {
    "getResourceKey": {"fn": get_resource_key, "arity": {0: []}},
    "getReferenceKey": {"fn": get_reference_key, "arity": {0: [], 1: ["TypeSpecifier"]}},
    "lowBoundary": {"fn": _boundary(high=False), "arity": {0: [], 1: ["Integer"]}},
    "highBoundary": {"fn": _boundary(high=True), "arity": {0: [], 1: ["Integer"]}},
    "matches": {"fn": matches, "arity": {1: ["String"]}, "nullable_input": True},
    "replaceMatches": {
        "fn": replace_matches,
        "arity": {2: ["String", "String"]},
        "nullable_input": True,
    },
    "repeat": {"fn": repeat, "arity": {1: ["Expr"]}},
    "replace": {"fn": replace, "arity": {2: ["String", "String"]}, "nullable_input": True},
    "&": {"fn": amp, "arity": {2: ["String", "String"]}},
    "+": {"fn": plus, "arity": {2: ["Any", "Any"]}, "nullable": True},
    "aggregate": {"fn": aggregate, "arity": {1: ["Expr"], 2: ["Expr", "Any"]}},
    "join": {"fn": join, "arity": {0: [], 1: ["String"]}},
}
