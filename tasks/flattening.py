"""The ``flattening`` step: the job's data as one CSV per CRTDL attribute group.

Note: spec/protocols.md, "Flattening". See docs/development.md#steps.
"""

import json
import shutil
from dataclasses import fields
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypedDict, cast

import orjson

from config.settings import Settings
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.core.json_shapes import JsonObject
from tasks.job.contract import DataFile, StepInput, StepResult, file_task, settings_of, step_task
from tasks.job.filework import FileToDo, run_batches
from tasks.job.flattening_outcome import (
    FlatteningError,
    FlattenOutcome,
    engine_errors_as_step_errors,
    new_outcome,
    refuse_empty_result,
    report,
)
from tasks.job.flattening_plan import StepPlan, plan_views, remember_plan, step_plan
from tasks.job.steps import file_shape
from tasks.sof.crtdl_views import AttributeGroup, GroupView
from tasks.sof.errors import ResourceLineError
from tasks.sof.flatten import (
    FileParts,
    FilePlan,
    RouteCounts,
    Router,
    bare_routes,
    flatten_file,
    parquet_file,
    routes_by_provenance,
    routes_json,
    routes_path,
)
from tasks.sof.output import CsvWriter, json_bytes
from tasks.sof.resources import parse_line
from tasks.sof.view import compile_view
from tasks.streams.fanout import raise_if_cancelled, results_or_raise
from tasks.streams.files import close_synced, write_file_atomically
from tasks.streams.ndjson import PART_PREFIX, PART_SUFFIX, WHOLE_FILE, iter_lines
from tasks.streams.processes import (
    SharedCount,
    never_cancelled,
    pool_size,
    run_in_process,
    worker_pool,
)
from tasks.streams.progress import Tracker, expect_files, track
from tasks.streams.spans import MB, SPAN_MIN_BYTES, Piece, file_spans, input_pays_for_processes

VIEWS_FOLDER = "viewdefinitions"
PARTS_FOLDER = ".parts"
COPY_CHUNK = 1 << 20


@step_task("flattening")
def flattening(step: StepInput) -> StepResult:
    settings = settings_of(step)
    config = settings.services.flattening
    if step.crtdl_path is None:
        raise FlatteningError(
            "the flattening step needs the job's CRTDL (give it as INPUT when starting the job)"
        )
    if not config.lookup_path:
        raise FlatteningError(
            "services.flattening.lookup_path is not set (the lookup file flattening needs)"
        )
    plan = remember_plan(*plan_views(step.crtdl_path, Path(config.lookup_path)))
    save_view_definitions(step.job_path / VIEWS_FOLDER, plan.views)
    max_line = settings.pipeline.max_ndjson_line_size_bytes
    # an earlier attempt's files, but the finished pieces' parts
    for path in step.output_dir.glob("*"):
        if path.is_file() and path.name.endswith((".csv", ".parquet", PART_SUFFIX)):
            path.unlink()
    if config.service_url:
        endpoint = ServiceEndpoint(
            "flattening",
            config.service_url,
            None,
            config.timeout,
            setting="services.flattening.service_url",
        )
        with ServiceClient(endpoint, settings.tls, settings.retry) as client:
            service = Flattener(client)
            service.check()
            outcome = flatten_with_service(
                list(step.input_paths()),
                step.output_dir,
                plan.views,
                plan.skipped,
                max_line,
                service,
                config.batch_size_mb * MB,
            )
    else:
        outcome = flatten_step_files(step, plan, max_line)
    if "parquet" in config.formats:
        add_parquet_files(step.output_dir, plan.views, outcome)
    report(outcome, step)
    return step.result(outcome.files, **outcome.summary())


class BatchResult(TypedDict):
    """What ``flatten_file`` wrote, and its parts as data files of the step's folder.

    Why: a cached batch whose parts are gone is flattened again.
    """

    parts: FileParts
    files: list[DataFile]


