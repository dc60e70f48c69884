"""``prune``: list old or finished jobs; with ``--yes`` remove each under its lock.

The REST API is called directly (no Prefect import). See docs/development.md#prune.
"""

import argparse
import os
import shlex
import shutil
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from config.durations import parse_duration
from config.runtime import listed_jobs_dir, prefect_api_url, CLI
from flows import prefect_server
from flows.extraction_cli import age
from flows.job_state import job_lock, JobLockedError, current_states
from flows.prefect_api import api_json, filter_rows
from flows.terminal import Commands, print_stderr
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_jobs import UNFINISHED_STATUSES
from tasks.core.errors import UsageError
from tasks.core.json_shapes import JsonObject
from tasks.job.layout import JobPaths, directory_tag, is_directory_run, is_job_id, job_tag
from tasks.core.readable import plain_text, size_text
from tasks.core.names import show_text
from tasks.core.url_credentials import shown_url
from tasks.job.record import (
    FINAL_STATES,
    RUNNING,
    SUSPENDED,
    UNKNOWN,
    JobRecord,
    RecordError,
    read_record,
)

EXIT_OK, EXIT_FAILED = 0, 1
NAMED_ONLY_STATES = (SUSPENDED,)  # a person still has to look at these: removed only by name
KEPT_BECAUSE = {
    RUNNING: "Running (a process works on it)",
    UNKNOWN: "no flow run of it on this Prefect server (another home's, or a lost database): "
    "prune it from the home that ran it, or remove its directory yourself",
}
# a job directory being removed is renamed to this and its id: no job to list
PRUNING_PREFIX = ".pruning-"
# a process carries the run on: its records stay
LIVE_RUN_STATES = ("RUNNING", "PENDING", "CANCELLING")


def register(commands: Commands) -> None:
    prune = commands.add_parser(
        "prune",
        help=(
            "list old or finished jobs (and their flow runs and artifacts); remove them with --yes"
        ),
    )
    prune.add_argument(
        "--older-than",
        metavar="DURATION",
        help="only jobs changed longer ago on disk (P30D, 30d, 12h)",
    )
    states = f"({', '.join(FINAL_STATES + NAMED_ONLY_STATES)}; default: {', '.join(FINAL_STATES)})"
    help_text = f"only jobs in this state, repeatable {states}"
    prune.add_argument("--state", action="append", type=state_name, metavar="STATE", help=help_text)
    prune.add_argument(
        "--jobs-dir", help="jobs directory (default: jobs_dir of APP_JOBS_DIR, else ./jobs)"
    )
    prune.add_argument(
        "--yes", action="store_true", help="remove them (without it: only list what would go)"
    )
    prune.set_defaults(command=cmd_prune)


def state_name(text: str) -> str:
    """A state ``--state`` may name, in any letter case; never Running.

    Why: a running job is never removed.
    """
    known = {state.lower(): state for state in FINAL_STATES + NAMED_ONLY_STATES}
    if (name := text.lower()) == RUNNING.lower():
        raise argparse.ArgumentTypeError(
            "a running job is never removed; stop it first (it becomes Crashed)"
        )
    if name not in known:
        raise argparse.ArgumentTypeError(
            f"{text!r} is no job state; use one of {', '.join(known.values())}"
        )
    return known[name]


@dataclass
class Candidate:
    paths: JobPaths
    state: str
    changed_at: str
    size: int
    flow_runs: list[JsonObject]
    artifact_ids: list[str]
    left_running: str | None  # what the job may have left running on the extraction server


@dataclass
class Selection:
    chosen: list[Candidate] = field(default_factory=list)
    # (entry name, why it stays) worth a line each
    protected: list[tuple[str, str]] = field(default_factory=list)
    not_matching: int = 0  # jobs too recent or in a state not asked for


