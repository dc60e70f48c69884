"""``status`` and ``list``: each job's state (its flow run's, asked of the jobs' Prefect server over its REST API,
without importing Prefect), and for ``status`` its facts and steps, as plain text (a damaged record's escape
sequences and controls never reach the terminal)."""

from __future__ import annotations

import argparse

from config.runtime import CLI, job_on_command_line, jobs_dir_of, listed_jobs_dir
from flows import extraction_cli, prefect_server
from flows.job_state import current_state, current_states, find_job_dir, list_jobs, step_at_work
from tasks.core.names import show_text
from tasks.core.readable import CAUSE_CHARS, counted, duration_text, plain_lines, plain_text, size_text, truncate
from tasks.job.layout import JobPaths
from tasks.job.record import CANCELLED, CRASHED, FAILED, RUNNING, Gate, JobRecord, StepRecord, counts_text, read_record

EXIT_OK = 0
SCHEDULED_NAMES = ("Resuming", "Scheduled", "Late")  # a suspended run resumed in the UI, waiting to be run


def settled_message(recorded: str, state: str, paths: JobPaths) -> str:
    """What to do about a job whose state the rule settled otherwise than ``job.json`` says (a run killed, or a
    suspended deployment run cancelled in the UI): the recorded message was about the recorded state."""
    go_on = f"{CLI} continue {job_on_command_line(paths.job_dir)}"
    resume = f"{go_on} resumes it"
    if recorded == RUNNING and state == CRASHED:
        return f"no process works on it any more (its process was killed); {resume}"
    said = f"its flow run is {state} on the Prefect server"
    if state in SCHEDULED_NAMES:  # resumed in the UI: a worker's run is its worker's; the command line's, continue's
        return f"{said}: a worker goes on with a deployment's run, {go_on} with a job of the command line"
    return f"{said}; {resume}" if state in (CANCELLED, CRASHED, FAILED) else said


def cmd_status(args: argparse.Namespace) -> int:
    paths = JobPaths(find_job_dir(args.job, jobs_dir_of(args.jobs_dir)))
    job = read_record(paths.job_dir)
    prefect_server.use_server()  # the job's state is its flow run's there
    print(f"job {job.job_id}")
    print(f"  directory: {paths.job_dir}")
    run = f" (flow run {job.flow_run_ids[-1]})" if job.flow_run_ids else ""
    state = current_state(paths, job)
    message = job.state_message if state == job.state else settled_message(job.state, state, paths)
    print(f"  state:     {state}{run}" + (f" — {truncate(message, CAUSE_CHARS)}" if message else ""))
    print(f"  created:   {job.created_at}   updated: {job.updated_at}")
    print(f"  input:     {plain_text(job.job_input or '-')}")  # a deployment's input comes from a form
    for line in plain_lines(dict(sorted(job.facts.items())), "  "):
        print(line)
    pending = [position for position in range(len(job.enabled_steps)) if f"{position:02d}" not in job.steps]
    working = pending[0] if state == RUNNING and pending else None
    for position, step in enumerate(job.enabled_steps):
        key = f"{position:02d}"
        at_work = step_at_work(job, position, step) if position == working else None
        print_step_status(position, step, job.steps.get(key), job.gates.get(key) or Gate(), at_work)
    return EXIT_OK


def print_step_status(position: int, step: str, result: StepRecord | None, gate: Gate, at_work: str | None) -> None:
    """A step's line: done, with its files; awaiting inspection, with the files that wait; at work, with what its
    progress says so far (``at_work``); or not finished."""
    files = result.files if result is not None else []
    total = size_text(sum(f.size for f in files))
    if result is None or result.awaiting:
        if gate.released:
            said = f"released ({gate.note})" if gate.note else "released"
        elif result is not None:
            said = f"awaiting inspection: {counted(len(files), 'file')}, {total} in {show_text(result.folder, None)}"
        else:
            said = f"working: {at_work}" if at_work else "not finished"
        print(f"  {position + 1}. {step}: {said}")
        return
    took = f", took {duration_text(result.seconds)}" if result.seconds is not None else ""
    note = f" (inspection note: {gate.note})" if gate.note else ""
    folder = show_text(result.folder, None)  # a damaged record's folder or file name shows escaped
    print(f"  {position + 1}. {step}: done, {counted(len(files), 'file')}, {total} in {folder}{took}{note}")
    for line in plain_lines(result.summary, "       "):
        print(line)
    for f in files:
        print(f"       {show_text(f.name, None)}  {size_text(f.size)}  {counts_text([f])}")


def cmd_list(args: argparse.Namespace) -> int:
    """The jobs, newest first; a job whose record cannot be read is listed as unreadable, with why."""
    jobs_dir = listed_jobs_dir(args.jobs_dir)
    if not (jobs := list_jobs(jobs_dir)):
        print(f"no jobs in {jobs_dir.resolve()}")
        return EXIT_OK
    readable = [(paths, job) for paths, job in jobs if isinstance(job, JobRecord)]
    prefect_server.use_server()  # each job's state is its flow run's there
    states = dict(zip((paths for paths, _ in readable), current_states(readable), strict=True))
    print(f"{'JOB':<36}  {'STATE':<18}  {'AGE':>8}  INPUT")
    for paths, job in jobs:
        if isinstance(job, JobRecord):
            age = extraction_cli.age(job.created_at)
            print(f"{job.job_id}  {states[paths]:<18}  {age:>8}  {plain_text(job.job_input or '')}")
        else:
            print(f"{paths.job_id:<36}  {'unreadable':<18}  {'-':>8}  {plain_text(str(job))}")
    return EXIT_OK
