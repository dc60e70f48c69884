"""The environment that is not dupflow's configuration: Prefect's own settings.

Why here: config/ is the one place that reads environment variables.
"""

import ctypes
import functools
import os
import shlex
import sys
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

from tasks.core.errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def command_line() -> str:
    """The command a printed hint (``continue``) starts with, as this one was typed.

    Note: through ``uv run`` (which sets UV_RUN_RECURSION_DEPTH) with ``--project`` outside this
    project's folder.
    """
    program = "dupflow" if Path(sys.argv[0]).name == "dupflow" else "python -m flows.run"
    if "UV_RUN_RECURSION_DEPTH" not in os.environ:
        return program  # its virtual environment is active, or it is installed
    try:
        inside = Path.cwd().resolve().is_relative_to(PROJECT_ROOT)
    except OSError:  # the working directory is gone
        inside = False
    return (
        f"uv run {program}"
        if inside
        else f"uv run --project {shlex.quote(str(PROJECT_ROOT))} {program}"
    )


CLI = command_line()

# Defaults for Prefect (see ../shared/prefect-notes.md); a value the user set wins. The SDK's
# analytics (DO_NOT_TRACK) show a notice, write files to PREFECT_HOME and send events the command
# waits for (up to 2 s) at exit.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # a killed job's run turns Crashed on the server (flows.heartbeats)
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
}


MALLOC_ARENAS = "2"
"""glibc's heaps for a process's threads (by default eight per core).

Why: each keeps what its threads freed: a job's flow process held 7 MB more at zstd, and 1 MB
more at 3,000 files, with the default (``tests/benchmarks``).
"""
M_ARENA_MAX = -8  # glibc's malloc.h


def apply_process_defaults() -> None:
    """Set ``PREFECT_DEFAULTS`` where unset, and ``MALLOC_ARENAS`` heaps.

    Note: the heaps for this process and those it starts; not if MALLOC_ARENA_MAX is set (then
    glibc read the user's at this process's start).
    """
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if "MALLOC_ARENA_MAX" not in os.environ:
        os.environ["MALLOC_ARENA_MAX"] = MALLOC_ARENAS  # for the processes this one starts
        with suppress(OSError, AttributeError):  # no glibc: musl has no arenas, macOS no mallopt
            # this one's: glibc read the variable at its start
            ctypes.CDLL(None).mallopt(M_ARENA_MAX, int(MALLOC_ARENAS))


def prefect_api_url() -> str | None:
    """The Prefect server in use, or None for the embedded (ephemeral) API."""
    return os.environ.get("PREFECT_API_URL") or None


def prefect_api_headers(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The credentials Prefect's client sends its API, for dupflow's own calls to it.

    Note: Basic with ``PREFECT_API_AUTH_STRING``, else Bearer with ``PREFECT_API_KEY``, from
    ``env`` (default: this process's).
    """
    return dict(
        _api_headers(env.get("PREFECT_API_AUTH_STRING") or None, env.get("PREFECT_API_KEY") or None)
    )


@functools.cache
def _api_headers(auth_string: str | None, key: str | None) -> dict[str, str]:
    """The headers, made and registered for redaction once.

    Why: the server probes ask every 50 ms of a start-up, and registering a secret computes all
    its forms.
    """
    from tasks.core.redaction import basic_token, register_secret

    if auth_string:
        token = basic_token(auth_string)
        register_secret(auth_string)
        register_secret(token)
        return {"Authorization": f"Basic {token}"}
    if key:
        register_secret(key)
        return {"Authorization": f"Bearer {key}"}
    return {}


def local_server_port() -> str | None:
    """The port asked of the command line's local Prefect server , or None."""
    return os.environ.get("PREFECT_SERVER_API_PORT") or None


def jobs_dir_of(flag: str | None) -> Path:
    """jobs_dir of commands without a configuration file.

    Note: ``flag`` (--jobs-dir), else APP_JOBS_DIR, else the default.
    """
    from config.settings import Settings

    return Path(flag or os.environ.get("APP_JOBS_DIR") or Settings.model_fields["jobs_dir"].default)


def listed_jobs_dir(flag: str | None) -> Path:
    """``jobs_dir_of`` for the commands that list its jobs: a file there is a mistake."""
    jobs_dir = jobs_dir_of(flag)
    if jobs_dir.exists() and not jobs_dir.is_dir():
        given = (
            "--jobs-dir"
            if flag
            else "APP_JOBS_DIR"
            if os.environ.get("APP_JOBS_DIR")
            else "jobs_dir"
        )
        raise UsageError(
            f"{given} {shlex.quote(str(jobs_dir))} is a file, not a directory; give the directory "
            "that holds the jobs (each job is a directory in it)"
        )
    return jobs_dir


def job_on_command_line(job_dir: Path) -> str:
    """How a command names the job in ``job_dir``: its id, or its quoted folder.

    Note: its id when ``continue ID`` finds it there.
    """
    job_dir = Path(job_dir).resolve()
    found = jobs_dir_of(None).resolve() / job_dir.name == job_dir
    return job_dir.name if found else shlex.quote(str(job_dir))