def cmd_prune(args: argparse.Namespace) -> int:
    jobs_dir = listed_jobs_dir(args.jobs_dir).resolve()
    try:
        older_than = parse_duration(args.older_than) if args.older_than is not None else None
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None
    states = tuple(args.state or FINAL_STATES)
    api_url = housekeeping_api_url()
    try:
        selection = select_jobs(jobs_dir, states, older_than)
        print_selection(selection, jobs_dir, api_url)
        if not args.yes:
            print_how_to_remove(selection, args)
            if begun := begun_removals(jobs_dir):
                print(
                    f"{len(begun)} job(s) an interrupted prune began to remove: --yes finishes them"
                )
            return EXIT_OK
        unfinished = finish_removals(jobs_dir)
        return max(remove_jobs(selection.chosen, jobs_dir), EXIT_FAILED if unfinished else EXIT_OK)
    except ServiceError as exc:
        print_stderr(f"error: {exc} (at {shown_url(api_url or '')}); nothing more was removed")
        return EXIT_FAILED


def select_jobs(jobs_dir: Path, states: tuple[str, ...], older_than: timedelta | None) -> Selection:
    selection, now = Selection(), datetime.now(UTC)
    readable = readable_jobs(jobs_dir, selection)
    job_states = current_states(list(readable))
    for paths, job in readable.items():
        state = job_states[paths]
        changed_at = changed_time(paths)
        # both UTC
        too_recent = (
            older_than is not None and now - datetime.fromisoformat(changed_at) < older_than
        )
        if state in KEPT_BECAUSE:
            selection.protected.append((paths.job_id, KEPT_BECAUSE[state]))
        elif state in NAMED_ONLY_STATES and state not in states:
            selection.protected.append((paths.job_id, f"{state} (remove it with --state {state})"))
        elif state not in states or too_recent:
            selection.not_matching += 1
        else:
            runs, artifacts = server_records(paths)
            if why := live_run(runs, states):
                selection.protected.append((paths.job_id, why))
                continue
            size = size_on_disk(paths.job_dir)
            left_running = unfollowed_extraction(paths, job)
            selection.chosen.append(
                Candidate(paths, state, changed_at, size, runs, artifacts, left_running)
            )
    return selection


def readable_jobs(jobs_dir: Path, selection: Selection) -> dict[JobPaths, JobRecord]:
    """The jobs of ``jobs_dir`` in name order with their records.

    Note: each that must not be touched is kept, with why.
    """
    readable = {}
    for entry in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
        if not is_job_id(entry.name):
            continue
        if entry.is_symlink():
            selection.protected.append((entry.name, "a symbolic link (never followed)"))
        elif JobPaths(entry).job_file.is_file():
            try:
                readable[JobPaths(entry)] = read_record(entry)
            except RecordError as exc:
                selection.protected.append(
                    (entry.name, f"its job.json cannot be read (look at it yourself): {exc}")
                )
    return readable


def changed_time(paths: JobPaths) -> str:
    """When the job last changed on disk: the newest of its record, log and results.

    Note: every run writes to the log.
    """
    times = [
        path.stat().st_mtime
        for path in (paths.job_file, paths.log_file, paths.results)
        if path.exists()
    ]
    return datetime.fromtimestamp(max(times, default=0), UTC).isoformat(timespec="seconds")


def unfollowed_extraction(paths: JobPaths, job: JobRecord) -> str | None:
    """How to cancel the extraction a job ended without following.

    Why: with no result record of its extractor step, the extraction may still run, and once the
    job's directory is gone nothing names it.
    """
    if "extractor" not in job.enabled_steps or paths.finished(job.enabled_steps, "extractor"):
        return None
    config = shlex.quote(show_text(job.config_path, None)) if job.config_path else "CONFIG"
    if extraction := job.facts.get("extraction_job_id"):
        extraction = shlex.quote(plain_text(extraction))
        where = shown_url(
            plain_text(job.facts.get("extraction_status_url") or "the extraction server")
        )
        return (
            f"its extraction job {extraction} may still run ({where}); to cancel it: {CLI} "
            f"extraction cancel {config} {extraction}"
        )
    if job.facts.get("extraction_submission"):
        return (
            "an extraction it submitted may run on the extraction server, named nowhere; look "
            f"for it with: {CLI} extraction list {config} --status {','.join(UNFINISHED_STATUSES)}"
        )
    return None


