"""``extraction …`` and ``cohort preview``: the extraction server by command.

See docs/development.md#extraction-commands.
"""

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config.errors import ConfigError
from config.loader import load_settings
from config.runtime import jobs_dir_of
from flows import prefect_server
from flows.terminal import Commands, command_group, print_stderr
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_documents import (
    BASE_URL_SETTING,
    ExtractionError,
    InvalidCrtdlError,
    parse_crtdl,
)
from tasks.clients.extraction_jobs import (
    JOB_STATUSES,
    ExtractionJob,
    ExtractionTaskClient,
    SearchRejectedError,
)
from tasks.job.layout import is_job_id
from tasks.job.record import read_facts
from tasks.core.errors import UsageError
from tasks.core.names import SHOWN_NAME_CHARS, show_text
from tasks.core.readable import counted, plain_text
from tasks.core.url_credentials import CredentialsInUrlError, shown_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
CONTROLS = {  # an operation: its help, what it did, why it changed nothing
    "pause": ("pause a running job", "paused", "already paused"),
    "resume": ("resume a paused job", "resumed", "already running"),
    "cancel": ("cancel a job", "cancelled", "already cancelled"),
    # said with the level it has now
    "priority": ("raise or lower a job's priority", "priority set to", "priority already"),
}


def register(commands: Commands) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "config", help="configuration YAML (services.extractor: base_url, auth; tls; retry)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable JSON output")
    register_extraction(commands, common)
    # cohort preview: how many patients a CRTDL selects
    cohort_sub = command_group(commands, "cohort", "cohort commands")
    preview = cohort_sub.add_parser(
        "preview", parents=[common], help="how many patients a CRTDL selects"
    )
    preview.add_argument("crtdl", help="CRTDL (or bare CCDL) JSON file")
    preview.add_argument("--ids", action="store_true", help="also print the patient ids")
    preview.set_defaults(command=command(cmd_cohort_preview))


def register_extraction(
    commands: Commands,
    common: argparse.ArgumentParser,
) -> None:
    """Add ``extraction``: list, show, the controls, priority, delete."""
    job_ref = argparse.ArgumentParser(add_help=False)
    job_ref.add_argument("job", metavar="ID-or-JOB", help="extraction job id, or a dupflow job id")
    job_ref.add_argument(
        "--jobs-dir", help="where dupflow jobs live (default: APP_JOBS_DIR, else ./jobs)"
    )
    sub = command_group(commands, "extraction", "see and steer jobs on the extraction server")

    listing = sub.add_parser("list", parents=[common], help="jobs on the extraction server")
    listing.add_argument(
        "--status", help=f"comma-separated job statuses ({', '.join(JOB_STATUSES)})"
    )
    listing.add_argument("--id", help="comma-separated extraction job ids")
    listing.add_argument(
        "--strict",
        action="store_true",
        help="kept for scripts: the server always rejects unknown or invalid values",
    )
    listing.set_defaults(command=command(cmd_list))

    on_a_job = {
        "show": ("one job: progress and consent audit files", cmd_show),
        **{operation: (text, cmd_control) for operation, (text, _, _) in CONTROLS.items()},
        "delete": ("delete a job and its result files", cmd_delete),
    }
    for operation, (text, handler) in on_a_job.items():
        each = sub.add_parser(operation, parents=[common, job_ref], help=text)
        each.set_defaults(command=command(handler), operation=operation)
    sub.choices["priority"].add_argument("level", choices=("high", "normal"))
    sub.choices["delete"].add_argument(
        "--yes", action="store_true", help="do not ask for confirmation"
    )


