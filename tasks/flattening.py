"""The ``flattening`` step: the job's data as one CSV per CRTDL attribute group (spec/protocols.md, "Flattening").

1. The job's CRTDL and the lookup file (``services.flattening.lookup_path``) give one ViewDefinition per attribute
   group (``tasks.sof.crtdl_views``); a group whose profile has no lookup table is skipped with a warning. Each view
   is saved as ``<job>/viewdefinitions/<group name>.json`` so it can be rerun elsewhere (``view run``).
2. Resources are routed to groups through the extraction's Provenance records (``entity.what.identifier`` with the
   attribute-group system names the group, ``target`` the resources; one resource may belong to several groups).
   TORCH puts them in the same Bundle line as the resources they route; bare Provenance lines route the bare
   resources of their file. Resources that nothing routes are counted per type and reported. When the input holds
   no attribute-group Provenance at all (a plain local import), each resource goes to the groups of its type.
3. Rows come from the embedded SQL-on-FHIR engine (``tasks.sof``), or from the flattening service's ``$run`` when
   ``services.flattening.service_url`` is set (health-checked first). For the service, resources are buffered per
   group up to ``batch_size_mb`` divided by the number of groups, then sent as one request; the embedded engine
   turns each resource into rows at once, so it buffers nothing.
4. Each group's rows go to ``<group name>.csv`` under a temporary name, renamed when the step completes; a group
   with no rows writes no file.

Resume: the step is redone as a whole (files are only renamed at its very end, so a killed run leaves no CSV
behind to append to; leftovers of earlier attempts are removed at the start).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint, http_timeout
from tasks.contract import DataFile, StepInput, StepResult, settings_of, step_task
from tasks.errors import StepError
from tasks.layout import artifact_key, write_file_atomically
from tasks.ndjson import iter_lines
from tasks.sof import compile_view
from tasks.sof.crtdl_views import AttributeGroup, GroupView, attribute_groups, build_view
from tasks.sof.lookup import LookupError as LookupFileError
from tasks.sof.lookup import load_lookup
from tasks.sof.output import csv_cells, csv_writer, json_bytes
from tasks.sof.resources import ResourceLineError, line_resources
from tasks.sof.resources import parse_line as parse_resource_line
from tasks.sof.view import CompiledView, ViewError

log = logging.getLogger("dupflow.flattening")

ATTRIBUTE_GROUP_SYSTEM = "https://www.medizininformatik-initiative.de/fhir/fdpg/NamingSystem/attribute_group"
VIEWS_FOLDER = "viewdefinitions"
MB = 1024 * 1024
PART_PREFIX, PART_SUFFIX = ".", ".part"
_BARE_PROVENANCE = re.compile(rb'^\s*\{.*?"resourceType"\s*:\s*"Provenance"')
_BUNDLE = re.compile(rb'"resourceType"\s*:\s*"Bundle"')


class FlatteningError(StepError):
    """The step cannot flatten its input; the message says what is wrong and what to do."""


@step_task("flattening")
def flattening(step: StepInput) -> StepResult:
    settings = settings_of(step)
    config = settings.services.flattening
    if step.crtdl_path is None:
        raise FlatteningError("the flattening step needs the job's CRTDL (give it as INPUT when starting the job)")
    if not config.lookup_path:
        raise FlatteningError("services.flattening.lookup_path is not set (the lookup file flattening needs)")
    views, skipped = plan_views(step.crtdl_path, Path(config.lookup_path))
    save_view_definitions(step.job_path / VIEWS_FOLDER, views)
    budget = config.batch_size_mb * MB
    max_line = settings.pipeline.max_ndjson_line_size_bytes
    clean_output(step.output_dir)
    if config.service_url:
        endpoint = ServiceEndpoint("flattening", config.service_url, None, http_timeout(config.timeout))
        with ServiceClient(endpoint, settings.tls, settings.retry) as client:
            service = Flattener(client)
            service.check()
            outcome = flatten_paths(
                step.input_paths(),
                step.output_dir,
                views,
                skipped,
                max_line_bytes=max_line,
                service=service,
                budget=budget,
            )
    else:
        outcome = flatten_paths(
            step.input_paths(), step.output_dir, views, skipped, max_line_bytes=max_line, budget=budget
        )
    report(outcome, step)
    return step.result(outcome.files, **outcome.summary())


# --- planning ---------------------------------------------------------------------------------------------------


def plan_views(crtdl_path: Path, lookup_path: Path) -> tuple[list[GroupView], list[AttributeGroup]]:
    """One ViewDefinition per attribute group that has a lookup table; the groups skipped for lack of one."""
    try:
        crtdl = json.loads(Path(crtdl_path).read_bytes())
        groups = attribute_groups(crtdl)
    except (OSError, ValueError) as exc:
        raise FlatteningError(f"cannot read the CRTDL {crtdl_path}: {exc}") from exc
    try:
        tables = load_lookup(lookup_path)
    except LookupFileError as exc:
        raise FlatteningError(str(exc)) from exc
    views, skipped = [], []
    for group in groups:
        table = tables.get(group.profile)
        if table is None:
            log.warning(
                "attribute group %r is skipped: the lookup file has no table for profile %s", group.name, group.profile
            )
            skipped.append(group)
            continue
        try:
            built = build_view(group, table)
        except ViewError as exc:
            raise FlatteningError(
                f"attribute group {group.name!r} ({group.profile}): invalid ViewDefinition: {exc}"
            ) from exc
        if built.skipped_attributes:
            log.warning(
                "attribute group %r: no lookup element for %s (left out of its CSV)",
                group.name,
                ", ".join(built.skipped_attributes),
            )
        views.append(built)
    names = Counter(view.group.csv_name for view in views)
    if clashes := [name for name, count in names.items() if count > 1]:
        raise FlatteningError(f"several attribute groups would write the same CSV ({', '.join(clashes)}); rename them")
    return views, skipped


def save_view_definitions(folder: Path, views: list[GroupView]) -> None:
    """``<folder>/<group name>.json`` per view, so that a user can rerun it elsewhere."""
    for view in views:
        name = view.group.csv_name.removesuffix(".csv") + ".json"
        write_file_atomically(folder / name, json.dumps(view.view, indent=2, ensure_ascii=False).encode() + b"\n")


def clean_output(folder: Path) -> None:
    """Remove CSVs and temporaries of an earlier attempt: the step is redone as a whole."""
    if folder.is_dir():
        for path in folder.iterdir():
            if path.is_file() and (path.name.endswith(".csv") or path.name.endswith(PART_SUFFIX)):
                path.unlink()


# --- routing ----------------------------------------------------------------------------------------------------


def resource_key(resource: dict[str, Any]) -> str | None:
    kind, ident = resource.get("resourceType"), resource.get("id")
    return f"{kind}/{ident}" if isinstance(kind, str) and isinstance(ident, str) else None


def reference_key(reference: Any) -> str | None:
    """``Type/id`` of a literal reference (absolute URLs and ``_history`` dropped)."""
    if not isinstance(reference, str) or "/" not in reference:
        return None
    parts = reference.split("/_history")[0].rstrip("/").split("/")
    return f"{parts[-2]}/{parts[-1]}" if len(parts) >= 2 else None


def provenance_routes(provenance: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(resource key, group id)`` for each target and attribute group a TORCH Provenance names."""
    groups = []
    for entity in provenance.get("entity") or []:
        identifier = ((entity or {}).get("what") or {}).get("identifier") or {}
        if identifier.get("system") == ATTRIBUTE_GROUP_SYSTEM and isinstance(identifier.get("value"), str):
            groups.append(identifier["value"])
    for target in provenance.get("target") or []:
        key = reference_key((target or {}).get("reference"))
        if key is not None:
            for group in groups:
                yield key, group