def size_on_disk(directory: Path) -> int:
    """Bytes of the files under ``directory``; symbolic links are not followed."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with suppress(FileNotFoundError):  # a temporary file renamed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def housekeeping_api_url() -> str | None:
    """The jobs' server as ``use_server`` points at it.

    Note: None where there is none, nor a local database to serve.
    """
    if prefect_api_url() is None:
        home = prefect_server.prefect_home()
        if prefect_server.server_status() is None and not prefect_server.has_database(home):
            return None
    prefect_server.use_server()
    return prefect_api_url()


def server_records(paths: JobPaths) -> tuple[list[JsonObject], list[str]]:
    """Return the directory's runs on the server and their artifacts' ids.

    Note: a run is the directory's by its tags ``job-<id>`` and ``dir-…`` (``is_directory_run``).
    """
    own = directory_tag(paths.job_dir)
    runs = [
        run
        for run in filter_rows(
            "/flow_runs/filter", flow_runs={"tags": {"all_": [job_tag(paths.job_id)]}}
        )
        if is_directory_run(run["tags"], own)
    ]
    artifacts = (
        filter_rows(
            "/artifacts/filter", artifacts={"flow_run_id": {"any_": [run["id"] for run in runs]}}
        )
        if runs
        else []
    )
    return runs, [artifact["id"] for artifact in artifacts]


def live_run(runs: list[JsonObject], states: tuple[str, ...]) -> str | None:
    """Why the job's server records stay: a run running or paused in a state not named.

    Note: None where none stays.
    """
    for run in runs:
        state = run.get("state") or {}
        if state.get("type") in LIVE_RUN_STATES or (
            state.get("type") == "PAUSED" and state.get("name") not in states
        ):
            return f"its flow run {run['id']} is {state.get('name')} on the server"
    return None


def print_selection(selection: Selection, jobs_dir: Path, api_url: str | None) -> None:
    where = shown_url(api_url) if api_url else "no Prefect server (none configured)"
    print(f"jobs in {jobs_dir}; flow runs and artifacts on {where}")
    if selection.chosen:
        print(
            f"{'JOB':<36}  {'STATE':<18}  {'CHANGED':>9}  {'SIZE':>10}  {'FLOW RUNS':>9}  "
            f"{'ARTIFACTS':>9}"
        )
    for job in selection.chosen:
        print(
            f"{job.paths.job_id}  {job.state:<18}  {age(job.changed_at):>9}  "
            f"{size_text(job.size):>10}  {len(job.flow_runs):>9}  {len(job.artifact_ids):>9}"
        )
    for job in selection.chosen:
        if job.left_running:
            print(f"note {job.paths.job_id}: {job.left_running}")
    for name, why in selection.protected:
        print(f"kept {name}: {why}")
    if selection.not_matching:
        print(
            f"kept {selection.not_matching} other job(s): more recent, or in a state not asked for"
        )


def print_how_to_remove(selection: Selection, args: argparse.Namespace) -> None:
    if not selection.chosen:
        print("nothing to remove")
        return
    total = sum(job.size for job in selection.chosen)
    print(
        f"would remove {len(selection.chosen)} job(s), {size_text(total)} on disk; nothing was "
        "removed"
    )
    options = ["--older-than", args.older_than] if args.older_than else []
    options += [option for state in args.state or [] for option in ("--state", state)]
    options += ["--jobs-dir", args.jobs_dir] if args.jobs_dir else []
    print(f"to remove them: {CLI} {shlex.join(['prune', *options, '--yes'])}")


def begun_removals(jobs_dir: Path) -> list[Path]:
    """Job directories a prune renamed for removal (``PRUNING_PREFIX``), unfinished."""
    found = sorted(jobs_dir.glob(f"{PRUNING_PREFIX}*")) if jobs_dir.is_dir() else []
    return [
        path
        for path in found
        if is_job_id(path.name.removeprefix(PRUNING_PREFIX)) and not path.is_symlink()
    ]


def finish_removals(jobs_dir: Path) -> int:
    """Finish what earlier prunes began; give how many could not be finished.

    Note: each is said; none stops the others, or a file this user may not remove would keep every
    later prune from removing anything.
    """
    unfinished = 0
    for path in begun_removals(jobs_dir):
        try:
            shutil.rmtree(path)
        except FileNotFoundError:  # another prune at the same time finished it
            continue
        except OSError as exc:
            unfinished += 1
            print_stderr(f"error: could not finish removing {path}: {removal_error(exc)}")
            continue
        print(
            f"removed {path.name.removeprefix(PRUNING_PREFIX)} (an interrupted prune had begun it)"
        )
    return unfinished


def removal_error(exc: OSError) -> str:
    """Why a removal failed, and the fix (rmtree names a file by its name alone)."""
    which = f" ({exc.filename})" if exc.filename else ""
    return (
        f"{exc.strerror or exc}{which}; make it removable (its owner, its attributes), then run "
        "prune --yes again"
    )


def remove_jobs(chosen: list[Candidate], jobs_dir: Path) -> int:
    """Exit code 1 when a directory could not be removed (skipped jobs are no failure)."""
    removed, failed = 0, 0
    for job in chosen:
        try:
            why_not = remove_job(job, jobs_dir)
        except OSError as exc:
            failed += 1
            trash = jobs_dir / f"{PRUNING_PREFIX}{job.paths.job_id}"
            left = f" (it is left as {trash})" if trash.exists() else ""
            print_stderr(
                f"error: {job.paths.job_id} could not be removed{left}: {removal_error(exc)}"
            )
            continue
        if why_not:
            print(f"skipped {job.paths.job_id}: {why_not}")
        else:
            removed += 1
            print(
                f"removed {job.paths.job_id} ({len(job.flow_runs)} flow run(s), "
                f"{len(job.artifact_ids)} artifact(s))"
            )
            if job.left_running:
                print(f"  {job.left_running}")
    print(f"removed {removed} of {len(chosen)} job(s)")
    return EXIT_FAILED if failed else EXIT_OK


def remove_job(job: Candidate, jobs_dir: Path) -> str | None:
    """Remove one job under its lock; why not, or None."""
    if job.paths.job_dir.is_symlink() or job.paths.job_dir.parent.resolve() != jobs_dir:
        return "not a directory of the jobs directory"
    # another prune removed it (its lock would make the folder again)
    if not job.paths.job_file.is_file():
        return "it is gone (removed by another prune meanwhile)"
    try:
        with job_lock(job.paths):
            if changed_time(job.paths) != job.changed_at:
                return "it changed since it was listed; run prune again"
            job.flow_runs, job.artifact_ids = server_records(job.paths)  # as they are now
            if why := live_run(job.flow_runs, (job.state,)):
                return why
            # artifacts first; a flow run's task runs and logs go with it
            for artifact_id in job.artifact_ids:
                api_json("DELETE", f"/artifacts/{artifact_id}")
            for run in job.flow_runs:
                api_json("DELETE", f"/flow_runs/{run['id']}")
            trash = jobs_dir / f"{PRUNING_PREFIX}{job.paths.job_id}"
            # in one step: a kill in rmtree leaves no job that looks whole
            os.replace(job.paths.job_dir, trash)
            shutil.rmtree(trash)
    except JobLockedError:
        return "a process took it meanwhile"
    return None
