"""Flattening's per-file work: resources routed to groups, rows as CSV parts.

``flatten_file(plan)`` writes its pieces' rows per group into ``<parts>/<plan.folder>/<csv name>``;
cancellation comes as ``stop_if_cancelled``, progress goes as ``advance``. See docs/development.md,
"The SQL-on-FHIR engine".
"""

import json
import re
import shutil
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path
from typing import IO, Protocol, TypedDict

import orjson

from tasks.core.json_shapes import as_array, as_object, JsonObject
from tasks.streams.ndjson import iter_lines
from tasks.streams.processes import CancelCheck, CountCallback, never_cancelled, uncounted
from tasks.sof.errors import ViewError, ViewEvaluationError
from tasks.sof.fhirpath_shared import reference_key
from tasks.sof.output import ROWS_PER_BATCH, CsvWriter
from tasks.sof.resources import line_resources, parse_line
from tasks.sof.selection import FILTERED_OUT, TAKEN, Selection
from tasks.sof.view import CompiledView, compile_view
from tasks.sof.shapes import Row
from tasks.streams.spans import Piece

ATTRIBUTE_GROUP_SYSTEM = (
    "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/attribute_group"
)
_GROUP_MARKER = ATTRIBUTE_GROUP_SYSTEM.encode()
_BARE_PROVENANCE = re.compile(rb'^\s*\{.*?"resourceType"\s*:\s*"Provenance"')
_BUNDLE = re.compile(rb'"resourceType"\s*:\s*"Bundle"')
# A line opening as a Bundle (as TORCH writes every line) is no bare Provenance: known without
# searching the line.
_BUNDLE_OPENING = re.compile(rb'\s*\{\s*"resourceType"\s*:\s*"Bundle"')
Routes = dict[str, set[str]]
"""Each resource's ``Type/id``: the attribute groups TORCH's Provenance names for it."""


def resource_key(resource: JsonObject) -> str | None:
    kind, ident = resource.get("resourceType"), resource.get("id")
    return f"{kind}/{ident}" if isinstance(kind, str) and isinstance(ident, str) else None


def add_routes(routes: Routes, provenance: JsonObject) -> None:
    """Route each target a TORCH Provenance names to each attribute group it names.

    Note: a malformed part routes nothing (what it would have routed counts as unrouted)."""
    groups = []
    for entity in as_array(provenance.get("entity")):
        identifier = as_object(as_object(as_object(entity).get("what")).get("identifier"))
        if identifier.get("system") == ATTRIBUTE_GROUP_SYSTEM and isinstance(
            identifier.get("value"), str
        ):
            groups.append(identifier["value"])
    for target in as_array(provenance.get("target")):
        if (key := reference_key(as_object(target).get("reference"))) is not None and groups:
            routes[key] = routes.get(key, set()) | set(groups)


def routes_by_provenance(paths: Iterable[Path], max_line_bytes: int) -> bool:
    """Tell whether any line of the inputs mentions the attribute-group system."""
    return any(
        _GROUP_MARKER in line for path in paths for _, line in iter_lines(path, max_line_bytes)
    )


def bare_routes(path: Path, max_line_bytes: int) -> Routes:
    """The routes of the file's bare (not in a Bundle) attribute-group Provenance."""
    routes: Routes = {}
    for number, line in iter_lines(path, max_line_bytes):
        if _BUNDLE_OPENING.match(line):
            continue
        if _GROUP_MARKER in line and not _BUNDLE.search(line) and _BARE_PROVENANCE.match(line):
            resource = parse_line(path, number, line)
            if resource.get("resourceType") == "Provenance":
                add_routes(routes, resource)
    return routes


def routes_json(routes: Routes) -> bytes:
    """Routes as JSON (each resource's groups sorted), for ``routes_of``."""
    return json.dumps({key: sorted(groups) for key, groups in routes.items()}).encode()


class Engine(Protocol):
    def add(self, resource: JsonObject) -> None: ...


@dataclass(kw_only=True)
class RouteCounts:
    """Per type, what routing gave no group (``FlattenOutcome`` adds these up)."""

    unrouted: Counter[str] = field(default_factory=Counter)
    skipped_resources: Counter[str] = field(default_factory=Counter)
    unknown_groups: Counter[str] = field(default_factory=Counter)
    other_profile: Counter[str] = field(default_factory=Counter)
    """Without Provenance: per type, what no group took, as none has its profile."""
    filtered_out: Counter[str] = field(default_factory=Counter)
    """Without Provenance: per type, what no group took, as its filters left it out."""