@file_task("flatten-pieces", "flatten[{label}]")
def flatten_batch(
    step: StepInput,
    label: str,
    pieces: list[tuple[Piece, int]],
    by_provenance: bool,
    plan_digest: str,
    in_worker_process: bool,
) -> BatchResult:
    """Flatten the pieces into ``.parts/<first piece's folder>/``.

    Note: each piece comes with its input file's lines, for progress.
    Why: ``plan_digest`` (the views and the skipped groups) makes a changed CRTDL or lookup file a
    new result.
    """
    assert step.input_dir is not None
    plan = step_plan(step, plan_digest)
    max_line = settings_of(step).pipeline.max_ndjson_line_size_bytes
    parts_dir = step.output_dir / PARTS_FOLDER
    planned = FilePlan(
        str(step.input_dir),
        [piece for piece, _ in pieces],
        str(parts_dir),
        pieces[0][0].folder,
        plan.groups,
        plan.skipped_ids,
        by_provenance,
        max_line,
    )
    # a span's lines (0: not counted), else its whole file's
    total = sum(piece.span.lines or whole for piece, whole in pieces)
    parts = flatten_one(
        planned, label, total, in_worker_process=in_worker_process, files=len(pieces)
    )
    files = [
        DataFile(
            name=f"{PARTS_FOLDER}/{parts['folder']}/{group.csv_name}", size=size, resources=rows
        )
        for group, rows, size in zip(plan.groups, parts["rows"], parts["bytes"], strict=True)
        if rows
    ]
    return BatchResult(parts=parts, files=files)


def flatten_one(
    plan: FilePlan, label: str, total: int | None, *, in_worker_process: bool, files: int = 1
) -> FileParts:
    """Return the parts of a plan's pieces, in a worker process or in this one.

    Note: the pieces are ``files`` of the step's input.
    """
    with (
        engine_errors_as_step_errors(),
        track(f"flatten {label}", total, "lines", files=files) as progress,
    ):
        if in_worker_process:
            return flatten_in_worker(plan, progress)
        return flatten_file(plan, raise_if_cancelled, progress.advance)


def flatten_in_worker(plan: FilePlan, progress: Tracker) -> FileParts:
    """Run ``flatten_file`` in a worker process of the step's pool.

    Note: the lines it has done reach ``progress`` while this thread waits.
    """
    done = SharedCount(f"{plan.parts_dir}/.{plan.folder}.count")
    done.remove()  # a count a killed run left
    shown = 0

    def follow() -> None:
        nonlocal shown
        raise_if_cancelled()
        now = done.read()
        progress.advance(now - shown)
        shown = now

    try:
        result = run_in_process(
            flatten_file, plan, never_cancelled, done.add, stop_if_cancelled=follow
        )
    finally:
        done.remove()
    progress.advance(result["lines"] - shown)
    return result


def save_view_definitions(folder: Path, views: list[GroupView]) -> None:
    for view in views:
        text = json.dumps(view.view, indent=2, ensure_ascii=False)
        write_file_atomically(folder / view.group.view_file_name, text.encode() + b"\n")


def add_parquet_files(out_dir: Path, views: list[GroupView], outcome: FlattenOutcome) -> None:
    """Write each group's CSV also as Parquet beside it, typed from its view.

    Why: one after the other in one worker process: the long-lived flow process never loads pyarrow;
    two workers would each hold it and a row group.
    """
    view_of = {view.group.csv_name: view.view for view in views}
    with worker_pool(size=1), engine_errors_as_step_errors():
        for csv_file in list(outcome.files):  # the CSVs, not the Parquet files added below
            parquet_path = out_dir / (csv_file.name.removesuffix(".csv") + ".parquet")
            rows = run_in_process(
                parquet_file,
                out_dir / csv_file.name,
                view_of[csv_file.name],
                parquet_path,
                stop_if_cancelled=raise_if_cancelled,
            )
            outcome.files.append(
                DataFile(name=parquet_path.name, size=parquet_path.stat().st_size, resources=rows)
            )


