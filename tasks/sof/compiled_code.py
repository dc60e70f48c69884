"""A view's selects as one generated Python function per resource type.

Nested loops over the JSON, no call per select, column or step; its subset and what it returns None
for are in docs/development.md, "The SQL-on-FHIR engine".
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from itertools import count, product
from typing import Any

from tasks.core.json_shapes import JsonObject
from tasks.sof.fhirpath import MemberPath, Operation, Plan, TypePath
from tasks.sof.shapes import Row

MAX_GENERATED_DEPTH = 8
"""Nested selects beyond this are left to the general way (Python allows 20 nested blocks in one
function)."""
KEPT = frozenset({str, type(None), bool, int, Decimal, dict})
"""Values a column gives as they are (``plain`` changes floats)."""
PARSED = frozenset({str, type(None), bool, int})
"""Values a column gives as they are from orjson's parse, which reads decimals as floats: objects
(which may hold one) and floats are left to the decimal-keeping parse."""

RowsOf = Callable[[Any], list[Row] | None]
"""A generated function: the rows of a resource (or of a list of structs), None where it is not as
planned."""
Lines = list[str | Callable[[], str]]
"""Lines of source; a callable writes its lines when the source is made (a ``_Where``'s)."""
IRREGULAR = "return None"
"""The generated statement for data not shaped as planned."""


def generated_rows(
    root: Any,
    resource_type: str,
    limit: int,
    kept: frozenset[type] = KEPT,
    cells: bool = False,
    fields: dict[str, str] | None = None,
) -> RowsOf | None:
    """``root``'s rows (a ``Select``) as one generated function, or None outside it.

    Note: a value of a type not in ``kept`` is data not of the planned shape. ``cells``: each
    ``PARSED`` value as ``output.cell`` makes it, so that rows are all strings (``CsvWriter``
    joins them as they are). ``fields``: the rows of a list of structs ``tasks.sof.struct_rows``
    decodes, in one list, each JSON key at the attribute named (their types checked as decoded:
    values as they are, ``''`` where missing); a loop here, not a call per struct (the Condition
    view: 5% less CPU)."""
    if not _in_subset(root, resource_type, depth=0):
        return None
    writer = _Writer(limit, cells or fields is not None, fields)
    indent = 1 if fields is None else 2
    result, single = writer.select(root, "d0", resource_type, indent)
    if not single:  # lists of a row per element grow with the data: the rows are checked here
        writer.give_up_if(f"len({result}) > {limit}", indent)
    body = _text(writer.lines)
    if fields is None:
        source = f"def rows(d0):\n{body}    return {f'[{result}]' if single else result}\n"
    else:
        added = f"rows.append({result})" if single else f"rows += {result}"
        source = "def rows(structs):\n    rows = []\n    for d0 in structs:\n"
        source += f"{body}        {added}\n    return rows\n"
    namespace = {"KEPT": kept, "LISTED": (list, type(None)), "product": product, **writer.constants}
    try:
        code = compile(source, f"<view {resource_type}>", "exec")
    # beyond Python's own limits (IndentationError is a SyntaxError)
    except (SyntaxError, RecursionError, MemoryError):
        return None
    exec(code, namespace)  # noqa: S102 - source made here, no input text
    return namespace["rows"]  # type: ignore[no-any-return]  # the function compiled above


class _Writer:
    def __init__(self, limit: int, cells: bool, fields: dict[str, str] | None):
        self.limit, self.cells, self.fields = limit, cells, fields
        self.lines: Lines = []
        """The function's lines; a ``_Where``'s are written when the source is made.

        Note: sibling wheres add to them."""
        self.constants: JsonObject = {}
        self.names = count()
        self.checked: set[tuple[str, Any, int]] = set()
        """(value, type, indent): checked as an object of that type in that block."""
        self.walked: dict[tuple[str, tuple[Operation, ...], int], str] = {}
        """(focus, steps, indent): the list a walk of those steps gave in that block."""
        self.groups: dict[tuple[str, str, TypePath, int], _Where] = {}
        """(elements, key, type, indent): the pass keeping elements by their key's text."""
        self.known: dict[tuple[str, str], str] = {}
        """(element, key): the constant a where's branch compared the element's key with"""

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self.names)}"

    def constant(self, value: Any) -> str:
        """A name in the function's namespace for ``value`` (no data text in the source)."""
        name = self.name("k")
        self.constants[name] = value
        return name

    def emit(self, indent: int, line: str, *block: str) -> None:
        """Add ``line``, then ``block``'s lines one level deeper."""
        self.lines.append("    " * indent + line + "\n")
        self.lines += ["    " * (indent + 1) + inner + "\n" for inner in block]

    def give_up_if(self, test: str, indent: int) -> None:
        """Code returning None (data not shaped as planned) where ``test`` holds."""
        self.emit(indent, f"if {test}:", IRREGULAR)

    def member(self, value: str, key: str, default: str = "") -> str:
        """Code reading ``value``'s member ``key`` (None where missing, else ``default``)."""
        if self.fields is not None:
            return f"{value}.{self.fields[key]}"
        return f"{value}.get({self.constant(key)}{default})"

    def select(self, select: Any, focus: str, path: TypePath, indent: int) -> tuple[str, bool]:
        """Code giving the select's rows at ``focus`` (of type ``path``).

        Note: the name of their list, or of their one row (a tuple) where the select always
        gives one (True)."""
        if select.iteration is None:
            return self.rows_at(select, focus, path, indent)
        plan = member_plan(select.iterate[0], path)
        assert plan is not None  # _in_subset planned every iteration before the writer starts
        rows, element = self.name("r"), self.name("d")
        kind, key, text, at = plan.operations[-1]
        null_row = tuple("" if self.cells and value is None else value for value in select.null_row)
        if kind == "where" and not select.selects:  # a row per element kept, made in the pass
            found = self.walk(plan.operations[:-1], focus, indent)
            self.built(self.grouped(found, key, at, indent), key, text, rows, select, plan.path)
            if select.iteration == "forEachOrNull":
                self.emit(indent, f"if not {rows}:", f"{rows} = [{self.constant(null_row)}]")
            return rows, False
        found = self.walk(plan.operations, focus, indent)
        # over nothing (often: a coding of a system not there) one null row
        if select.iteration == "forEachOrNull":
            self.emit(indent, f"if not {found}:", f"{rows} = [{self.constant(null_row)}]")
            self.emit(indent, "else:")
            indent += 1
        # the elements a where keeps were checked as objects of that type as it read them
        if kind == "where":
            self.checked.add((element, at, indent + 1))
        self.emit(indent, f"{rows} = []")
        self.emit(indent, f"for {element} in {found}:")
        part, single = self.rows_at(select, element, plan.path, indent + 1, rows)
        if single:  # one row per element: no longer than the data's list (the function's rows are)
            self.emit(indent + 1, f"{rows}.append({part})")
            return rows, False
        if part != rows:
            self.emit(indent + 1, f"{rows} += {part}")
        # rows of rows: checked as they grow
        self.give_up_if(f"len({rows}) > {self.limit}", indent + 1)
        return rows, False

    def rows_at(
        self, select: Any, focus: str, path: TypePath, indent: int, into: str | None = None
    ) -> tuple[str, bool]:
        """Code giving the product of the select's columns and nested selects at ``focus``.

        Note: the name of its row where every part always gives one (True), else of its rows
        (added to the list ``into`` where given): one concatenation where each part gave one row
        (the usual case), a loop where one list gave several (``joined``), else their
        ``product``, the last varying fastest."""
        cells = [self.column(column, focus, path, indent) for column in select.columns]
        parts = []
        if cells or not select.selects:  # a select of nested selects alone gives their rows
            parts.append((self.name("r"), True))
            self.emit(indent, f"{parts[0][0]} = ({''.join(cell + ', ' for cell in cells)})")
        parts += [self.select(nested, focus, path, indent) for nested in select.selects]
        if len(parts) == 1:
            return parts[0]
        rows, lists = into or self.name("r"), [part for part, one in parts if not one]
        # a nested select of one row is joined to its parent's columns (``compile_view``)
        assert lists
        crossed = len(lists) > 1  # a product of lists that may each give several rows
        row = " + ".join(part if one else f"{part}[0]" for part, one in parts)
        size = self.name("n") if crossed else f"len({lists[0]})"
        if crossed:  # the product's size tells which lists give more than one row
            self.emit(indent, f"{size} = {' * '.join(f'len({part})' for part in lists)}")
        self.emit(
            indent, f"if {size} == 1:", f"{rows}.append({row})" if into else f"{rows} = [{row}]"
        )
        if crossed:  # no rows where a list has none (below, every list has one or more)
            self.emit(indent, f"elif not {size}:", "pass" if into else f"{rows} = []")
        for several in lists:  # one list of rows, one from each other (the usual case): no product
            self.emit(indent, f"elif {size} == len({several}):" if crossed else "else:")
            self.joined(parts, several, rows, indent + 1, into is None)
        # one list of rows is no longer than the limit; a product of several may be
        if crossed:
            self.emit(indent, f"elif {size} > {self.limit}:", IRREGULAR)
            self.emit(indent, "else:")
            each = {part: self.name("p") for part in lists}
            if into is None:
                self.emit(indent + 1, f"{rows} = []")
            self.emit(indent + 1, f"for {', '.join(each.values())} in product({', '.join(lists)}):")
            row = " + ".join(each.get(part, part) for part, _ in parts)
            self.emit(indent + 2, f"{rows}.append({row})")
        return rows, False

    def joined(
        self,
        parts: list[tuple[str, bool]],
        several: str,
        rows: str,
        indent: int,
        new: bool,
    ) -> None:
        """Code adding to ``rows`` each row of ``several`` joined to the other parts' row.

        Note: ``new``: ``rows`` is a list made here."""
        ends = [part for part, _ in parts].index(several)
        joined = []
        for side in (parts[:ends], parts[ends + 1 :]):
            if side:
                joined.append(self.name("j"))
                row = " + ".join(part if one else f"{part}[0]" for part, one in side)
                self.emit(indent, f"{joined[-1]} = {row}")
        element = self.name("p")
        joined.insert(1 if ends else 0, element)
        if new:
            self.emit(indent, f"{rows} = []")
        self.emit(indent, f"for {element} in {several}:", f"{rows}.append({' + '.join(joined)})")

    def column(self, column: Any, focus: str, path: TypePath, indent: int) -> str:
        """Code reading a single-valued chain of members; the value's name."""
        plan = column_plan(column, path)
        assert plan is not None  # _in_subset planned every column before the writer starts
        # ``plan.key``: a column of one member step (else "", which no where compares)
        if (focus, plan.key) in self.known:
            return self.known[(focus, plan.key)]
        value = self.name("v")
        for step, (_, key, _, at) in enumerate(plan.operations):
            # no value: the chain ends here (one level deep however long the chain: Python allows
            # 100)
            if step:
                self.emit(indent, f"if {value} is not None:")
            if step and self.fields is not None:  # a struct's member may be a list of structs
                self.give_up_if(f"type({value}) is list", indent + 1)
            self.check_object(value if step else focus, at, indent + min(step, 1), once=not step)
            default = ", ''" if self.cells and step == len(plan.operations) - 1 else ""
            read = self.member(value if step else focus, key, default)
            self.emit(indent + min(step, 1), f"{value} = {read}")
        if self.fields is not None:  # values as decoded; a chain that ended early: no cell
            if len(plan.operations) > 1:
                self.emit(indent, f"if {value} is None:", f"{value} = ''")
        elif self.cells:  # a ``PARSED`` value as its CSV cell; any other type: given up
            self.emit(
                indent,
                f"if type({value}) is not str:",
                f"if {value} is None:",
                f"    {value} = ''",
                f"elif {value} is True:",
                f"    {value} = 'true'",
                f"elif {value} is False:",
                f"    {value} = 'false'",
                f"elif type({value}) is int:",
                f"    {value} = str({value})",
                "else:",
                f"    {IRREGULAR}",
            )
        else:
            self.give_up_if(f"type({value}) not in KEPT", indent)
        return value

    def built(
        self,
        where: _Where,
        key: str,
        text: str | None,
        rows: str,
        select: Any,
        path: TypePath,
    ) -> None:
        """Code making in ``where``'s pass the row of each element with ``key`` ``text``.

        Note: the select's columns, added to the list ``rows``."""
        indent, lines, constant = where.indent + 2, self.lines, self.constant(text)
        self.checked.add((where.element, path, indent))  # checked as the pass read it
        self.known[(where.element, key)] = constant  # its column: the text
        self.lines = []
        part, _ = self.rows_at(select, where.element, path, indent)
        self.emit(indent, f"{rows}.append({part})")
        where.add(text, constant, rows, self.lines)
        self.lines = lines

    def walk(self, operations: tuple[Operation, ...], focus: str, indent: int) -> str:
        """Code giving the elements of an iteration's steps in a list; the list's name.

        Note: lists an earlier walk in the block made of its first steps from this focus are
        reused; no steps: the focus in a list of one."""
        found, step = None, 0
        while step < len(operations):
            # two member steps opening a walk no earlier one opened: taken as one (``member_pair``)
            paired = (
                step == 0
                and [kind for kind, _, _, _ in operations[:2]] == ["member", "member"]
                and (focus, operations[:1], indent) not in self.walked
            )
            known = (focus, operations[: step + 1 + paired], indent)
            if known not in self.walked:
                self.walked[known] = (
                    self.member_pair(operations[0], operations[1], focus, indent)
                    if paired
                    else self.step(operations[step], found, focus, indent)
                )
            found, step = self.walked[known], step + 1 + paired
        return found or f"[{focus}]"

    def member_pair(self, first: Operation, second: Operation, focus: str, indent: int) -> str:
        """Code giving the elements of two member steps (``code.coding``); the list's name.

        Note: where the first is one object (a 0..1 element, the usual case) no list of one and
        no loop."""
        (_, key, _, at), (_, inner_key, _, inner_at) = first, second
        child, inner, kept = self.name("c"), self.name("c"), self.name("e")
        self.check_object(focus, at, indent)
        self.emit(indent, f"{child} = {self.member(focus, key)}")
        planned = (
            f"'resourceType' not in {child} or {child}['resourceType'] == {self.constant(inner_at)}"
        )
        one = f"type({child}) is dict and ({planned})"
        if self.fields is not None:
            one = f"type({child}) not in LISTED"
        self.emit(indent, f"if {one}:", f"{inner} = {self.member(child, inner_key)}")
        self.listed(inner, kept, indent + 1)
        self.emit(indent, "else:")
        self.listed(child, (listed := self.name("e")), indent + 1)
        self.members(listed, inner_key, inner_at, indent + 1, kept)
        return kept

    def step(self, operation: Operation, found: str | None, focus: str, indent: int) -> str:
        """Code giving one step's elements from ``found`` (None: ``focus``); their list."""
        kind, key, argument, at = operation
        kept = self.name("e")
        if kind == "member" and found is None:
            child = self.name("c")
            self.check_object(focus, at, indent)
            self.emit(indent, f"{child} = {self.member(focus, key)}")
            self.listed(child, kept, indent)
        elif kind == "where":
            where = self.grouped(found or f"[{focus}]", key, at, indent)
            if argument not in where.elements:
                where.elements[argument] = kept
                appended = f"{'    ' * (indent + 2)}{kept}.append({where.element})\n"
                where.add(argument, self.constant(argument), kept, [appended])
            return where.elements[argument]
        else:
            self.members(found or f"[{focus}]", key, at, indent, kept)
        return kept

    def listed(self, value: str, kept: str, indent: int) -> None:
        """Code giving a member's value as a list: the data's (read only), or of 0 or 1."""
        self.emit(indent, f"if type({value}) is list:")
        if self.fields is None:  # a null in an array (a struct's lists hold none)
            self.give_up_if(f"None in {value}", indent + 1)
        self.emit(indent + 1, f"{kept} = {value}")
        self.emit(indent, "else:", f"{kept} = [] if {value} is None else [{value}]")

    def members(self, found: str, key: str, at: Any, indent: int, kept: str) -> None:
        """Code giving the ``key`` members of the elements of ``found`` in one list."""
        self.emit(indent, f"{kept} = []")
        _, child = self.each_member(found, key, at, indent)
        self.emit(indent + 1, f"if type({child}) is list:")
        if self.fields is None:
            self.give_up_if(f"None in {child}", indent + 2)
        self.emit(indent + 2, f"{kept} += {child}")
        self.emit(indent + 1, f"elif {child} is not None:", f"{kept}.append({child})")

    def each_member(self, found: str, key: str, at: Any, indent: int) -> tuple[str, str]:
        """Open a loop over ``found``, each element checked as an object of ``at``.

        Note: gives the names of the element and its ``key`` member in the loop's body."""
        value, child = self.name("x"), self.name("c")
        self.emit(indent, f"for {value} in {found}:")
        self.check_object(value, at, indent + 1)
        self.emit(indent + 1, f"{child} = {self.member(value, key)}")
        return value, child

    def grouped(self, found: str, key: str, at: Any, indent: int) -> _Where:
        """The one pass over ``found`` of the block's ``where(key = 'text')`` tests there."""
        known = (found, key, at, indent)
        if known not in self.groups:
            where = self.groups[known] = _Where(indent)
            self.lines.append(where.initial)
            where.element, where.child = self.each_member(found, key, at, indent)
            self.lines.append(where.branches)
        return self.groups[known]

    def check_object(self, value: str, at: TypePath, indent: int, once: bool = True) -> None:
        """Code giving up unless ``value`` is a JSON object of type ``at``.

        Note: ``once``: not again where checked in the block (False: a name given another value
        since). A struct was checked as decoded."""
        if self.fields is not None or once and (value, at, indent) in self.checked:
            return
        self.checked.add((value, at, indent))
        other = f"'resourceType' in {value} and {value}['resourceType'] != {self.constant(at)}"
        self.give_up_if(f"type({value}) is not dict or {other}", indent)


