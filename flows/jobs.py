"""Jobs: planned, made and found again for every entry point (``prepare_job``).

Import-light: ``status`` uses it. See docs/development.md#jobs.
"""

import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from config.loader import (
    PATH_KEYS,
    absolute_path_overrides,
    cached_settings,
    refuse_secret_overrides,
)
from config.settings import Settings
from flows.job_crtdl import EffectiveCrtdl, crtdl_input, effective_crtdl, no_crtdl_message
from flows.job_state import job_lock
from tasks.core.errors import JobError
from tasks.core.json_shapes import JsonObject
from tasks.core.names import invisible_character, invisible_character_problem, show_text
from tasks.core.jsonfile import settings_file_problem
from config.runtime import CLI
from tasks.core.readable import plain_text
from tasks.job.layout import JobPaths, is_job_id, is_result_url
from tasks.streams.files import write_error, write_file_atomically
from tasks.job.record import JobRecord, changing_record, read_record, record_facts
from tasks.core.url_credentials import refuse_credentials_in_url, shown_url, split_url

# a continue's own parameters: for one execution of the run (``forget_continue_flags``)
CONTINUING = ("note", "attach", "resubmit")


@dataclass(frozen=True)
class Job:
    paths: JobPaths
    record: JobRecord
    settings: Settings

    @property
    def job_id(self) -> str:
        return self.paths.job_id


def prepare_job(
    job_id: str | None,
    config_path: str | None,
    job_input: str | None,
    overrides: Mapping[str, str] | None,
    *,
    overrides_source: str = "the flow's overrides parameter",
    must_exist: bool = False,
) -> Job:
    """Make a new job, or find the existing one with ``job_id``: a flow run's.

    Note: an existing job must be given its own inputs (``refuse_other_inputs``); ``continue``
    changes them (``existing_job``). ``overrides_source`` names the overrides' origin (the flow's
    parameter unless told) in the error refusing a secret among them; with ``must_exist``,
    ``job_id`` names a job to continue, never one to make.
    """
    overrides = dict(overrides or {})
    refuse_secret_overrides(overrides, overrides_source)
    if job_id:
        refuse_no_job_id(job_id)
    settings = cached_settings(config_path, overrides, overrides_source)
    job_id = job_id or str(uuid.uuid4())
    paths = JobPaths(Path(settings.jobs_dir).resolve() / job_id)
    if paths.job_file.is_file():
        refuse_other_inputs(read_record(paths.job_dir), config_path, job_input, overrides)
        return existing_job(paths, {}, overrides_source)
    # a job id given to continue: a new job of that id would be another job under its name
    if must_exist:
        of = config_path or "the default configuration"
        raise JobError(
            f"no job {job_id} in {paths.job_dir.parent} (the jobs_dir of {of}); give the "
            "configuration the job was started with, or leave the job id empty for a new job"
        )
    job, effective = new_job_plan(paths, config_path, job_input, overrides, settings)
    create_job_files(job, effective)
    return job


def refuse_no_job_id(job_id: str) -> None:
    """Refuse a job id that is no UUID.

    Why: it names the job's directory; ``..`` or a path would leave jobs_dir.
    """
    if not is_job_id(job_id):
        raise JobError(
            f"{show_text(job_id)} is not a job id (a UUID, as start makes it); give the id of an "
            "existing job, or none to make a new one"
        )


def existing_job(paths: JobPaths, overrides: Mapping[str, str], overrides_source: str) -> Job:
    """Find a job again; ``overrides`` replace its frozen ones ("fix and continue").

    Note: they are checked before they are stored, their paths frozen absolute as at ``start``.
    """
    record = read_record(paths.job_dir)
    refuse_unshowable_settings(record)
    changed = {**record.overrides, **overrides, "jobs_dir": str(paths.job_dir.parent)}
    settings = cached_settings(record.config_path, changed, overrides_source)
    refuse_other_steps(record, settings)
    if overrides:
        changed |= {
            key: path for key, path in absolute_path_overrides(settings).items() if key in overrides
        }
        settings = cached_settings(record.config_path, changed)
        # never a job another process works on
        with job_lock(paths), changing_record(paths.job_dir) as record:
            record.overrides = changed
    record.overrides = changed
    return Job(paths, record, settings)


