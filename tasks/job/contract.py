"""The step contract: its input, result and the task decorators.

See docs/development.md#the-step-contract.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from prefect import Task, task
from prefect.cache_policies import CacheKeyFnPolicy
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext, TaskRunContext
from prefect.transactions import CommitMode, transaction
from prefect.utilities.annotations import NotSet, quote
from pydantic import BaseModel, ConfigDict

from config.loader import cached_settings
from config.settings import Settings
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JsonObject
from tasks.core.redaction import redact, redact_records_sent_to_prefect
from tasks.job.flow_run_watch import stopped_when_flow_run_ends
from tasks.job.layout import JobPaths, result_name, step_artifact_key, step_folder
from tasks.job.result_storage import JobResultStorage, persist_in_task
from tasks.streams.progress import StepWork, step_progress
from tasks.streams.ndjson import FileStats, remove_partial_files
from tasks.job.record import FileColumns, FileEntry, StepRecord

R = TypeVar("R")
C = TypeVar("C", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class DataFile(FileEntry):
    """One data file of a step's folder, as its writer recorded it.

    Note: ``modified_ns`` is its time of change as written (a wait step's corrected file: as read),
    so a file written anew to the same size is a new input.
    """

    modified_ns: int | None = None

    @classmethod
    def written(cls, name: str, stats: FileStats) -> DataFile:
        """Build the data file ``name`` as its writer counted it."""
        return cls(name, **asdict(stats))

    def on_disk_in(self, folder: Path) -> bool:
        """Whether ``folder`` holds this file as recorded (size; time of change when kept)."""
        try:
            found = (folder / self.name).stat()
        except OSError:
            return False
        return found.st_size == self.size and self.modified_ns in (None, found.st_mtime_ns)


class DataFiles(FileColumns):
    """A batch's files (``local_import``'s), written as columns."""

    files: list[DataFile]


def core_first(file: DataFile) -> tuple[bool, str]:
    """A step's files' order: ``core`` first (referential integrity), then by name."""
    return not file.name.startswith("core."), file.name


class StepInput(BaseModel):
    """What a step task receives.

    Note: ``folder`` is relative to the job directory (None for import steps).
    """

    model_config = ConfigDict(frozen=True)

    job_id: str
    job_dir: str
    position: int
    step: str
    job_input: str | None = None
    folder: str | None = None
    files: list[DataFile] = []
    facts: JsonObject = {}
    config_path: str | None = None
    overrides: dict[str, str] = {}
    files_digest: str | None = None
    """The files a file task works on as a digest, in its input (``for_file_tasks``)."""
    settings_digest: str | None = None
    """A digest of the settings that shape this step's output (``shaped_settings`` of its module):
    one changed since (``continue --set``, the file edited) runs the step, and the ones reading its
    files, again."""

    @property
    def number(self) -> int:
        """The 1-based number people read (run names, logs, ``status``).

        Note: keys keep the 0-based ``position``.
        """
        return self.position + 1

    def artifact_key(self, part: str) -> str:
        """The step's artifact ``job-<id>-NN-<step>-<part>`` (``step_artifact_key``)."""
        return step_artifact_key(self.job_id, self.position, self.step, part)

    @property
    def job_path(self) -> Path:
        return Path(self.job_dir)

    @property
    def output_dir(self) -> Path:
        """The folder this step writes (``import/`` for every import step)."""
        return self.job_path / step_folder(self.step)

    @property
    def input_dir(self) -> Path | None:
        return self.job_path / self.folder if self.folder is not None else None

    def input_path(self, name: str) -> Path:
        assert self.input_dir is not None, f"step {self.step} has no input folder"
        return self.input_dir / name

    def input_files(self) -> list[DataFile]:
        """The recorded input files in ``core_first`` order."""
        return sorted(self.files, key=core_first)

    def input_paths(self) -> Iterator[Path]:
        """The paths of ``input_files``, made as they are read.

        Why: a list of 3,000 held 2.5 MB for the whole step.
        """
        return (self.input_path(f.name) for f in self.input_files())

    @property
    def crtdl_path(self) -> Path | None:
        value = self.facts.get("crtdl_path")
        return Path(value) if value else None

    def result(
        self, files: list[DataFile], folder: Path | None = None, **summary: Any
    ) -> StepResult:
        return StepResult(
            step=self.step,
            position=self.position,
            folder=str((folder or self.output_dir).relative_to(self.job_path)),
            files=files,
            summary=summary,
        )

    def cache_identity(self) -> JsonObject:
        """What a step's (and its files') results depend on: its input.

        Note: not the facts the job learns as it runs (a step that recorded an extraction handle
        must still find its finished files on ``continue``), nor where its settings come from
        (``continue --set`` that fixes a cause must not redo the finished files).
        """
        return self.model_dump(
            mode="json", exclude={"job_dir", "facts", "config_path", "overrides"}
        )

    def for_file_tasks(self, files: list[DataFile]) -> StepInput:
        """The step as a file task on ``files`` gets it: those as a digest (in its key).

        Why: the whole list in every file task's parameters made bookkeeping grow with the square of
        the files (0.5 s a task run at 5,000 files); its digest in every key made one changed file
        redo all the others.
        """
        return self.model_copy(
            update={"files": [], "files_digest": digest([asdict(f) for f in files])}
        )


