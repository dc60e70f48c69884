"""The command line's local Prefect server: started when needed, reused, stoppable.

No Prefect import at module level: the fast commands import this module. See
docs/development.md#the-local-prefect-server.
"""

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config.runtime import CLI, MALLOC_ARENAS, local_server_port, prefect_api_url
from config.yaml_file import names_secret_blocks
from flows.prefect_api import REFUSED, TIMEOUT, Answer, api_answer, refused_login, require_answer
from flows.prefect_profile import finish_recording, start_recording
from flows.server_process import (
    POLL_INTERVAL,
    process_runs,
    process_stopped,
    terminate,
)
from flows.terminal import print_stderr
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JsonObject
from tasks.streams.files import exclusive_lock, write_file_atomically

STATE_FILE = "dupflow-server.json"
PORT_FILE = "dupflow-server.port"
LOCK_FILE = "dupflow-server.lock"
LOG_FILE = "dupflow-server.log"
RUNNER_FILE, RUNNER_LOG = "dupflow-runner.pid", "dupflow-runner.log"
# what ``python -m`` runs for the server and for its runner: how each is started and recognised
SERVER_COMMAND = ("prefect", "server", "start")
RUNNER_COMMAND = ("flows.job_runs",)
RUNNER_POLL_SECONDS = "5"  # a Resume in the UI runs within this and a process's start
DATABASE_FILE = "prefect.db"
DATABASE_URL_SETTINGS = (
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
)
HOST = "127.0.0.1"
DEFAULT_PORT = 4200  # Prefect's; a home's own port is chosen from PORT_SPREAD ports from it
PORT_SPREAD = 1000
PORT_SEARCH = 100  # ports tried from the wanted one upwards
# + the server's nonce: a logger nobody logs to, echoed by /admin/settings
NONCE_LOGGER = "dupflow.server."
PORT_ATTEMPTS = 3  # starts when another program or home's server takes the chosen port first
PORT_RELEASE_TIMEOUT = 10.0  # for a killed server, exiting, to let go of its port
PROBE_TIMEOUT = 0.5
# a fresh PREFECT_HOME migrates its database first: 15-40 s on a busy 2-core machine
STARTUP_TIMEOUT = 120.0
# Off: two services no job needs, which only label runs Late and workers offline in the UI; two
# malloc arenas for the server's threads instead of glibc's 8 per core.
SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
    "MALLOC_ARENA_MAX": MALLOC_ARENAS,
}


class ServerStartError(DupflowError):
    """The local Prefect server did not come up; the message names its log file."""


@dataclass(frozen=True)
class ServerRecord:
    """What the state file remembers about the server this tool started."""

    pid: int
    port: int
    url: str
    log: str
    started_at: str
    # a secret of this start, echoed by the server's settings: the server is this home's own
    nonce: str = ""


def use_server_for(config_path: str | None) -> None:
    """``use_server`` where the configuration names Secret blocks, read from it."""
    if names_secret_blocks(config_path):
        use_server()


def use_server() -> None:
    """Point this process at the jobs' server: ``PREFECT_API_URL``, else the local one.

    Note: ``PREFECT_API_URL`` must answer.
    Note: the local server's runner (``ensure_runner``) is started too where it does not run.
    """
    if api_url := prefect_api_url():
        require_answer(api_url)
    else:
        os.environ["PREFECT_API_URL"] = api_url = ensure_server()
        ensure_runner(api_url)
        # it read the profile's at import: read again unless that was this URL and login
        prefect_context = sys.modules.get("prefect.context")
        if prefect_context is not None and not points_at(prefect_context, api_url):
            prefect_context.refresh_global_settings_context()
        print_stderr(f"Prefect UI: {ui_url(api_url)}")


def points_at(prefect_context: Any, api_url: str) -> bool:
    """Whether Prefect's settings name ``api_url`` with this process's login.

    Why: building them again costs 40 ms of CPU.
    """
    api = prefect_context.GLOBAL_SETTINGS_CONTEXT.settings.api
    login = api.auth_string.get_secret_value() if api.auth_string else None
    return (api.url, login) == (api_url, os.environ.get("PREFECT_API_AUTH_STRING"))