def plan_pieces(
    input_dir: Path,
    files: Iterable[DataFile],
    parts_dir: Path,
    processes: int,
    by_provenance: bool,
    max_line_bytes: int,
    min_span_bytes: int = SPAN_MIN_BYTES,
) -> list[FileToDo]:
    """Each input file to do: whole, or cut into spans with several ``processes``.

    Note: a file's content is counted only then; a cut file's bare Provenance routes are saved
    once for its spans. A piece's arguments: itself and its file's lines.
    Why: its piece shares its file's name, not a copy; no map of the files by name.
    """
    to_do = []
    for file in files:
        path = input_dir / file.name
        spans = file_spans(path, processes, min_span_bytes) if processes > 1 else [WHOLE_FILE]
        if len(spans) > 1 and by_provenance:
            with engine_errors_as_step_errors():
                routes = routes_json(bare_routes(path, max_line_bytes))
            write_file_atomically(routes_path(parts_dir, file.name), routes)
        size = file.size if len(spans) == 1 else None  # a span's size is not known
        for index, span in enumerate(spans, 1):
            piece = Piece(file.name, span, index, len(spans))
            to_do.append(FileToDo(piece.label, size, (piece, file.resources), file))
    return to_do


def flatten_step_files(step: StepInput, plan: StepPlan, max_line_bytes: int) -> FlattenOutcome:
    """Flatten the input's pieces in cached batches, then join the parts into the CSVs.

    Note: batches of ``flatten[...]`` tasks; on a large input in worker processes (they start while
    the input is scanned and cut).
    """
    in_processes = input_pays_for_processes(step.input_paths())
    assert step.input_dir is not None
    parts_dir = step.output_dir / PARTS_FOLDER
    with worker_pool(flatten_file.__module__) if in_processes else nullcontext():
        by_provenance = routes_by_provenance(step.input_paths(), max_line_bytes)
        workers = pool_size() if in_processes else 1
        to_do = plan_pieces(
            step.input_dir, step.input_files(), parts_dir, workers, by_provenance, max_line_bytes
        )
        cut = len(to_do) > len(step.files)  # a cut file's spans are counted one by one
        expect_files(len(to_do), "pieces" if cut else "files")
        batches = run_batches(
            flatten_batch, step, to_do, workers, by_provenance, plan.digest, in_processes
        )
        results = results_or_raise(batches)
    parts = [result["parts"] for result in results]
    outcome = join_parts(step.output_dir, parts_dir, plan.views, plan.skipped, parts, by_provenance)
    shutil.rmtree(parts_dir, ignore_errors=True)
    return outcome


def join_parts(
    out_dir: Path,
    parts_dir: Path,
    views: list[GroupView],
    skipped: list[AttributeGroup],
    results: list[FileParts],
    by_provenance: bool,
) -> FlattenOutcome:
    """Write each group's CSV: its header, then its part of every piece in input order.

    Note: all are renamed at the end.
    """
    outcome = new_outcome(views, skipped, by_provenance, "embedded")
    for result in results:
        for counts, resources, rows in zip(
            outcome.groups, result["resources"], result["rows"], strict=True
        ):
            counts.resources += resources
            counts.rows += rows
        for counter in fields(RouteCounts):  # in ``FileParts`` as dicts
            getattr(outcome, counter.name).update(cast(JsonObject, result)[counter.name])
    refuse_empty_result(outcome)
    csvs: list[GroupCsv] = []
    try:
        for i, view in enumerate(views):
            csv = GroupCsv(out_dir, view.group.csv_name, compile_view(view.view).columns)
            csvs.append(csv)
            for result in results:
                if rows := result["rows"][i]:
                    csv.append(parts_dir / result["folder"] / csv.dest.name, rows)
    except BaseException:
        for csv in csvs:
            csv.discard()
        raise
    outcome.files += [csv.finish() for csv in csvs]
    return outcome