class StepResult(StepRecord):
    """What a step task returns.

    Note: ``seconds`` is the wall time of the run that made it (None in results cached before it
    existed); ``cached`` is set by the flow for a cache hit.
    """

    files: list[DataFile] = []

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


_batch_settings: ContextVar[tuple[StepInput, Settings] | None] = ContextVar(
    "batch_settings", default=None
)
"""The settings a batch of files (``batch_task``) loaded once for all its files."""


def settings_of(step: StepInput) -> Settings:
    """Load the job's settings where the step runs, from the configuration it names.

    Why: cached per secret-free identity, so secrets never travel as task parameters.
    Note: within a batch of files, the batch's settings (loaded once).
    """
    if (held := _batch_settings.get()) and held[0] is step:
        return held[1]
    return cached_settings(step.config_path, step.overrides)


def digest(value: Any) -> str:
    """Digest ``json.dumps(value, sort_keys=True)``, hashed piece by piece as encoded.

    Why: made whole, the text of a step's 3,000 files was 2.3 MB of pieces at the flow's peak (the
    same digest, so the same keys).
    """
    hashed = hashlib.sha256()
    for piece in json.JSONEncoder(sort_keys=True, default=str).iterencode(value):
        hashed.update(piece.encode())
    return hashed.hexdigest()[:20]


def job_cache_key(context: TaskRunContext, parameters: JsonObject) -> str:
    """The result's path in the job directory (``result_name``)."""
    step: StepInput = parameters["step"]
    others = {name: value for name, value in parameters.items() if name != "step"}
    return str(
        JobPaths(step.job_path).results
        / result_name(
            step.job_id,
            step.position,
            step.step,
            context.task.name,
            digest([step.cache_identity(), others]),
        )
    )


def persisted_task(
    name: str, run_name: str, key: Callable[..., str] = job_cache_key, **options: Any
) -> Callable[[Callable[..., Any]], Any]:
    """Declare a task whose result is kept as JSON at the path its ``key`` names.

    Note: the storage root "/" lets the key choose (``stored_in_job`` narrows it); its exceptions
    leave redacted.
    """
    persisted = task(
        name=name,
        task_run_name=run_name,
        cache_policy=CacheKeyFnPolicy(cache_key_fn=key),
        persist_result=True,
        result_serializer="json",
        result_storage=Path("/"),
        **options,
    )
    return lambda function: persisted(persisting_redacted(function))


def step_task(name: str) -> Callable[[Callable[..., StepResult]], Any]:
    """Declare a step's task, cached in the job directory and timed (``seconds``).

    Note: its file work is shown as one progress artifact; its folder's temporary files are removed
    before and after (also on failure or interruption).
    """

    def declare(function: Callable[..., StepResult]) -> Any:
        @functools.wraps(function)
        def timed(step: StepInput) -> StepResult:
            started = time.monotonic()
            files = step.files
            work = StepWork(
                files=len(files),
                size=sum(f.size for f in files),
                lines=sum(f.resources for f in files),
            )
            remove_partial_files(step.output_dir)  # temporaries of a killed run: never resumed from
            try:
                with step_progress(step.artifact_key("progress"), step.step, work):
                    result = function(step)
            finally:
                remove_partial_files(step.output_dir)
            return result.model_copy(update={"seconds": round(time.monotonic() - started, 3)})

        return persisted_task(name, name + "[{step.number}]")(timed)

    return declare


def file_task(name: str, run_name: str) -> Callable[[Callable[..., R]], Any]:
    """Declare a per-file (or per-batch) sub-task.

    Note: ``run_name`` is a template over its parameters (``"pseudonymize[{name}]"``).
    """
    return lambda function: persisted_task(name, run_name)(stopped_when_flow_run_ends(function))


def batch_task(name: str, verb: str, each: Callable[..., R]) -> Any:
    """Declare the Prefect task over a batch of a step's files (``map_batches``).

    Note: it calls ``each(step, *args)`` for every file's ``args`` and caches their results, in
    order, as one result; its run is named ``verb[label]``.
    """

    def files_of_batch(step: StepInput, label: str, files: list[tuple[Any, ...]]) -> list[R]:
        return each_file(each, step, files)

    files_of_batch.__name__ = files_of_batch.__qualname__ = f"{each.__name__}_batch"
    files_of_batch.__module__ = each.__module__
    files_of_batch.__doc__ = f"A batch of ``{each.__name__}``."
    return file_task(name, verb + "[{label}]")(files_of_batch)