def command(
    handler: Callable[[argparse.Namespace, ExtractionTaskClient], int],
) -> Callable[[argparse.Namespace], int]:
    """Load the configuration, open the client, run ``handler``; map failures to exits."""

    def run(args: argparse.Namespace) -> int:
        server = None
        try:
            with open_client(args.config) as client:
                server = client.base_url
                return handler(args, client)
        except (ConfigError, UsageError, InvalidCrtdlError, OSError) as exc:
            return fail(args, str(exc), EXIT_USAGE)
        except SearchRejectedError as exc:
            problems = "\n".join(f"  - {problem}" for problem in exc.problems)
            return fail(
                args,
                f"the extraction server rejected the search:\n{problems}",
                EXIT_USAGE,
                exc.problems,
            )
        except ServiceError as exc:
            return fail(args, service_failure_text(exc, server), EXIT_FAILED)
        # about what the server sent: plain, as its words
        except (ExtractionError, CredentialsInUrlError) as exc:
            return fail(args, plain_text(exc), EXIT_FAILED)

    return run


def service_failure_text(exc: ServiceError, server: str | None) -> str:
    """The failure in the client's words.

    Note: when no answer came at all, also which server was asked and how to point at another,
    unless the client's error says so already (a connection not made).
    """
    if not exc.no_answer or server is None or BASE_URL_SETTING in str(exc):
        return str(exc)
    return (
        f"{exc}; no answer from the extraction server at {shown_url(server)}: check that it runs "
        "there, or set services.extractor.base_url to its address"
    )


def open_client(config_path: str) -> ExtractionTaskClient:
    prefect_server.use_server_for(config_path)
    loaded = load_settings(config_path)
    for warning in loaded.warnings:
        print_stderr(f"warning: {warning}")
    settings = loaded.settings
    if not settings.services.extractor.base_url:
        raise UsageError(
            f"{config_path}: services.extractor.base_url is not set; set it to the extraction "
            "server"
        )
    return ExtractionTaskClient(settings.services.extractor, settings.tls, settings.retry)


def fail(
    args: argparse.Namespace, message: str, code: int, problems: list[str] | None = None
) -> int:
    if args.json:
        print_json({"ok": False, "error": message} | ({"problems": problems} if problems else {}))
    print_stderr(f"error: {message}")
    return code


def print_json(document: Any) -> None:
    print(json.dumps(document, indent=2))


def extraction_job_id(args: argparse.Namespace) -> str:
    """The extraction job id ``args.job`` names.

    Note: a dupflow job id resolves to the one recorded in its facts.
    """
    ref: str = args.job
    job_dir = jobs_dir_of(args.jobs_dir) / ref
    if not is_job_id(ref) or not job_dir.is_dir():
        return ref
    if not (recorded := read_facts(job_dir).get("extraction_job_id")):
        raise UsageError(
            f"dupflow job {ref} has no extraction job yet (no extraction_job_id in "
            f"{job_dir / 'job.json'})"
        )
    return str(recorded)


def cmd_list(args: argparse.Namespace, client: ExtractionTaskClient) -> int:
    statuses = [s.strip().upper() for s in (args.status or "").split(",") if s.strip()]
    ids = [i.strip() for i in (args.id or "").split(",") if i.strip()]
    # Always strict: a filter value the server ignored would list every job (a typo'd --status
    # CANCELED too).
    jobs = client.search(ids, statuses, strict=True)
    if args.json:
        print_json({"jobs": [job.as_json() for job in jobs]})
        return EXIT_OK
    if not jobs:
        print(f"no extraction jobs{' match' if ids or statuses else ' on the server'}")
        return EXIT_OK
    print_table(
        ("ID", "STATUS", "PRIORITY", "BATCHES", "COHORT", "AGE"),
        [
            (
                job.id,
                job.status,
                job.priority,
                batches_text(job),
                job.cohort_size,
                age(job.authored_on),
            )
            for job in jobs
        ],
    )
    return EXIT_OK