def refuse_other_inputs(
    record: JobRecord, config_path: str | None, job_input: str | None, overrides: Mapping[str, str]
) -> None:
    """Refuse a flow run's parameters that give other inputs than ``job.json``.

    Why: anyone who may edit a flow run on the server could otherwise change what the operator's
    next ``continue`` does (a service URL, and its credentials with it); ``continue --set`` is the
    way.
    """
    given = flat_inputs(
        {"config_path": config_path, "job_input": job_input, "overrides": overrides}
    )
    recorded = flat_inputs(record.model_dump())  # more than its inputs: only given ones are read
    paths = {"config_path", "job_input", *(f"overrides.{key}" for key in PATH_KEYS)}
    # jobs_dir: where the job was found
    differing = [
        key
        for key, value in given.items()
        if value
        and key != "overrides.jobs_dir"
        and value != recorded.get(key)
        and not (key in paths and frozen_input(value) == recorded.get(key))
    ]
    if differing:
        raise JobError(
            f"job {record.job_id}: its flow run's parameters differ from its job.json in "
            f"{', '.join(plain_text(key) for key in differing)}; a job runs with the inputs it "
            f"was started with: {CLI} continue {record.job_id} runs it with them, --set KEY=VALUE "
            "changes one"
        )


def flat_inputs(parameters: JsonObject) -> JsonObject:
    """A run's job inputs by name, each override as ``overrides.KEY``.

    Note: a continue's own inputs are left out.
    """
    flat = {
        key: value for key, value in parameters.items() if key not in (*CONTINUING, "overrides")
    }
    overrides = parameters.get("overrides")
    return flat | {f"overrides.{key}": value for key, value in dict(overrides or {}).items()}


def frozen_input(job_input: str) -> str:
    """A job input as recorded: a URL as given, a path absolute with ``~`` expanded."""
    return job_input if "://" in job_input else str(Path(job_input).expanduser().resolve())


def refuse_unshowable_settings(record: JobRecord) -> None:
    """Refuse a configuration path or override holding an invisible character.

    Why: the loader's messages show them as they are; one from a damaged ``job.json`` is refused
    first, shown escaped, so it never reaches a terminal raw.
    """
    for field, text in [
        ("config_path", record.config_path or ""),
        *(("overrides", f"{key}={value}") for key, value in record.overrides.items()),
    ]:
        if problem := invisible_character_problem(text):
            shown = show_text(text, None)
            raise JobError(
                f"job {record.job_id}: {field} {shown} in its job.json {problem}; correct it, or "
                "start anew"
            )


def refuse_other_steps(record: JobRecord, settings: Settings) -> None:
    """Refuse a step list changed since the start.

    Why: it would skip or add steps on data that went through the others.
    """
    now = settings.pipeline.enabled_steps
    if record.enabled_steps and now != record.enabled_steps:
        raise JobError(
            f"job {record.job_id} was started with pipeline.enabled_steps "
            f"[{', '.join(record.enabled_steps)}], the configuration now says [{', '.join(now)}]; "
            "a job runs the steps it started with: put the list back to continue it, or start a "
            "new job for the new steps"
        )


def refuse_invisible_url_characters(url: str | None, door: str) -> None:
    """Refuse a stored and shown URL with a control, bidi or line-separator character.

    Why: such a character (Unicode Cc, Cf, Zl, Zp) would show another address or forge a line; it is
    named by its code, never shown.
    """
    if url is not None and (found := invisible_character(url)):
        kind, code = found
        raise JobError(
            f"{door} contains the {kind} {code}, which no URL may have: it would not show as what "
            "it is in the job's record, status and logs; retype the URL without it"
        )