class _Where:
    """One pass over a list's elements for the block's ``where(key = 'text')`` tests.

    Note: for each text, the elements whose ``key`` is that text, or their rows: compared,
    not hashed into a dict (a list per text and select, no ``setdefault``)."""

    def __init__(self, indent: int):
        self.indent, self.element, self.child = indent, "", ""
        self.texts: dict[str | None, tuple[str, Lines]] = {}
        """text: the name of its constant, then the lines adding to each of its lists"""
        self.lists: list[str] = []
        self.elements: dict[str | None, str] = {}
        """text: the name of the list of elements kept (for a select of more than columns)"""

    def add(self, text: str | None, constant: str, kept: str, lines: Lines) -> None:
        self.texts.setdefault(text, (constant, []))[1].extend(lines)
        self.lists.append(kept)

    def initial(self) -> str:
        pad = "    " * self.indent
        return "".join(f"{pad}{kept} = []\n" for kept in self.lists)

    def branches(self) -> str:
        pad = "    " * (self.indent + 1)
        tests = [
            f"{pad}{'elif' if number else 'if'} {self.child} == {constant}:\n" + _text(lines)
            for number, (constant, lines) in enumerate(self.texts.values())
        ]
        return "".join(tests) + f"{pad}elif type({self.child}) is list:\n{pad}    {IRREGULAR}\n"


