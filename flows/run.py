"""The command line: ``python -m flows.run start|continue|status|list|…``.

Note: exit codes are in its help. See docs/development.md#the-command-line.
"""

import argparse
import gc
import logging
import re
import sys

# the engine alone: none of the imports below
if __name__ == "__main__" and sys.argv[1:2] == ["view"]:
    from flows.view_cli import main as view_main

    sys.exit(view_main(sys.argv[1:]))

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from config.errors import ConfigError
from config.fields import CONFIG_LOGGER
from config.keys import leaf_paths, secret_key_paths
from config.loader import (
    cached_settings,
    effective_config_rows,
    load_settings,
    refuse_secret_overrides,
)
from config.runtime import (
    apply_process_defaults,
    job_on_command_line,
    jobs_dir_of,
    prefect_api_url,
    CLI,
)
from config.settings import Settings
from flows import extraction_cli, housekeeping, prefect_server, server_cli, view_cli
from flows.api_watch import api_watched
from flows.job_state import (
    SCHEDULED_NAMES,
    find_job_dir,
    job_lock,
    newest_run,
    run_state,
    suspended_message,
)
from flows.jobs import (
    checked_attach,
    check_new_job,
    create_job_files,
    existing_job,
    refuse_extraction_flags_of_a_followed_url,
    refuse_no_job_id,
    step_file_problems,
)
from flows.run_logging import job_logging, take_interrupts
from flows.status_cli import cmd_list, cmd_status
from flows.terminal import Commands, command_group, print_stderr
from tasks.core.errors import UsageError
from tasks.core.json_shapes import JsonObject
from tasks.core.readable import plain_text
from tasks.core.redaction import redact
from tasks.job.layout import JobPaths
from tasks.job.record import COMPLETED, JobRecord, read_record

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
REPO_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_CONFIG = REPO_ROOT / "config" / "default.yaml"
EMBEDDED_CRTDL = REPO_ROOT / "config" / "sample-data" / "crtdl.json"
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections in a job's run (Python's: 700)
EXIT_CODES_HELP = f"""first try: {CLI} start   (the embedded sample job)
a command's own help: {CLI} COMMAND --help

exit codes: 0 done or paused for inspection; 1 job failed (fix the cause, then continue JOB);
2 usage or configuration error, or no Prefect API (nothing was run);
130 interrupted or cancelled (continue JOB resumes)"""
START_EXAMPLES = f"""examples, by the configuration's first step:
  the embedded sample job (local_import and flattening of bundled data):
    {CLI} start
  extractor, submitting a CRTDL:
    {CLI} start job.yaml crtdl.json
  local_import of the folder DATA, then flattening by a CRTDL:
    {CLI} start job.yaml crtdl.json --dir DATA
  local_import of the folder DATA (no flattening, no CRTDL):
    {CLI} start job.yaml DATA
  http_import of one NDJSON file:
    {CLI} start job.yaml https://host/Patient.ndjson"""
FLAG_KEYS = {  # a flag (its argparse attribute): the key it sets, and the step that reads that key
    "dir": ("services.local_import.dir", "local_import"),
    "anonymization_config": ("services.pseudonymizer.anonymization_config", "pseudonymizer"),
}


# the arguments several commands take (argparse copies a default list it appends to)
FLAGS: dict[str, dict[str, Any]] = {
    "job": {"help": "job id or job directory"},
    "--dir": {"help": "import directory (overrides services.local_import.dir)"},
    "--anonymization-config": {
        "help": "anonymization YAML (overrides services.pseudonymizer.anonymization_config)"
    },
    "--set": {
        "action": "append",
        "default": [],
        "metavar": "KEY=VALUE",
        "help": "override a non-secret key, e.g. retry.max_attempts=3 (repeatable)",
    },
    "--no-progress": {"action": "store_true", "help": "no progress bars or progress lines"},
    "--jobs-dir": {"help": "jobs directory (default: jobs_dir of APP_JOBS_DIR, else ./jobs)"},
    "--json": {"action": "store_true", "help": "one JSON document (docs/operations.md)"},
}