def ensure_server(home: Path | None = None, *, startup_timeout: float = STARTUP_TIMEOUT) -> str:
    """``PREFECT_API_URL``, else the local server's, started if need be.

    Note: a second command waits on the home lock.
    """
    if api_url := prefect_api_url():
        return api_url
    # the login it starts with: this one's too
    if server_login := os.environ.get("PREFECT_SERVER_API_AUTH_STRING"):
        os.environ.setdefault("PREFECT_API_AUTH_STRING", server_login)
    home = prefect_home(home)
    with exclusive_lock(home / LOCK_FILE):
        record = read_record(home)
        if record is not None and runs_recorded_server(record):
            if wait_until_healthy(record, startup_timeout, home):
                return record.url
            terminate(record.pid)
        return start_server(home, startup_timeout, record).url


def ensure_runner(api_url: str) -> None:
    """Start the home's runner beside its server where it does not run.

    Note: detached, its log in ``home``.
    Note: the runner (``flows.job_runs``: Prefect's ``serve``) runs what the UI resumes or retries
    of the command line's jobs.
    """
    home = prefect_home()
    with exclusive_lock(home / LOCK_FILE):
        if runner_of(home) is not None:
            return
        env = {
            **os.environ,
            "PREFECT_API_URL": api_url,
            "PREFECT_RUNNER_POLL_FREQUENCY": RUNNER_POLL_SECONDS,
        }
        pid = start_detached(RUNNER_COMMAND, home / RUNNER_LOG, env)
        write_file_atomically(home / RUNNER_FILE, str(pid).encode())


def start_detached(module: tuple[str, ...], log: Path, env: dict[str, str]) -> int:
    """Start ``python -m`` ``module`` in ``log``'s folder, output appended; its pid.

    Note: in a session of its own: the command's Ctrl-C and hang-up do not reach it.
    """
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *module],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=log.parent,
            env=env,
            start_new_session=True,
        ).pid


def runner_of(home: Path) -> int | None:
    """The process id of ``home``'s runner if it runs (``ensure_runner``), else None."""
    with suppress(OSError, ValueError):
        if process_runs(pid := int((home / RUNNER_FILE).read_text()), RUNNER_COMMAND):
            return pid
    return None


def stop_server(home: Path | None = None) -> bool:
    """Stop the server recorded in PREFECT_HOME and its runner; whether it ran."""
    home = prefect_home(home)
    with exclusive_lock(home / LOCK_FILE):
        if runner := runner_of(home):
            terminate(runner)
        record = read_record(home)
        if running := record is not None and runs_recorded_server(record):
            terminate(record.pid)
        (home / STATE_FILE).unlink(missing_ok=True)
        return running


def server_status(home: Path | None = None) -> JsonObject | None:
    """The recorded server (without its nonce) with its UI URL and health, or None."""
    if (record := read_record(prefect_home(home))) is None or not runs_recorded_server(record):
        return None
    shown = asdict(record)
    del shown["nonce"]
    return shown | {"ui_url": ui_url(record.url), "healthy": is_healthy(record.url)}


def ui_url(api_url: str) -> str:
    return api_url.rstrip("/").removesuffix("/api")