def cmd_show(args: argparse.Namespace, client: ExtractionTaskClient) -> int:
    task = client.read_task(extraction_job_id(args))
    job = ExtractionJob.from_task(task)
    if args.json:
        print_json(job.as_json() | {"task": task})
        return EXIT_OK
    print(f"extraction job {shown(job.id)}")
    print(f"  status:    {shown(job.status)}")
    print(f"  priority:  {job.priority}")
    print(f"  version:   {shown(job.version)}")
    print(f"  submitted: {shown(job.authored_on)} ({age(job.authored_on)})")
    print(f"  updated:   {shown(job.last_updated)}")
    if job.cohort_size is None:
        print("  progress:  not known before the cohort query has finished")
    else:
        print(f"  cohort:    {job.cohort_size} patients, batch size {shown(job.batch_size)}")
        print(f"  batches:   {batches_text(job)} done, {len(job.active_batches)} active")
        for batch_id, stage in job.active_batches:
            print(f"    {shown(batch_id)}  {shown(stage or 'starting')}")
    if job.consent_audit_files:
        print(f"  consent audit files ({len(job.consent_audit_files)}):")
        for url in job.consent_audit_files:
            print(f"    {shown(url, None)}")
    return EXIT_OK


def cmd_control(args: argparse.Namespace, client: ExtractionTaskClient) -> int:
    job_id, operation = extraction_job_id(args), args.operation
    result = (
        client.set_priority(job_id, args.level)
        if operation == "priority"
        else client.control(job_id, operation)
    )
    job = result.job
    if args.json:
        print_json(
            {"ok": True, "operation": operation, "changed": result.changed, "job": job.as_json()}
        )
    else:
        _, done, already = CONTROLS[operation]
        verb = done if result.changed else already
        level = f" {job.priority}" if operation == "priority" else ""
        print(f"extraction job {shown(job.id)}: {verb}{level} (status {shown(job.status)})")
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, client: ExtractionTaskClient) -> int:
    job_id = extraction_job_id(args)
    answer = args.yes or confirm(
        f"Delete extraction job {shown(job_id)} and its result files on {client.base_url}?"
    )
    if answer is None:
        message = (
            f"no answer: extraction job {shown(job_id)} was not deleted (--yes deletes without "
            "asking)"
        )
        return fail(args, message, EXIT_FAILED)
    if answer:  # else the person said no: nothing went wrong
        client.delete(job_id)
    outcome = "deleted; the server removes its result files" if answer else "nothing deleted"
    if args.json:
        print_json(
            {"ok": True, "operation": "delete", "job_id": job_id}
            | ({} if answer else {"deleted": False})
        )
    else:
        print(f"extraction job {shown(job_id)}: {outcome}")
    return EXIT_OK


def confirm(question: str) -> bool | None:
    """Ask on the terminal; anything but y/yes is a no.

    Note: None when there is no input at all (no terminal, a script).
    """
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return None
    return answer.strip().lower() in ("y", "yes")


def cmd_cohort_preview(args: argparse.Namespace, client: ExtractionTaskClient) -> int:
    try:
        crtdl = Path(args.crtdl).read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"CRTDL {args.crtdl} not found; give the path of the CRTDL JSON file"
        ) from None
    parse_crtdl(crtdl, args.crtdl)
    patient_ids = client.evaluate_cohort(crtdl)
    if args.json:
        print_json(
            {"cohort_size": len(patient_ids)}
            | ({"patient_ids": list(patient_ids)} if args.ids else {})
        )
        return EXIT_OK
    print(f"cohort size: {counted(len(patient_ids), 'patient')}")
    if args.ids:
        for patient_id in patient_ids:
            print(shown(patient_id))
    return EXIT_OK


def print_table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    cells = [header, *([shown(cell) for cell in row] for row in rows)]
    widths = [max(len(cell) for cell in column) for column in zip(*cells, strict=True)]
    for row in cells:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def batches_text(job: ExtractionJob) -> str:
    return "-" if job.batches_total is None else f"{job.batches_completed or 0}/{job.batches_total}"


def shown(value: object, limit: int | None = SHOWN_NAME_CHARS) -> str:
    """A value from the server as a terminal line may show it: ``-`` for none.

    Note: else ``show_text``.
    """
    return "-" if value is None else show_text(value, limit)


def age(timestamp: object) -> str:
    """``3m ago`` for an ISO timestamp; ``-`` when there is none (or no text)."""
    if not isinstance(timestamp, str):  # an empty text is no ISO time below
        return "-"
    try:
        moment = datetime.fromisoformat(timestamp)
    except ValueError:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = max((datetime.now(UTC) - moment).total_seconds(), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