def main(argv: Sequence[str] | None = None) -> int:
    # before anything imports Prefect (its telemetry is decided there) or starts threads
    apply_process_defaults()
    return view_cli.dispatch(build_parser().parse_args(argv))


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=CLI,
        description="dupflow: FHIR research data pipeline",
        epilog=EXIT_CODES_HELP,
        formatter_class=raw,
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    start = commands.add_parser(
        "start", help="start a new job", epilog=START_EXAMPLES, formatter_class=raw
    )
    start.add_argument(
        "config", nargs="?", help="configuration YAML (default: the embedded sample job)"
    )
    start.add_argument(
        "input", nargs="?", help="a CRTDL file, a directory or a URL, depending on the import step"
    )
    add_flags(start, "--dir", "--anonymization-config", "--set", "--no-progress")
    start.set_defaults(command=cmd_start)
    register_continue(commands)
    status = commands.add_parser("status", help="show a job's steps, files and state")
    add_flags(status, "job", "--jobs-dir", "--json")
    status.set_defaults(command=cmd_status)
    listing = commands.add_parser("list", help="list jobs, newest first")
    add_flags(listing, "--jobs-dir", "--json")
    listing.set_defaults(command=cmd_list)
    config_commands = command_group(commands, "config", "configuration commands")
    check = config_commands.add_parser(
        "check", help="validate a configuration and show every effective value"
    )
    check.add_argument("config", help="configuration YAML")
    add_flags(check, "--dir", "--anonymization-config", "--set")
    check.set_defaults(command=cmd_config_check)
    for module in (extraction_cli, view_cli, server_cli, housekeeping):
        module.register(commands)
    return parser


def register_continue(commands: Commands) -> None:
    """Add ``continue``: resume a job, settle an extraction in doubt, note a gate."""
    resume = commands.add_parser("continue", help="resume a paused, failed or interrupted job")
    add_flags(resume, "job", "--jobs-dir", "--no-progress")
    resume.add_argument(
        "--set", **FLAGS["--set"] | {"help": "replace a non-secret key for this job"}
    )
    in_doubt = resume.add_mutually_exclusive_group()
    in_doubt.add_argument(
        "--attach",
        metavar="STATUS_URL",
        help="follow this extraction (after a submission in doubt)",
    )
    in_doubt.add_argument(
        "--resubmit",
        action="store_true",
        help="submit the extraction anew (after a submission in doubt)",
    )
    resume.add_argument(
        "--note",
        default="continued from the command line",
        help="the inspection note (the gate form's answer)",
    )
    resume.set_defaults(command=cmd_continue)


def add_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    for name in names:
        parser.add_argument(name, **FLAGS[name])