def add_routes(routes: dict[str, set[str]], provenance: dict[str, Any]) -> None:
    for key, group in provenance_routes(provenance):
        routes.setdefault(key, set()).add(group)


def parse_line(source: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        return parse_resource_line(source, number, line)
    except ResourceLineError as exc:
        raise FlatteningError(str(exc)) from exc


@dataclass
class FileScan:
    """What a cheap first pass over a file finds: attribute-group Provenance anywhere, and bare Provenance routes."""

    has_group_provenance: bool = False
    bare_routes: dict[str, set[str]] = field(default_factory=dict)


def scan_file(path: Path, max_line_bytes: int) -> FileScan:
    scan = FileScan()
    marker = ATTRIBUTE_GROUP_SYSTEM.encode()
    for number, line in iter_lines(path, max_line_bytes):
        if marker not in line:
            continue
        scan.has_group_provenance = True
        if _BARE_PROVENANCE.match(line) and not _BUNDLE.search(line):
            resource = parse_line(path, number, line)
            if resource.get("resourceType") == "Provenance":
                add_routes(scan.bare_routes, resource)
    return scan


# --- rows into CSV files ----------------------------------------------------------------------------------------


class GroupCsv:
    """One group's CSV, written under a temporary name and renamed by ``finish`` (removed when it has no rows)."""

    def __init__(self, folder: Path, name: str, columns: list[str]):
        self.dest = folder / name
        self.part = folder / f"{PART_PREFIX}{name}{PART_SUFFIX}"
        self.columns = columns
        self.rows = 0
        folder.mkdir(parents=True, exist_ok=True)
        self._stream = open(self.part, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed by finish/discard
        self._writer = csv_writer(self._stream)
        self._writer.writerow(columns)

    def write(self, rows: Iterator[tuple] | list[tuple]) -> None:
        for row in rows:
            self._writer.writerow(csv_cells(row))
            self.rows += 1

    def finish(self) -> DataFile | None:
        self._stream.close()
        if not self.rows:
            self.part.unlink(missing_ok=True)
            return None
        self.part.replace(self.dest)
        return DataFile(name=self.dest.name, size=self.dest.stat().st_size, resources=self.rows)

    def discard(self) -> None:
        self._stream.close()
        self.part.unlink(missing_ok=True)


class Engine(Protocol):
    def add(self, resource: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class EmbeddedGroup:
    """A group's rows from the embedded engine, written as each resource arrives (nothing buffered)."""

    def __init__(self, view: CompiledView, out: GroupCsv):
        self.view, self.out = view, out

    def add(self, resource: dict[str, Any]) -> None:
        try:
            self.out.write(self.view.rows(resource))
        except ViewError as exc:
            raise FlatteningError(f"{self.out.dest.name}: resource {resource_key(resource)}: {exc}") from exc

    def close(self) -> None:
        return None


class RemoteGroup:
    """A group's rows from the flattening service: resources buffered up to ``budget`` bytes, then one ``$run``."""

    def __init__(self, service: Flattener, view: dict[str, Any], out: GroupCsv, budget: int):
        self.service, self.out, self.budget = service, out, max(budget, 1)
        self.view = json_bytes(view)
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, resource: dict[str, Any]) -> None:
        encoded = json_bytes(resource)
        if self.pending and self.pending_bytes + len(encoded) > self.budget:
            self.close()
        self.pending.append(encoded)
        self.pending_bytes += len(encoded)

    def close(self) -> None:
        if not self.pending:
            return
        columns = self.out.columns
        self.out.write(tuple(row.get(c) for c in columns) for row in self.service.run(self.view, self.pending))
        self.pending, self.pending_bytes = [], 0


@dataclass
class GroupCounts:
    group: AttributeGroup
    csv: str
    resources: int = 0
    rows: int = 0


@dataclass
class FlattenOutcome:
    groups: list[GroupCounts]
    skipped: list[AttributeGroup]
    skipped_resources: Counter
    unrouted: Counter
    unknown_groups: Counter
    routing: str
    engine: str
    files: list[DataFile] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "routing": self.routing,
            "groups": [
                {
                    "group": g.group.name,
                    "id": g.group.id,
                    "csv": g.csv if g.rows else None,
                    "resources": g.resources,
                    "rows": g.rows,
                }
                for g in self.groups
            ],
            "skipped_groups": [{"group": g.name, "profile": g.profile} for g in self.skipped],
            "unrouted": dict(sorted(self.unrouted.items())),
            "unrouted_total": sum(self.unrouted.values()),
            "resources_of_skipped_groups": dict(sorted(self.skipped_resources.items())),
        }


def flatten_paths(
    paths: list[Path],
    out_dir: Path,
    views: list[GroupView],
    skipped: list[AttributeGroup],
    *,
    max_line_bytes: int,
    service: Flattener | None = None,
    budget: int = 500 * MB,
) -> FlattenOutcome:
    """Flatten the resources of ``paths`` (plain or zstd NDJSON, bare resources or Bundles) into ``out_dir``."""
    scans = [scan_file(path, max_line_bytes) for path in paths]
    by_provenance = any(scan.has_group_provenance for scan in scans)
    compiled = [compile_view(view.view) for view in views]
    outs = [GroupCsv(out_dir, view.group.csv_name, c.columns) for view, c in zip(views, compiled, strict=True)]
    engines: list[Engine] = []
    per_group = budget // max(len(views), 1)
    for view, view_compiled, out in zip(views, compiled, outs, strict=True):
        if service is None:
            engines.append(EmbeddedGroup(view_compiled, out))
        else:
            engines.append(RemoteGroup(service, view.view, out, per_group))
    outcome = FlattenOutcome(
        groups=[GroupCounts(view.group, view.group.csv_name) for view in views],
        skipped=skipped,
        skipped_resources=Counter(),
        unrouted=Counter(),
        unknown_groups=Counter(),
        routing="provenance" if by_provenance else "resource type",
        engine="service" if service is not None else "embedded",
    )
    router = Router(views, skipped, engines, outcome, by_provenance)
    try:
        for path, scan in zip(paths, scans, strict=True):
            for number, line in iter_lines(path, max_line_bytes):
                router.route_line(parse_line(path, number, line), scan.bare_routes)
        for engine in engines:
            engine.close()
    except BaseException:
        for out in outs:
            out.discard()
        raise
    for counts, out in zip(outcome.groups, outs, strict=True):
        counts.rows = out.rows
        if (data_file := out.finish()) is not None:
            outcome.files.append(data_file)
    return outcome


class Router:
    """Sends each resource to the engines of its groups and counts what goes where."""

    def __init__(
        self,
        views: list[GroupView],
        skipped: list[AttributeGroup],
        engines: list[Engine],
        outcome: FlattenOutcome,
        by_provenance: bool,
    ):
        self.index = {view.group.id: i for i, view in enumerate(views)}
        self.skipped_ids = {group.id for group in skipped}
        self.by_type: dict[str, list[int]] = {}
        for i, view in enumerate(views):
            self.by_type.setdefault(view.resource_type, []).append(i)
        self.engines, self.outcome, self.by_provenance = engines, outcome, by_provenance

    def route_line(self, resource: dict[str, Any], bare_routes: dict[str, set[str]]) -> None:
        resources = line_resources(resource)
        routes = bare_routes
        if resource.get("resourceType") == "Bundle" and self.by_provenance:
            routes = {key: set(groups) for key, groups in bare_routes.items()} if bare_routes else {}
            for item in resources:
                if item.get("resourceType") == "Provenance":
                    add_routes(routes, item)
        for item in resources:
            if item.get("resourceType") != "Provenance":
                self.route(item, routes)

    def route(self, resource: dict[str, Any], routes: dict[str, set[str]]) -> None:
        kind = str(resource.get("resourceType"))
        skipped = False
        if not self.by_provenance:
            targets = self.by_type.get(kind, [])
        else:
            targets = []
            for group in sorted(routes.get(resource_key(resource) or "", ())):
                if group in self.index:
                    targets.append(self.index[group])
                elif group in self.skipped_ids:
                    skipped = True
                else:
                    self.outcome.unknown_groups[group] += 1
        if skipped and not targets:
            self.outcome.skipped_resources[kind] += 1
        if not targets:
            if not skipped:
                self.outcome.unrouted[kind] += 1
            return
        for target in targets:
            self.outcome.groups[target].resources += 1
            self.engines[target].add(resource)


# --- reporting --------------------------------------------------------------------------------------------------


def report(outcome: FlattenOutcome, step: StepInput) -> None:
    """Log what was written and what was not routed; publish the step's table artifact."""
    if outcome.routing == "resource type":
        log.warning("the input holds no attribute-group Provenance (a plain import): resources routed by resource type")
    for counts in outcome.groups:
        log.info("%s: %d resources, %d rows", counts.csv, counts.resources, counts.rows)
    if outcome.unrouted:
        listed = ", ".join(f"{kind} {count}" for kind, count in sorted(outcome.unrouted.items()))
        log.warning("resources no attribute group routes (not in any CSV): %s", listed)
    if outcome.unknown_groups:
        listed = ", ".join(sorted(outcome.unknown_groups))
        log.warning("Provenance names attribute groups that are not in the CRTDL: %s", listed)
    publish_artifact(outcome, step)


def publish_artifact(outcome: FlattenOutcome, step: StepInput) -> None:
    from prefect.artifacts import create_table_artifact

    table = [
        {"group": c.group.name, "csv": c.csv if c.rows else "(no rows)", "resources": c.resources, "rows": c.rows}
        for c in outcome.groups
    ]
    table += [
        {"group": g.name, "csv": "(skipped: no lookup table)", "resources": 0, "rows": 0} for g in outcome.skipped
    ]
    table += [
        {"group": "(unrouted)", "csv": kind, "resources": count, "rows": 0}
        for kind, count in sorted(outcome.unrouted.items())
    ]
    create_table_artifact(
        key=artifact_key(step.job_id, "flattening"),
        table=table,
        description=f"Flattening ({outcome.engine} engine, routed by {outcome.routing})",
    )