@dataclass
class Router:
    """Sends each resource to the engines of its groups, counting what goes where.

    Note: groups are ``(group id, resource type, selection)``; ``resources`` per group (in
    group order), what no group took in ``counts``. Without Provenance, a group takes what its
    selection (``Selection()``: any of its type) takes."""

    groups: list[tuple[str, str, Selection]]
    skipped_ids: Collection[str]
    engines: Sequence[Engine]
    by_provenance: bool
    counts: RouteCounts

    def __post_init__(self) -> None:
        self.index = {group: i for i, (group, _, _) in enumerate(self.groups)}
        self.by_type: dict[str, list[tuple[int, Selection]]] = {}
        for i, (_, kind, selection) in enumerate(self.groups):
            self.by_type.setdefault(kind, []).append((i, selection))
        self.resources = [0] * len(self.groups)

    def route_line(self, resource: JsonObject, bare: Routes) -> None:
        resources = line_resources(resource)
        routes = bare
        if resource.get("resourceType") == "Bundle" and self.by_provenance:
            routes = dict(bare)  # add_routes makes new sets: the file's stay as they are
            for item in resources:
                if item.get("resourceType") == "Provenance":
                    add_routes(routes, item)
        for item in resources:
            if item.get("resourceType") != "Provenance":
                self.route(item, routes)

    def route(self, resource: JsonObject, routes: Routes) -> None:
        kind = str(resource.get("resourceType"))
        skipped = False
        if not self.by_provenance:
            self.route_by_type(kind, resource)
            return
        targets = []
        for group in sorted(routes.get(resource_key(resource) or "", ())):
            if group in self.index:
                targets.append(self.index[group])
            elif group in self.skipped_ids:
                skipped = True
            else:
                self.counts.unknown_groups[group] += 1
        if not targets:
            (self.counts.skipped_resources if skipped else self.counts.unrouted)[kind] += 1
            return
        for target in targets:
            self.resources[target] += 1
            self.engines[target].add(resource)

    def route_by_type(self, kind: str, resource: JsonObject) -> None:
        """To each group of its type that takes it; else counted by why no group took it."""
        candidates = self.by_type.get(kind)
        if not candidates:
            self.counts.unrouted[kind] += 1
            return
        taken = filtered = False
        for target, selection in candidates:
            verdict = selection.check(resource)
            if verdict == TAKEN:
                taken = True
                self.resources[target] += 1
                self.engines[target].add(resource)
            filtered = filtered or verdict == FILTERED_OUT
        if not taken:
            (self.counts.filtered_out if filtered else self.counts.other_profile)[kind] += 1


@dataclass(frozen=True)
class GroupPlan:
    id: str
    csv_name: str
    resource_type: str
    view_json: str
    selection: Selection = field(default_factory=Selection)


@dataclass(frozen=True)
class FilePlan:
    """Pieces of the input to flatten (files, or one span), as a worker receives it.

    Note: ``input_dir`` once, not a path per piece (5,000 pieces a batch, pickled to the worker).
    """

    input_dir: str
    pieces: list[Piece]
    parts_dir: str
    folder: str
    groups: tuple[GroupPlan, ...]
    skipped_ids: tuple[str, ...]
    by_provenance: bool
    max_line_bytes: int


Counts = dict[str, int]
"""A ``RouteCounts`` counter as ``FileParts`` holds it (a plain dict, by type or group id)."""


class FileParts(TypedDict):
    """What ``flatten_file`` wrote; ``resources``, ``rows``, ``bytes`` in group order."""

    folder: str
    lines: int
    resources: list[int]
    rows: list[int]
    bytes: list[int]
    unrouted: Counts
    skipped_resources: Counts
    unknown_groups: Counts
    other_profile: Counts
    filtered_out: Counts


@dataclass
class ParsedLine:
    """The line being routed, parsed by orjson alone (no search for decimals).

    Note: ``exact(resource)`` is one of its resources as the decimal-keeping parse gives it,
    for a view whose ``csv_rows`` does not take it."""

    source: Path = field(default_factory=Path)
    number: int = 0
    line: bytes = b""
    root: JsonObject | None = None
    _exact: list[JsonObject] | None = None

    def parse(self, number: int, line: bytes) -> JsonObject:
        self.number, self.line, self._exact = number, line, None
        try:
            self.root = orjson.loads(line)
        except ValueError:
            self.root = None
        if type(self.root) is not dict:  # the general parse gives the error
            self.root = None
            return parse_line(self.source, number, line)
        return self.root

    def exact(self, resource: JsonObject) -> JsonObject:
        if self.root is None:
            return resource
        if self._exact is None:
            self._exact = line_resources(parse_line(self.source, self.number, self.line))
        index = next(i for i, found in enumerate(line_resources(self.root)) if found is resource)
        return self._exact[index]