def checked_attach(attach: str | None, door: str = "attach") -> None:
    """Check ``attach`` is an extraction's http(s) status URL without credentials.

    Why: a form takes any text.
    Note: ``door`` names where it was given (``continue --attach``, the flow's ``attach``).
    """
    refuse_invisible_url_characters(attach, door)
    refuse_credentials_in_url(
        attach,
        door=door,
        fix="give the status URL without them; the credentials come from services.extractor.auth",
        tokens=True,
    )
    if attach is not None and split_url(attach).scheme.lower() not in ("http", "https"):
        raise JobError(
            f"{door}: {shown_url(attach)!r} is not an http(s) status URL; give the URL the "
            "extraction server's kick-off answered with (its Content-Location), as status and "
            "extraction list show it"
        )


def refuse_extraction_flags_of_a_followed_url(
    record: JobRecord, attach: str | None, resubmit: bool
) -> None:
    """Refuse ``--attach`` and ``--resubmit`` for a job started with a status URL.

    Why: such a job follows that extraction: it has no submission to settle, and the extraction
    (maybe another job's) is not its to cancel as a replaced one.
    """
    if (
        (attach or resubmit)
        and "extractor" in record.enabled_steps
        and is_result_url(record.job_input)
    ):
        flag = "--attach" if attach else "--resubmit"
        # a damaged record's host may hold escape sequences
        url = shown_url(plain_text(record.job_input))
        raise JobError(
            f"job {record.job_id} follows the extraction at the status URL it was started with "
            f"({url}); {flag} applies to a job that submits its CRTDL. Continue it without the "
            "flag, or start a new job with the other status URL or a CRTDL as its input"
        )


def check_new_job(
    config_path: str | None, job_input: str | None, overrides: Mapping[str, str]
) -> tuple[Job, EffectiveCrtdl | None]:
    """Plan a new job, every check made, writing nothing (``create_job_files`` does).

    Why: ``start`` refuses a bad input before it starts a Prefect server.
    """
    settings = cached_settings(config_path, overrides)
    paths = JobPaths(Path(settings.jobs_dir).resolve() / str(uuid.uuid4()))
    return new_job_plan(paths, config_path, job_input, overrides, settings)


def new_job_plan(
    paths: JobPaths,
    config_path: str | None,
    job_input: str | None,
    overrides: Mapping[str, str],
    settings: Settings,
) -> tuple[Job, EffectiveCrtdl | None]:
    """Plan the new job and its CRTDL, every check made, nothing written yet.

    Note: a bad input raises ``JobError``.
    """
    refuse_unstorable_names(config_path, job_input, settings)
    config_path = str(Path(config_path).resolve()) if config_path else None
    job_input = job_input and frozen_input(job_input)
    frozen = {
        **overrides,
        **absolute_path_overrides(settings),
        "jobs_dir": str(paths.job_dir.parent),
    }
    steps = list(settings.pipeline.enabled_steps)
    crtdl = crtdl_input(steps, job_input)
    if "flattening" in steps and crtdl is None:  # spec rule 3: flattening needs a CRTDL
        raise JobError(no_crtdl_message(job_input))
    refuse_missing_input(steps, job_input, settings)
    if problems := step_file_problems(settings):
        raise JobError("; ".join(problems))
    # The CRTDL is read (and enriched) before anything is written: a bad one leaves no job behind.
    effective = effective_crtdl(crtdl, settings) if crtdl is not None else None
    record = JobRecord(
        job_id=paths.job_id,
        config_path=config_path,
        job_input=job_input,
        overrides=frozen,
        enabled_steps=steps,
    )
    return Job(paths, record, settings), effective


