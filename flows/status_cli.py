"""``status`` and ``list``: each job's state; for ``status`` its facts and steps.

Note: the state is its flow run's, read without importing Prefect; shown as plain text (a damaged
record's escape sequences and controls never reach the terminal).
"""

import argparse
from contextlib import suppress
from datetime import datetime
from typing import NamedTuple

from config.runtime import CLI, job_on_command_line, jobs_dir_of, listed_jobs_dir
from flows import extraction_cli, prefect_server
from flows.job_state import (
    current_states,
    find_job_dir,
    finished_steps,
    list_jobs,
    newest_run,
    SCHEDULED_NAMES,
    run_state,
    step_at_work,
    suspended_message,
)
from tasks.core.json_shapes import JsonObject

from tasks.core.names import show_text
from tasks.core.readable import (
    CAUSE_CHARS,
    counted,
    duration_text,
    plain_lines,
    plain_text,
    size_text,
    truncate,
)
from tasks.core.redaction import redact, redact_strings
from tasks.job.layout import JobPaths
from tasks.job.record import (
    CANCELLED,
    CRASHED,
    FAILED,
    RUNNING,
    SUSPENDED,
    JobRecord,
    StepRecord,
    counts_text,
    RecordError,
    read_record,
)

EXIT_OK = 0


def state_message(paths: JobPaths, run: JsonObject | None, state: str) -> str:
    """Say what the job's state means and what to do.

    Note: the server's message, or this tool's where the server says nothing (a gate, a Resume in
    the UI, no run at all).
    """
    go_on = f"{CLI} continue {job_on_command_line(paths.job_dir)}"
    if run is None:
        where = (
            "this Prefect server has no flow run of the job (a new server or database, another "
            "home's)"
        )
        return f"{where}; {go_on} makes one that skips every finished step"
    server = run.get("state") or {}
    said = plain_text(server.get("message") or "")
    if state == SUSPENDED:
        details = server.get("state_details") or {}
        expires = None
        with suppress(ValueError):  # none, or no time
            expires = datetime.fromisoformat(str(details.get("pause_timeout")))
        return suspended_message(details.get("pause_key"), expires, paths.job_dir)
    if state in SCHEDULED_NAMES:  # resumed or retried in the UI: for a runner or worker
        return (
            f"its flow run is {state}: the runner or worker of its deployment takes it up (or: "
            f"{go_on})"
        )
    if state in (CANCELLED, CRASHED, FAILED):
        return f"{said}; {go_on} resumes it" if said else f"{go_on} resumes it"
    return said


StepState = tuple[int, str, StepRecord | str | None, str | None]
"""A step as ``status`` shows it: position (from 0), name, result (done or awaiting; why its record
is not taken), progress."""


class JobStatus(NamedTuple):
    """What ``status`` shows of a job, as text or as JSON."""

    paths: JobPaths
    job: JobRecord
    run: JsonObject | None
    state: str
    message: str
    steps: list[StepState]


def job_status(paths: JobPaths) -> JobStatus:
    """The job's record, newest flow run, state and what that means, and its steps."""
    job = read_record(paths.job_dir)
    prefect_server.use_server()  # the job's state is its flow run's there
    run = newest_run(paths)
    state = run_state(run)
    done = finished_steps(paths, job.enabled_steps, run) if run else {}
    unfinished = (p for p in range(len(job.enabled_steps)) if p not in done)
    working = next(unfinished, None) if state == RUNNING else None
    steps: list[StepState] = []
    for position, step in enumerate(job.enabled_steps):
        at_work = None
        if run and position == working:
            at_work = step_at_work(job.job_id, str(run["id"]), position, step)
        steps.append((position, step, done.get(position), at_work))
    return JobStatus(paths, job, run, state, state_message(paths, run, state), steps)


def cmd_status(args: argparse.Namespace) -> int:
    status = job_status(JobPaths(find_job_dir(args.job, jobs_dir_of(args.jobs_dir))))
    if args.json:
        extraction_cli.print_json(status_document(status))
        return EXIT_OK
    paths, job, run, state, message, steps = status
    print(f"job {job.job_id}")
    print(f"  directory: {paths.job_dir}")
    shown_run = f" (flow run {plain_text(run.get('id'))})" if run else ""
    print(
        f"  state:     {state}{shown_run}"
        + (f" — {truncate(message, CAUSE_CHARS)}" if message else "")
    )
    updated = f"   updated: {plain_text(run.get('updated'))}" if run else ""
    print(f"  created:   {job.created_at}{updated}")
    shown_input = plain_text(redact(job.job_input or "-"))  # a deployment's input comes from a form
    print(f"  input:     {shown_input}")
    facts = redact_strings(dict(sorted(job.facts.items())))  # an older record's may hold a secret
    for line in plain_lines(facts, "  "):
        print(line)
    for step in steps:
        print_step_status(*step)
    return EXIT_OK