@dataclass
class RowsWriter:
    """A group's rows as CSV lines (no header) in ``path``, opened at the first row.

    Note: written ``ROWS_PER_BATCH`` at a time. Resources come as orjson parses them: the
    view's ``csv_rows`` where it takes them, else its rows of the resource parsed with its
    decimals (``line.exact``)."""

    path: Path
    view: CompiledView
    line: ParsedLine
    rows: int = 0
    _pending: list[Row] = field(default_factory=list)
    _stream: IO[str] | None = None
    _writer: CsvWriter | None = None

    def add(self, resource: JsonObject) -> None:
        """Take the resource's rows as the view makes them (one may give millions)."""
        try:
            view, cells = self.view, None
            if view.csv_rows is not None and resource.get("resourceType") == view.resource:
                cells = view.csv_rows(resource)
            if cells is None or len(cells) > view.max_rows_per_resource:
                rows = view.rows(self.line.exact(resource))
            else:
                rows = cells
            streamed = type(rows) is not list and type(rows) is not tuple
            self._pending += islice(rows, ROWS_PER_BATCH) if streamed else rows
            if len(self._pending) >= ROWS_PER_BATCH:
                self._write(chain(self._pending, rows) if streamed else self._pending)
        except ViewError as exc:
            raise ViewEvaluationError(f"{self.path.name}: {exc}") from exc

    def _write(self, rows: Iterable[Row]) -> None:
        if self._writer is None:
            # closed by close(), not by a with block: rows come over many calls
            self._stream = open(self.path, "w", encoding="utf-8", newline="")  # noqa: SIM115
            self._writer = CsvWriter(self._stream)
        try:
            self.rows += self._writer.writerows(rows)
        # an object cell nested deeper than orjson writes (254 levels)
        except orjson.JSONEncodeError as exc:
            raise ViewEvaluationError(
                f"{self.path.name}: a cell from {self.line.source} cannot be written as JSON "
                f"({exc})"
            ) from None
        self._pending = []

    def close(self) -> int:
        """Write what is held and close the part; its size in bytes (0 without rows)."""
        if self._pending:
            self._write(self._pending)
        if self._stream is None:
            return 0
        self._stream.close()
        return self.path.stat().st_size

    def discard(self) -> None:
        if self._stream is not None:
            self._stream.close()


def flatten_file(
    plan: FilePlan,
    stop_if_cancelled: CancelCheck = never_cancelled,
    advance: CountCallback = uncounted,
) -> FileParts:
    """Flatten the plan's pieces in turn into ``<parts_dir>/<folder>/`` (renamed to)."""
    parts_dir = Path(plan.parts_dir)
    work, final = parts_dir / f".{plan.folder}.tmp", parts_dir / plan.folder
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    parsed = ParsedLine()  # its source set for each piece
    writers = [
        RowsWriter(work / g.csv_name, compiled_view(g.view_json), parsed) for g in plan.groups
    ]
    groups = [(g.id, g.resource_type, g.selection) for g in plan.groups]
    counts = RouteCounts()
    router = Router(groups, plan.skipped_ids, writers, plan.by_provenance, counts)
    lines = 0
    try:
        for piece in plan.pieces:
            parsed.source = source = Path(plan.input_dir, piece.name)
            routes = routes_of(piece, source, plan)
            for number, line in iter_lines(source, plan.max_line_bytes, piece.span):
                stop_if_cancelled()
                router.route_line(parsed.parse(number, line), routes)
                lines += 1
                advance(1)
        sizes = [writer.close() for writer in writers]
    except BaseException:
        for writer in writers:
            writer.discard()
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return FileParts(
        folder=plan.folder,
        lines=lines,
        resources=router.resources,
        rows=[writer.rows for writer in writers],
        bytes=sizes,
        unrouted=dict(counts.unrouted),
        skipped_resources=dict(counts.skipped_resources),
        unknown_groups=dict(counts.unknown_groups),
        other_profile=dict(counts.other_profile),
        filtered_out=dict(counts.filtered_out),
    )


def routes_of(piece: Piece, source: Path, plan: FilePlan) -> Routes:
    """The piece's bare Provenance routes: for a span where ``plan_pieces`` saved them."""
    if not plan.by_provenance:
        return {}
    if piece.count > 1:
        saved = routes_path(Path(plan.parts_dir), piece.name).read_bytes()
        return {key: set(groups) for key, groups in json.loads(saved).items()}
    return bare_routes(source, plan.max_line_bytes)


def routes_path(parts_dir: Path, name: str) -> Path:
    return parts_dir / f".{name}.routes.json"


@lru_cache(maxsize=64)
def compiled_view(view_json: str) -> CompiledView:
    """A ViewDefinition compiled once per process, however many files use it."""
    return compile_view(json.loads(view_json))


def parquet_file(csv_path: Path, view: JsonObject, parquet_path: Path) -> int:
    """``tasks.sof.parquet.write_parquet``, imported in the worker.

    Why: pyarrow and Arrow's memory (about 100 MB for a large CSV) stay out of the
    long-lived flow process."""
    from tasks.sof.parquet import write_parquet

    return write_parquet(csv_path, view, parquet_path)