class GroupCsv:
    """One group's CSV, written under a temporary name and renamed by ``finish``."""

    def __init__(self, folder: Path, name: str, columns: list[str]):
        self.dest, self.part = folder / name, folder / f"{PART_PREFIX}{name}{PART_SUFFIX}"
        self.columns, self.rows = columns, 0
        folder.mkdir(parents=True, exist_ok=True)
        # closed by finish/discard
        self._stream = open(self.part, "w", encoding="utf-8", newline="")  # noqa: SIM115
        self._writer = CsvWriter(self._stream)
        self._writer.writerow(columns)

    def write(self, rows: Any) -> None:
        self.rows += self._writer.writerows(rows)

    def append(self, part: Path, rows: int) -> None:
        """Add a part's ``rows``, CSV rows without a header, as they are."""
        self._stream.flush()
        with part.open("rb") as source:
            shutil.copyfileobj(source, self._stream.buffer, COPY_CHUNK)
        self.rows += rows

    def finish(self) -> DataFile:
        close_synced(self._stream)
        self.part.replace(self.dest)
        return DataFile(name=self.dest.name, size=self.dest.stat().st_size, resources=self.rows)

    def discard(self) -> None:
        self._stream.close()
        self.part.unlink(missing_ok=True)


class RemoteGroup(GroupCsv):
    """A group's CSV, its rows from the flattening service in one ``$run``.

    Note: resources are buffered up to ``budget`` bytes.
    """

    def __init__(self, folder: Path, view: GroupView, service: Flattener, budget: int):
        super().__init__(folder, view.group.csv_name, compile_view(view.view).columns)
        self.service, self.view, self.budget = service, json_bytes(view.view), budget
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, resource: JsonObject) -> None:
        encoded = json_bytes(resource)
        if self.pending and self.pending_bytes + len(encoded) > self.budget:
            self.close()
        self.pending.append(encoded)
        self.pending_bytes += len(encoded)

    def close(self) -> None:
        if not self.pending:
            return
        self.write(
            tuple(row.get(c) for c in self.columns)
            for row in self.service.run(self.view, self.pending)
        )
        self.pending, self.pending_bytes = [], 0


def flatten_with_service(
    paths: list[Path],
    out_dir: Path,
    views: list[GroupView],
    skipped: list[AttributeGroup],
    max_line_bytes: int,
    service: Flattener,
    budget: int,
) -> FlattenOutcome:
    """Send every file's resources, in order, to the service in batches.

    Note: batches of up to ``budget``, divided among the groups.
    """
    by_provenance = routes_by_provenance(paths, max_line_bytes)
    per_group = budget // max(len(views), 1)
    outs = [RemoteGroup(out_dir, view, service, per_group) for view in views]
    outcome = new_outcome(views, skipped, by_provenance, "service")
    groups = [(v.group.id, v.resource_type, v.selection) for v in views]
    router = Router(groups, [g.id for g in skipped], outs, by_provenance, outcome)
    try:
        with engine_errors_as_step_errors():
            for path in paths:
                routes = bare_routes(path, max_line_bytes) if by_provenance else {}
                for number, line in iter_lines(path, max_line_bytes):
                    resource = parse_line(path, number, line)
                    try:
                        router.route_line(resource, routes)
                    # over 254 levels, where orjson reads 1024: the line's fault
                    except orjson.JSONEncodeError:
                        raise ResourceLineError(
                            f"{path}: line {number} is nested too deeply (over 254 levels) to be "
                            "sent to the flattening service"
                        ) from None
        for out in outs:
            out.close()
        for group, resources, out in zip(outcome.groups, router.resources, outs, strict=True):
            group.resources = resources
            group.rows = out.rows
        refuse_empty_result(outcome)
    except BaseException:
        for out in outs:
            out.discard()
        raise
    outcome.files += [out.finish() for out in outs]
    return outcome


def shaped_settings(settings: Settings) -> JsonObject:
    """Return what the step's files depend on besides input and CRTDL.

    Note: the lookup file (an edit of it too) and the formats.
    """
    flattening = settings.services.flattening
    return {"lookup": file_shape(flattening.lookup_path), "formats": flattening.formats}