def each_file(each: Callable[..., R], step: StepInput, files: list[tuple[Any, ...]]) -> list[R]:
    """Call ``each(step, *args)`` for every file's ``args``, the settings loaded once.

    Why: a module function, so that a batch task pickled for a Dask worker refers to it by name.
    """
    held = _batch_settings.set((step, settings_of(step)))
    try:
        return [each(step, *args) for args in files]
    finally:
        _batch_settings.reset(held)


def persisting_redacted(function: Callable[..., R]) -> Callable[..., R]:
    """Wrap ``function``: its result written before its task ends, failures redacted.

    Why: Prefect puts an exception's text into the failed state's message and the failure's result
    record; what it logs of them is redacted (``redact_records_sent_to_prefect``).
    """

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> R:
        redact_records_sent_to_prefect()
        try:
            value = function(*args, **kwargs)
            persist_in_task(value)
            return value
        except Exception as exc:
            redact_exception(exc)
            raise

    return call


def redact_exception(exc: BaseException) -> None:
    """Redact ``exc``'s text in place, before Prefect makes a state message of it."""
    if (text := str(exc)) != (redacted := redact(text)):
        exc.args = (redacted,)
        if isinstance(exc, DupflowError):
            exc.message = redact(exc.message)


def commit_each(call: Callable[..., R], step: StepInput, *args: Any, **kwargs: Any) -> R:
    """Call a ``file_task``, committing its result when it ends, not with the step.

    Why: a run killed midway keeps every finished file. A cached result whose files are gone is made
    again (``files_gone``).
    Note: a list argument (a batch's files) is ``quote``d: Prefect would walk it twice looking for
    upstream results, some 1 KB per file. (Not on Dask, whose runner would hand the task the
    wrapper.)
    Why: the committed transaction forgets its task run's, which the step's transaction keeps to
    the step's end: its engine, with the batch's arguments (0.2 KB a file at the step's end).
    """
    with transaction(commit_mode=CommitMode.EAGER) as committed:
        if not isinstance(call, Task):
            return call(step, *args, **kwargs)
        given = [quote(arg) if isinstance(arg, list) else arg for arg in args]
        # a refreshed run is never a cache hit: the second pass ends the loop
        for refresh in (False, True):
            run: Task[..., R] = stored_in_job(call, step, refresh)
            state = run(step, *given, return_state=True, **kwargs)
            if not files_gone(state, step.output_dir):
                break
        result: R = state.result()
    committed.children.clear()  # a committed transaction never reads them again
    # The flow run's link from each item of a list result to its task (about 0.2 KB each, kept
    # for the whole run to find the upstream task of a value passed on): a step's files never are.
    if isinstance(result, list) and (flow_run := FlowRunContext.get()):
        for item in result:
            flow_run.run_results.pop(id(item), None)
    return result


def files_gone(state: State, folder: Path) -> bool:
    """Whether ``state`` is a cache hit naming a file ``folder`` no longer holds.

    Note: deleted, truncated or corrected files count. A ``StepResult``'s files are looked for in
    its own folder under the job directory.
    """
    if state.name != "Cached":
        return False
    result = state.result()
    if isinstance(result, StepResult):
        folder = folder / result.folder
    return not all(f.on_disk_in(folder) for f in data_files(result))


def data_files(value: Any) -> Iterator[DataFile]:
    if isinstance(value, DataFile):
        yield value
    elif isinstance(value, BaseModel | dict):  # a model iterates as its fields' (name, value) pairs
        yield from data_files(list(dict(value).values()))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from data_files(item)


def stored_in_job(call: C, step: StepInput, refresh: bool = False) -> C:
    """Make ``call`` (a task; a plain function as it is) store in the job's results.

    Why: Prefect writes a failure's record there under a random name, which the decorators' root
    ``/`` would put in the file system's root.
    Note: ``refresh`` runs it even where its record is kept.
    Note: ``JobResultStorage`` is set on the task, as Prefect's decorator refuses a storage block
    that is not saved on the server (a job's records belong to its folder, which must outlive any
    server's database); ``with_options`` takes the folder.
    """
    if not isinstance(call, Task):
        return call
    folder = JobPaths(step.job_path).results
    kept = call.with_options(result_storage=folder, refresh_cache=True if refresh else NotSet)
    kept.result_storage = JobResultStorage(basepath=str(folder))
    return cast(C, kept)