def print_step_status(
    position: int, step: str, result: StepRecord | str | None, at_work: str | None
) -> None:
    """Print a step's line: done with its files, awaiting, at work, or not finished.

    Note: at work with its progress; not finished with why, where its record is not taken.
    """
    if isinstance(result, str):
        print(
            f"  {position + 1}. {step}: not finished: {plain_text(result)}; continue does it again"
        )
        return
    if result is None:
        print(
            f"  {position + 1}. {step}: " + (f"working: {at_work}" if at_work else "not finished")
        )
        return
    files, total = result.files, size_text(sum(f.size for f in result.files))
    folder = show_text(result.folder, None)  # a damaged record's folder or file name shows escaped
    if result.awaiting:
        print(
            f"  {position + 1}. {step}: awaiting inspection: {counted(len(files), 'file')}, "
            f"{total} in {folder}"
        )
        return
    took = f", took {duration_text(result.seconds)}" if result.seconds is not None else ""
    print(
        f"  {position + 1}. {step}: done, {counted(len(files), 'file')}, {total} in {folder}{took}"
    )
    for line in plain_lines(redact_strings(result.summary), "       "):
        print(line)
    for f in files:
        print(f"       {show_text(f.name, None)}  {size_text(f.size)}  {counts_text([f])}")


def status_document(status: JobStatus) -> JsonObject:
    """``status --json``: the facts the text shows, as data, secrets redacted.

    Note: its shape is documented in docs/operations.md ("status --json"): keys are only ever added.
    """
    job, run = status.job, status.run or {}
    return {
        "job_id": job.job_id,
        "directory": str(status.paths.job_dir),
        "state": status.state,
        "state_message": truncate(status.message, CAUSE_CHARS) or None,
        "flow_run_id": str(run["id"]) if run else None,
        "created_at": job.created_at,
        "updated_at": run.get("updated"),
        "input": redact(job.job_input) if job.job_input else None,
        "facts": redact_strings(job.facts),
        "steps": [step_document(step) for step in status.steps],
    }


def step_document(step: StepState) -> JsonObject:
    """A step in ``status --json``, numbered from 1 as the text shows it."""
    position, name, found, at_work = step
    result, problem = (None, plain_text(found)) if isinstance(found, str) else (found, None)
    if result is not None:
        state = "awaiting" if result.awaiting else "done"
    else:
        state = "working" if at_work else "not_finished"
    files = result.files if result else []
    return {
        "position": position + 1,
        "name": name,
        "status": state,
        "progress": at_work,
        "problem": problem,
        "folder": result.folder if result else None,
        "files": [{"name": f.name, "size": f.size, "counts": f.counts} for f in files],
        "summary": redact_strings(result.summary) if result else {},
        "seconds": result.seconds if result else None,
        "cached": bool(result and result.cached),
    }


def cmd_list(args: argparse.Namespace) -> int:
    jobs_dir = listed_jobs_dir(args.jobs_dir)
    jobs = list_jobs(jobs_dir)
    readable = [paths for paths, job in jobs if isinstance(job, JobRecord)]
    if jobs:
        prefect_server.use_server()  # each job's state is its flow run's there
    states = current_states(readable)
    listed = [listed_job(paths, job, states.get(paths)) for paths, job in jobs]
    if args.json:
        extraction_cli.print_json({"jobs_dir": str(jobs_dir.resolve()), "jobs": listed})
        return EXIT_OK
    if not jobs:
        print(f"no jobs in {jobs_dir.resolve()}")
        return EXIT_OK
    print(f"{'JOB':<36}  {'STATE':<18}  {'AGE':>8}  INPUT")
    # the JSON's rows; an unreadable job shows why in place of its input
    for row in listed:
        age = extraction_cli.age(row["created_at"])
        shown_input = plain_text(row["input"] or row["problem"] or "")
        print(f"{row['job_id']}  {row['state']:<18}  {age:>8}  {shown_input}")
    return EXIT_OK


def listed_job(paths: JobPaths, job: JobRecord | RecordError, state: str | None) -> JsonObject:
    """A job in ``list --json``; one with a bad record is ``unreadable``, with why."""
    readable = job if isinstance(job, JobRecord) else None
    return {
        "job_id": readable.job_id if readable else paths.job_id,
        "directory": str(paths.job_dir.resolve()),
        "state": state if readable else "unreadable",
        "created_at": readable.created_at if readable else None,
        "input": redact(readable.job_input) if readable and readable.job_input else None,
        "problem": None if readable else str(job),
    }