def _text(lines: Lines) -> str:
    return "".join(line if isinstance(line, str) else line() for line in lines)


def _in_subset(select: Any, path: TypePath, depth: int) -> bool:
    """Whether the select and all nested in it are in the generated subset."""
    if depth > MAX_GENERATED_DEPTH or select.iteration == "repeat" or select.union:
        return False
    if select.iteration is not None:
        if (plan := member_plan(select.iterate[0], path)) is None:
            return False
        path = plan.path
    return all(column_plan(column, path) for column in select.columns) and all(
        _in_subset(nested, path, depth + 1) for nested in select.selects
    )


def column_plan(column: Any, path: TypePath) -> Plan | None:
    """A column's plan where it is a single-valued chain of members."""
    plan = None if column.collection else member_plan(column.evaluate, path)
    if plan and all(kind == "member" for kind, _, _, _ in plan.operations):
        return plan
    return None


def member_plan(evaluate: Any, path: TypePath) -> Plan | None:
    """The plan from focus type ``path`` of member and where() steps; else None.

    Note: ``$this``, no step at all, is left to the general way."""
    if not isinstance(evaluate, MemberPath) or evaluate.function is not None:
        return None
    plan = evaluate.plan(path)
    # first() steps have no key, nor member steps to no child
    if plan and plan.operations and all(key for _, key, _, _ in plan.operations):
        return plan
    return None