def overrides_from_flags(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """The flags as (key → raw value, key → flag label); a secret is refused.

    Why: the flags end up in the flow run's parameters.
    Note: a key without a label was set by ``--set``, as the configuration's loader names it.
    """
    overrides, labels = dict[str, str](), dict[str, str]()
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not (key := key.strip()):
            raise UsageError(
                f"--set {item!r}: write it as KEY=VALUE, e.g. --set retry.max_attempts=3"
            )
        overrides[key] = value
    refuse_secret_overrides(overrides, "--set")
    for attr, (key, _) in FLAG_KEYS.items():
        if (value := getattr(args, attr, None)) is not None:
            overrides[key] = value
            labels[key] = f"--{attr.replace('_', '-')}"
    return overrides, labels


def refuse_flags_no_step_reads(settings: Settings, labels: dict[str, str]) -> None:
    """Refuse a flag of ``FLAG_KEYS`` given to a pipeline without its step.

    Why: it would be ignored without a word.
    """
    for key, step in FLAG_KEYS.values():
        if (label := labels.get(key)) and step not in settings.pipeline.enabled_steps:
            raise UsageError(
                f"{label} sets {key}, but pipeline.enabled_steps has no {step} step, which is "
                f"what reads it; add {step} to pipeline.enabled_steps, or leave {label} out"
            )


def cmd_config_check(args: argparse.Namespace) -> int:
    overrides, labels = overrides_from_flags(args)
    prefect_server.use_server_for(args.config)
    # Its warnings are printed below the table, not logged (Python's last-resort handler prints each
    # bare)
    config_logger = logging.getLogger(CONFIG_LOGGER)
    config_logger.disabled = True
    try:
        loaded = load_settings(args.config, overrides=overrides, override_labels=labels)
    finally:
        config_logger.disabled = False
    if problems := step_file_problems(loaded.settings):
        raise ConfigError(problems)
    refuse_flags_no_step_reads(loaded.settings, labels)
    rows = effective_config_rows(loaded)
    width = max(len(key) for key, _, _ in rows)
    for key, value, source in rows:
        print(f"{key:<{width}}  {value}  ({source})")
    for warning in loaded.warnings:
        print_stderr(f"warning: {warning}")
    print_stderr("configuration OK")
    return EXIT_OK


def cmd_start(args: argparse.Namespace) -> int:
    overrides, labels = overrides_from_flags(args)
    config_path, job_input = args.config, args.input
    if config_path is None:
        config_path, job_input = str(EMBEDDED_CONFIG), str(EMBEDDED_CRTDL)
    prefect_server.use_server_for(config_path)
    try:  # the read the job's preparation uses (``cached_settings``: same file, same overrides)
        settings = cached_settings(config_path, overrides)
    except ConfigError:  # read once more, only to name the flag that set a wrong value in the error
        load_settings(config_path, overrides=overrides, override_labels=labels)
        raise
    refuse_flags_no_step_reads(settings, labels)
    # a bad input is refused before a server is started for it
    job, effective = check_new_job(config_path, job_input, overrides)
    prefect_server.use_server()  # a dead PREFECT_API_URL stops here, before a job exists
    create_job_files(job, effective)
    print(f"job {job.job_id}: {job.paths.job_dir}")
    return run_job(job.paths, args.no_progress, None)


def cmd_continue(args: argparse.Namespace) -> int:
    """Resume a job, locked before anything is written.

    Note: of two at once the second exits 2 and records nothing.
    """
    overrides, _ = overrides_from_flags(args)
    checked_attach(args.attach, "--attach")
    paths = JobPaths(find_job_dir(args.job, jobs_dir_of(args.jobs_dir)))
    with job_lock(paths):
        job = read_record(paths.job_dir)
        # before a flow run exists
        refuse_extraction_flags_of_a_followed_url(job, args.attach, args.resubmit)
        prefect_server.use_server()  # the job's state is its flow run's there
        run = newest_run(paths)
        state = run_state(run)
        if run and run.get("work_pool_name") and state in SCHEDULED_NAMES:
            raise UsageError(
                f"job {job.job_id}: its deployment run is {state} on the server: a worker takes "
                "it up"
            )
        if state == COMPLETED and not overrides:
            print(
                f"job {job.job_id} is already completed; nothing to do (outputs in {paths.job_dir})"
            )
            return EXIT_OK
        refuse_no_job_id(job.job_id)  # a damaged job.json's
        existing_job(paths, overrides, "--set")  # --set checked, then stored
        print(f"job {job.job_id}: continuing in {paths.job_dir}")
        continuing = {"note": args.note, "attach": args.attach, "resubmit": args.resubmit}
        return run_job(paths, args.no_progress, continuing)


def run_job(paths: JobPaths, no_progress: bool, continuing: JsonObject | None) -> int:
    """Run the job's flow run here; say its outcome in one line.

    Note: ``continuing`` holds a ``continue``'s parameters.
    """
    job = read_record(paths.job_dir)
    from tasks.streams.progress import use_display

    use_display("none" if no_progress else "bar" if sys.stderr.isatty() else "log")
    take_interrupts()  # SIGTERM as Ctrl+C: a KeyboardInterrupt
    try:
        with job_logging(paths.log_file), api_watched(paths, prefect_api_url()):
            state = run_flow(job, paths, continuing)
    except KeyboardInterrupt:
        print_stderr(
            f"interrupted; resume with: {CLI} continue {job_on_command_line(paths.job_dir)}"
        )
        return EXIT_INTERRUPTED
    return report_outcome(paths, state)


def run_flow(job: JobRecord, paths: JobPaths, continuing: JsonObject | None) -> Any:
    """The job's flow run made or found, then run here.

    Note: every Prefect call of this process goes through one client (a new one costs a TLS
    context and a version check: 16 ms and a request each)."""
    from prefect.context import SyncClientContext
    from prefect.exceptions import TerminationSignal

    from flows import job_runs
    from flows.heartbeats import ensure_crash_detection

    with SyncClientContext.get_or_create():
        ensure_crash_detection()  # before the run's first heartbeat; the flow says why it could not
        # from its job.json alone; its jobs_dir is where this command found it
        parameters = dict(
            job_id=job.job_id,
            config_path=job.config_path,
            job_input=job.job_input,
            overrides={**job.overrides, "jobs_dir": str(paths.job_dir.parent)},
        )
        made = job_runs.new_job_run if continuing is None else job_runs.continued_job_run
        run = made(job.job_id, paths, parameters)
        end_start_up()
        try:  # a continue's flags for this execution alone: never stored with the run
            return job_runs.execute(run, parameters | (continuing or {}))
        except TerminationSignal as exc:
            raise KeyboardInterrupt from exc


def report_outcome(paths: JobPaths, state: Any) -> int:
    """Say how the run ended: where the data went, how to go on, or cause and fix."""
    job_ref = job_on_command_line(paths.job_dir)
    if state is None:
        print_stderr(
            f"job {paths.job_id} stopped: its flow run was deleted on the Prefect server; the job "
            f"folder is kept, and {CLI} continue {job_ref} makes a new run from it"
        )
        return EXIT_FAILED
    if state.is_completed() or state.is_paused():
        details = state.state_details
        paused = suspended_message(details.pause_key, details.pause_timeout, paths.job_dir)
        said = paused if state.is_paused() else state.message
        print(f"{state.name}: {plain_text(said)}" if said else state.name)
        print(f"job directory: {paths.job_dir}")
        return EXIT_OK
    if state.is_cancelled():
        said = plain_text(state.message or "cancelled")
        print_stderr(f"job {paths.job_id} {said}; resume with: {CLI} continue {job_ref}")
        return EXIT_INTERRUPTED
    cause = plain_text(failure_text(state))
    print_stderr(f"job {paths.job_id} failed: {cause}")
    print_stderr(f"full log: {paths.log_file}")
    print_stderr(f"after fixing the cause, resume with: {CLI} continue {job_ref}")
    if key := setting_named_in(cause):
        print_stderr(f"or change {key} for this job: {CLI} continue {job_ref} --set {key}=VALUE")
    return EXIT_FAILED


def failure_text(state: Any) -> str:
    """What ended the run: its exception as ``Type: text``, else the state's message."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - a result that cannot be read leaves the message
        exc = None
    return redact(
        f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else state.message or ""
    )


def setting_named_in(message: str) -> str | None:
    """The first non-secret setting a failure's message names.

    Why: its fix may be another value for this job.
    """
    secret = secret_key_paths()
    named = [
        (found.start(), key)
        for key in leaf_paths()
        if key not in secret
        and (found := re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", message))
    ]
    return min(named)[1] if named else None


def end_start_up() -> None:
    """Turn the collector on again over a frozen heap (``run_as_program`` stopped it)."""
    if not gc.isenabled():
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
        gc.enable()


def run_as_program() -> int:
    """``main`` as the process's life (not in ``main``: tests call that in-process).

    Why: start-up builds some 150,000 objects that live until exit; Python's collector walked
    them while they were built (0.2-0.5 s) and at shutdown, once per batch of modules (0.6-2 s).
    So it is off until a job's run starts (``end_start_up``), and the heap frozen before exit.
    Memory does not grow: the data paths stream through few, short-lived objects."""
    gc.disable()
    try:
        return main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    sys.exit(run_as_program())