def refuse_unstorable_names(
    config_path: str | None, job_input: str | None, settings: Settings
) -> None:
    """Refuse URLs with hidden characters or credentials, and undecodable paths."""
    door = "the job input (INPUT)"
    if job_input and "://" in job_input:
        refuse_invisible_url_characters(job_input, door)
    fix = (
        "give the URL without them (an extraction's result URL is fetched with "
        "services.extractor.auth); a file that needs them for http_import: download it yourself "
        "and import its folder with local_import"
    )
    # stored with the job and as a parameter
    refuse_credentials_in_url(job_input, door=door, fix=fix, tokens=True)
    paths = {
        "the configuration file": config_path,
        "the job input": job_input,
        "--dir": settings.services.local_import.dir,
    }
    for what, path in paths.items():  # not valid UTF-8 (a Latin-1 folder name): no record stores it
        try:
            str(path or "").encode("utf-8")
        except UnicodeEncodeError:
            raise JobError(
                f"{what} {show_text(path, None)} is not valid UTF-8; rename it; no job was made"
            ) from None


def create_job_files(job: Job, effective: EffectiveCrtdl | None) -> None:
    """Write the new job's directory, ``job.json`` and CRTDL.

    Note: one that cannot be written (a full disk) removes the directory again, so no half-made job
    is left to be continued.
    """
    paths = job.paths
    try:
        paths.job_dir.mkdir(parents=True)
    except OSError as exc:
        raise write_error(exc, paths.job_dir) from None
    try:
        with changing_record(paths.job_dir, new=job.record):
            pass
        # recorded as ``crtdl_path`` for every step that needs it
        if effective is not None:
            target = paths.job_dir / effective.name
            write_file_atomically(target, effective.data)
            warnings = effective.warnings or None
            record_facts(
                paths.job_dir,
                crtdl_path=str(target),
                crtdl_source=str(effective.source),
                crtdl_warnings=warnings,
            )
    except OSError:
        shutil.rmtree(paths.job_dir, ignore_errors=True)
        raise


NEEDED_INPUT = {
    "extractor": "the extractor step needs a CRTDL file (or a complete result URL) as INPUT: "
    f"{CLI} start CONFIG CRTDL",
    "http_import": f"http_import needs the URL of an NDJSON file as INPUT: {CLI} start CONFIG URL",
}


def refuse_missing_input(steps: list[str], job_input: str | None, settings: Settings) -> None:
    """Refuse an import step without its input, before the job exists.

    Note: the local_import directory counts as its input.
    Why: the job input is frozen, so the step would fail on every continue.
    """
    if steps[0] in NEEDED_INPUT and not job_input:
        raise JobError(f"{NEEDED_INPUT[steps[0]]}; no job was made")
    if steps[0] != "local_import":
        return
    from tasks.local_import import LocalImportError, source_directory

    try:
        source_directory(job_input, settings.services.local_import.dir)
    except LocalImportError as exc:  # it says how to give the right one
        raise JobError(f"{exc}; no job was made") from None


def step_file_problems(settings: Settings) -> list[str]:
    """Find problems of files the enabled steps will read, before any work starts.

    Why: a typo found only by the pseudonymizer step comes after hours of extraction.
    """
    anonymization = settings.services.pseudonymizer.anonymization_config
    problems = [
        f"{key}: {problem}"
        for key, path, read in (
            (
                "services.pseudonymizer.anonymization_config",
                anonymization,
                "pseudonymizer" in settings.pipeline.enabled_steps,
            ),
            ("tls.ca_cert_path", settings.tls.ca_cert_path, True),
        )
        # ``~`` as the job reads it: its paths are frozen expanded (``absolute_path_overrides``)
        if path and (problem := settings_file_problem(Path(path).expanduser(), must_exist=read))
    ]
    lookup = settings.services.flattening.lookup_path
    if "flattening" not in settings.pipeline.enabled_steps or not lookup:
        return problems
    from tasks.sof.lookup import lookup_problems

    return problems + [
        f"services.flattening.lookup_path: {problem}; fix the lookup file"
        for problem in lookup_problems(Path(lookup))
    ]