def prefect_home(home: Path | None = None) -> Path:
    """``home``, else ``PREFECT_HOME``, else ``~/.prefect``; created if missing."""
    path = Path(home or os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def has_database(home: Path) -> bool:
    """Whether ``home``'s server has a database: ``DATABASE_FILE``, or one configured.

    Note: configured in the environment or profiles.toml.
    """
    if (home / DATABASE_FILE).exists() or any(
        os.environ.get(name) for name in DATABASE_URL_SETTINGS
    ):
        return True
    try:
        return "DATABASE_CONNECTION_URL" in (home / "profiles.toml").read_text().upper()
    except OSError:
        return False


def new_database_note(home: Path) -> str | None:
    """A note when the home's server starts anew on a database no longer configured.

    Note: only where it ran before (it kept a port).
    """
    if has_database(home) or not (home / PORT_FILE).exists():
        return None
    return (
        f"note: the server starts on a new SQLite database ({home / DATABASE_FILE}); this home's "
        "server ran on another before, which holds the jobs' runs: set "
        f"{DATABASE_URL_SETTINGS[1]} as then to use it"
    )


def start_server(home: Path, startup_timeout: float, previous: ServerRecord | None) -> ServerRecord:
    """Start a server, record it, wait until it is healthy.

    Note: again on the next free port if another program or home's server took it first.
    ``previous`` is this home's server before, whose port gets time to be freed.
    """
    if note := new_database_note(home):
        print_stderr(note)
    port = wanted = home_port(home)
    deadline = time.monotonic() + (
        PORT_RELEASE_TIMEOUT if previous is not None and previous.port == wanted else 0
    )
    while next_free_port(wanted) != wanted and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    for _ in range(PORT_ATTEMPTS):
        port = next_free_port(port)
        record = launch_server(home, port, wanted)
        environment = server_environment(os.environ)
        profile = start_recording(home, record.url, environment)  # for `prefect …` commands
        try:
            healthy = wait_until_healthy(record, startup_timeout, home)
        finally:
            finish_recording(profile)
        if healthy:
            if local_server_port() is None:
                # kept for the next start
                write_file_atomically(home / PORT_FILE, f"{port}\n".encode())
            return record
        ended = not runs_recorded_server(record)
        terminate(record.pid)
        (home / STATE_FILE).unlink(missing_ok=True)
        log = Path(record.log).read_text(errors="replace") if Path(record.log).exists() else ""
        # the server itself failed, not its port
        if "already in use" not in log and not is_healthy(record.url):
            break
    failure = (
        "ended during start-up" if ended else f"did not come up within {startup_timeout:.0f} s"
    )
    last = f" (its last line: {lines[-1][:200]})" if (lines := log.strip().splitlines()) else ""
    raise ServerStartError(f"the local Prefect server {failure}{last}; see its log {record.log}")


def launch_server(home: Path, port: int, wanted: int) -> ServerRecord:
    """Launch ``prefect server start`` on ``port``, recorded and detached.

    Note: the command's Ctrl-C and hang-up do not reach it. Its API URL in its environment gives its
    UI's API and its notifications' links unless set.
    """
    url = f"http://{HOST}:{port}/api"
    log = home / LOG_FILE
    if log.exists():
        log.replace(log.with_name(LOG_FILE + ".1"))
    moved = (
        ""
        if port == wanted
        else f"; port {wanted} is taken (PREFECT_SERVER_API_PORT chooses another)"
    )
    print_stderr(f"starting a local Prefect server on {ui_url(url)}{moved} (log: {log})")
    env = SERVER_DEFAULTS | server_environment(os.environ)
    env |= {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    nonce = secrets.token_hex(16)
    loggers = os.environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "")
    env["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join(filter(None, [loggers, NONCE_LOGGER + nonce]))
    # the log was moved aside above: a new file
    command = (*SERVER_COMMAND, "--host", HOST, "--port", str(port))
    record = ServerRecord(
        start_detached(command, log, env),
        port,
        url,
        str(log),
        datetime.now(UTC).isoformat(timespec="seconds"),
        nonce,
    )
    write_file_atomically(home / STATE_FILE, json.dumps(asdict(record)).encode(), private=True)
    return record


SERVER_VARIABLES = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TEMP",
    "TMP",
    "TERM",
    "NO_COLOR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "DO_NOT_TRACK",
}
SERVER_VARIABLE_PREFIXES = ("PREFECT_", "PYTHON", "LC_", "MALLOC_", "PG", "XDG_", "OPENSSL_")


def server_environment(environment: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """What a Prefect server uses of ``environment``: proxies, for its webhooks.

    Why: nothing else, as any other variable may hold a secret (``${VAR}``, APP_*), readable in the
    server's environment while it runs.
    """
    return {
        name: value
        for name, value in environment.items()
        if name.upper() in SERVER_VARIABLES or name.startswith(SERVER_VARIABLE_PREFIXES)
    }


def home_port(home: Path) -> int:
    """``PREFECT_SERVER_API_PORT``, else the kept one, else one from the home's path.

    Note: a free one from the path's digest, so homes rarely meet.
    """
    if (value := local_server_port()) is None:
        with suppress(OSError, ValueError):
            if 0 < (kept := int((home / PORT_FILE).read_text())) < 65536:
                return kept
        spread = int(hashlib.sha256(str(home).encode()).hexdigest(), 16) % PORT_SPREAD
        return next_free_port(DEFAULT_PORT + spread)
    if not (value.isdigit() and 0 < int(value) < 65536):
        raise ServerStartError(
            f"PREFECT_SERVER_API_PORT={value!r} is not a port: set it to a number from 1 to "
            "65535, or unset it for the home's own port"
        )
    return int(value)


def next_free_port(port: int) -> int:
    """``port`` or the first free one above it.

    Note: bound with SO_REUSEADDR as uvicorn binds, so TIME_WAIT does not count as taken.
    """
    for candidate in range(port, min(port + PORT_SEARCH, 65536)):
        with socket.socket() as probe, suppress(OSError):
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((HOST, candidate))
            return candidate
    raise ServerStartError(
        f"ports {port}-{port + PORT_SEARCH - 1} on {HOST} are all taken; set "
        "PREFECT_SERVER_API_PORT to a free one"
    )


def read_record(home: Path) -> ServerRecord | None:
    try:
        return ServerRecord(**json.loads((home / STATE_FILE).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def wait_until_healthy(record: ServerRecord, timeout: float, home: Path) -> bool:
    """Poll until ``home``'s server answers; False if its process dies or time is up.

    Note: once its process died another server may answer on its port.
    """
    deadline = time.monotonic() + timeout
    while not (is_healthy(record.url) and serves_home(record, home)):
        # it holds its port and answers nothing: say so, not wait to the timeout
        if process_stopped(record.pid):
            raise ServerStartError(
                f"the local Prefect server (pid {record.pid}) is stopped (SIGSTOP or Ctrl+Z) and "
                f"answers nothing: continue it with kill -CONT {record.pid}, or end it with {CLI} "
                "server stop"
            )
        if not runs_recorded_server(record) or time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return runs_recorded_server(record)


def serves_home(record: ServerRecord, home: Path) -> bool:
    """Say whether the home's server answers: its settings name it, echo the nonce.

    Why: a port is no proof.
    Note: one that refuses this command's login raises ``ApiUnreachableError``: it runs, and is
    never stopped for it.
    """
    answer = api_answer(record.url, "/admin/settings", TIMEOUT)
    if answer[0] in REFUSED:
        raise refused_login(record.url, answer[0])
    return settings_of_home(answer, record, home)


def settings_of_home(answer: Answer, record: ServerRecord, home: Path) -> bool:
    """Say whether ``answer`` (``/admin/settings``) is that of ``home``'s server."""
    status, body = answer
    try:
        settings = json.loads(body)
        same_home = status == 200 and Path(settings["home"]).resolve() == home.resolve()
        return same_home and (not record.nonce or (NONCE_LOGGER + record.nonce).encode() in body)
    except (ValueError, KeyError, TypeError):
        return False


def is_healthy(url: str) -> bool:
    return api_answer(url, "/health", PROBE_TIMEOUT)[0] == 200


def runs_recorded_server(record: ServerRecord) -> bool:
    """Whether the recorded server runs: a ``prefect server start`` with the nonce.

    Why: a recycled pid is neither reused nor stopped.
    Note: without /proc, nonce or environment (exiting), the pid alone tells.
    """
    if not process_runs(record.pid, SERVER_COMMAND):
        return False
    try:
        environment = Path(f"/proc/{record.pid}/environ").read_bytes()
    except FileNotFoundError:
        return True
    # it ended between the open and the read; another user's process
    except (ProcessLookupError, PermissionError):
        return False
    return (
        not (record.nonce and environment) or (NONCE_LOGGER + record.nonce).encode() in environment
    )
