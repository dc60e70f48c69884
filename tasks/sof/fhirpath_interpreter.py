"""FHIRPath expressions that are no member paths, parsed once and evaluated by fhirpathpy with the engine's own
functions (``tasks.sof.fhirpath_functions``): imported only where a view has one (``tasks.sof.fhirpath``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from antlr4 import CommonTokenStream, InputStream, Token
from antlr4.error.ErrorListener import ErrorListener
from antlr4.tree.Tree import ParseTreeWalker
from fhirpathpy.engine import do_eval
from fhirpathpy.engine.invocations.constants import constants as fhirpath_constants
from fhirpathpy.engine.nodes import ResourceNode
from fhirpathpy.engine.util import arraify
from fhirpathpy.parser.ASTPathListener import ASTPathListener
from fhirpathpy.parser.generated.FHIRPathLexer import FHIRPathLexer
from fhirpathpy.parser.generated.FHIRPathParser import FHIRPathParser

from tasks.sof.errors import FhirPathError
from tasks.sof.fhirpath_functions import SOF_FUNCTIONS
from tasks.sof.fhirpath_shared import MAX_EXPRESSION_DEPTH, MODEL, TOO_DEEP, Env, Item, Paths, data_and_paths, shown


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
    ast = ASTPathListener()
    try:
        tree = parser.expression()
        if tokens.LA(1) != Token.EOF:
            raise FhirPathError(f"unexpected {tokens.LT(1).text!r} at column {tokens.LT(1).column + 1}")
        ParseTreeWalker().walk(ast, tree)
    except RecursionError:
        raise FhirPathError(TOO_DEEP) from None
    parsed = ast.parentStack[0]
    if tree_depth(parsed) > MAX_EXPRESSION_DEPTH:
        raise FhirPathError(TOO_DEEP)
    return parsed


def tree_depth(node: dict[str, Any]) -> int:
    """Levels of a parse tree (walked with a list, not recursion)."""
    deepest, pending = 0, [(node, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in node.get("children") or ())
    return deepest


def interpreted(expression: str) -> Interpreted:
    """``expression`` parsed once for fhirpathpy's evaluator; a ``FhirPathError`` where it does not parse."""
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
        return [
            Item(value.data, value.path) if isinstance(value, ResourceNode) else Item(value)
            for value in arraify(result)
            if not _is_primitive_extension_only(value)
        ]

    def collect(self, data: Any, path: str | None, env: Env) -> tuple[list, Paths]:
        return data_and_paths(self(Item(data, path), env))


def _is_primitive_extension_only(value: Any) -> bool:
    """fhirpathpy yields ``_element`` siblings (extensions of primitives) as their own nodes; they are no values."""
    return isinstance(value, ResourceNode) and isinstance(value.data, Mapping) and list(value.data) == ["extension"]
