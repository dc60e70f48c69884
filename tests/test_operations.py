"""Issue 20, operations a hospital can trust: an inspection that cannot be skipped by accident, a local Prefect
server that stays on its port, an unreachable API said in one line, and a README and docs whose commands run as
typed.

The inspection form is checked here with the schema Prefect validates a resume against; a live resume without
confirmation, refused while a worker runs, is part of tests/test_prefect_native.py's deployment run. The server
tests start servers of their own in a PREFECT_HOME of their own, on a free port (never 4200 on a shared machine).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import shlex
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prefect._internal.pydantic.v2_schema import create_v2_schema
from prefect.utilities.schema_tools import ValidationError as SchemaValidationError
from prefect.utilities.schema_tools import validate as validate_schema

from flows.gates import InspectionInput
from flows.prefect_server import (
    LOG_FILE,
    PORT_ATTEMPTS,
    PORT_SEARCH,
    STATE_FILE,
    ServerStartError,
    ensure_server,
    read_record,
    stop_server,
)
from tests.conftest import REPO_ROOT, run_cli, seed_prefect_home
from tests.fakes._server import LoopbackServer
from tests.fakes.foreign_api import WEB_PAGE, ForeignHandler, ForeignState
from tests.support.ports import free_port
from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of, servers_of

# --- 1. inspection cannot be skipped by accident -----------------------------------------------------------------


def test_the_inspection_form_refuses_a_resume_without_confirmation_by_its_schema():
    # The schema Prefect stores for the form and validates every resume's run_input against, with the server's code.
    schema = create_v2_schema(InspectionInput.__name__, model_base=InspectionInput)
    for unconfirmed in ({}, {"note": "oops"}, {"confirmed": False, "note": "oops"}, {"confirmed": "true"}):
        with pytest.raises(SchemaValidationError, match="confirmed|True was expected"):
            validate_schema(unconfirmed, schema, raise_on_error=True)
    validate_schema({"confirmed": True, "note": "ok"}, schema, raise_on_error=True)
    assert InspectionInput(confirmed=True).confirmed is True


def test_the_inspection_forms_toggle_can_be_turned_on_in_the_prefect_ui():
    # Prefect's UI renders a property whose schema has a truthy `const` disabled ("Confirmed is a const and cannot be
    # changed"; its SchemaFormProperty: `disabled: !!property.const`): the toggle stayed off, every Submit said "True
    # was expected", and a deployment run at a wait step could not be resumed from the UI at all.
    schema = create_v2_schema(InspectionInput.__name__, model_base=InspectionInput)
    confirmed = schema["properties"]["confirmed"]
    assert confirmed["type"] == "boolean" and not confirmed.get("const"), confirmed  # an editable toggle
    assert "confirmed" in schema["required"]
    with pytest.raises(ValueError):  # the model itself still takes nothing but true
        InspectionInput(confirmed=False)


# --- 3. the local server keeps its port; an unreachable API is one line ------------------------------------------


@pytest.mark.slow
def test_an_unreachable_prefect_api_is_one_line_exit_2_and_no_job(tmp_path, unused_tcp_port):
    dead = f"http://127.0.0.1:{unused_tcp_port}/api"  # a stale PREFECT_API_URL: the server moved or stopped
    jobs = tmp_path / "jobs"

    done = run_cli("start", "--set", f"jobs_dir={jobs}", "--no-progress", env={"PREFECT_API_URL": dead})

    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert dead in line and "PREFECT_API_URL" in line and "does not answer" in line
    assert not jobs.exists() or list(jobs.iterdir()) == [], "no job may be made against a dead API"


@pytest.mark.slow
@pytest.mark.parametrize("elsewhere", [WEB_PAGE, b"true"], ids=["web-page", "true-everywhere"])
def test_a_server_whose_health_says_true_but_is_no_prefect_api_is_one_line_exit_2_and_no_job(tmp_path, elsewhere):
    """A 58-line InvalidVersion traceback, exit 1, and an empty job folder left behind."""
    jobs = tmp_path / "jobs"
    with LoopbackServer(ForeignHandler, ForeignState(elsewhere=elsewhere)) as foreign:
        api_url = f"{foreign.base_url}/api"
        done = run_cli("start", "--set", f"jobs_dir={jobs}", "--no-progress", env={"PREFECT_API_URL": api_url})

    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert f"{api_url} (PREFECT_API_URL) answers GET /health with true but is no Prefect API" in line, line
    assert f"GET /admin/version answered HTTP 200 '{elsewhere.decode().strip()[:40]}" in line, line
    assert not jobs.exists() or list(jobs.iterdir()) == [], "no job may be made against a server that is no Prefect API"


@pytest.mark.slow
def test_serving_deployments_against_an_unreachable_api_is_one_line_exit_2(unused_tcp_port):
    dead = f"http://127.0.0.1:{unused_tcp_port}/api"
    done = subprocess.run(
        [sys.executable, "-m", "deployments.serve", str(REPO_ROOT / "config" / "default.yaml")],
        cwd=REPO_ROOT,
        env={**os.environ, "PREFECT_API_URL": dead, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert dead in line and "does not answer" in line


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_database: Path):
    """A fresh PREFECT_HOME (its database migrated), no PREFECT_API_URL, and a free port asked of the local server
    (never 4200 here)."""
    home = seed_prefect_home(tmp_path / "prefect-home", prefect_database)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", str(free_port()))
    yield home
    stop_server(home)
    kill_servers_of(home)


@pytest.mark.slow
def test_serving_on_a_schedule_as_the_readme_types_it_schedules_on_the_homes_server(own_home, tmp_path):
    """Without PREFECT_API_URL, serve ran on a temporary server ("Cannot schedule flows on an ephemeral server"):
    the nightly run never fired. It serves on this home's server, started as start starts it."""
    name = f"nightly-{os.getpid()}"
    crtdl = REPO_ROOT / "config" / "sample-data" / "crtdl.json"
    schedule = ["--cron", "0 2 * * *", "--timezone", "Europe/Berlin"]
    with open(tmp_path / "serve.log", "wb") as log:
        serving = subprocess.Popen(
            [sys.executable, "-m", "deployments.serve", str(REPO_ROOT / "config" / "default.yaml"), str(crtdl)]
            + ["--name", name, *schedule],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT
        while (deployment := served_deployment(own_home, name)) is None:
            said = (tmp_path / "serve.log").read_text()
            assert serving.poll() is None and time.monotonic() < deadline, said
            time.sleep(0.2)
    finally:
        serving.terminate()
        serving.wait(60)
    (scheduled,) = deployment["schedules"]
    assert scheduled["active"] and scheduled["schedule"]["cron"] == "0 2 * * *", deployment
    assert scheduled["schedule"]["timezone"] == "Europe/Berlin", deployment


def served_deployment(home: Path, name: str) -> dict | None:
    """The deployment ``dupflow/<name>`` on the server recorded in ``home``, once it is there."""
    if (record := read_record(home)) is None:
        return None
    with suppress(httpx.HTTPError):
        found = httpx.get(f"{record.url}/deployments/name/dupflow/{name}", timeout=10)
        return found.json() if found.status_code == 200 else None
    return None


@pytest.mark.slow
def test_a_taken_port_moves_the_server_to_the_next_free_one_said_in_one_line(own_home, capsys):
    port = int(os.environ["PREFECT_SERVER_API_PORT"])
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", port))
        other_program.listen()
        url = ensure_server(startup_timeout=SERVER_TIMEOUT)

    moved = urlsplit(url).port
    assert port < moved < port + PORT_SEARCH
    assert read_record(own_home).port == moved and servers_of(own_home) == [read_record(own_home).pid]
    # one line per start; a second when the next port was taken too before the server bound it (CI saw a client
    # connection of another test hold it: these ports are in the machine's ephemeral range)
    said = [line for line in capsys.readouterr().err.splitlines() if str(port) in line]
    assert 1 <= len(said) <= PORT_ATTEMPTS, said
    assert all(line.startswith("starting a local Prefect server on") for line in said), said
    assert all(f"port {port} is taken" in line for line in said), said
    assert url.removesuffix("/api") in said[-1], said


@pytest.mark.slow
def test_a_port_taken_after_it_was_found_free_moves_the_server_to_the_next_one(own_home):
    """Another program binds the port between dupflow's check and the server's own (CI saw another test's socket take
    it): the server says the port is in use and ends, and the start goes on with the next free port."""
    port = int(os.environ["PREFECT_SERVER_API_PORT"])
    taken = threading.Event()

    def take_the_port_once_launched(other_program: socket.socket) -> None:
        deadline = time.monotonic() + SERVER_TIMEOUT
        while not (own_home / STATE_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.005)  # launched: the server checks its port only after its imports (a second or more)
        other_program.bind(("127.0.0.1", port))
        other_program.listen()
        taken.set()

    with socket.socket() as other_program:
        taker = threading.Thread(target=take_the_port_once_launched, args=(other_program,), daemon=True)
        taker.start()
        url = ensure_server(startup_timeout=SERVER_TIMEOUT)
        taker.join(5)

    assert taken.is_set()
    moved = urlsplit(url).port
    assert port < moved < port + PORT_SEARCH
    assert read_record(own_home).port == moved and servers_of(own_home) == [read_record(own_home).pid]
    assert "already in use" in (own_home / (LOG_FILE + ".1")).read_text()  # the first server's log, kept


@pytest.mark.slow
def test_a_port_that_is_no_port_is_refused_naming_the_variable(own_home, monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", "42OO")
    with pytest.raises(ServerStartError, match="PREFECT_SERVER_API_PORT='42OO' is not a port"):
        ensure_server()
    assert not (own_home / STATE_FILE).exists()


# --- 4. every command of the README and docs/ runs as typed ------------------------------------------------------

PROGRAMS = ("uv run ", "python ", "prefect ", "dask ", "pytest ", "dupflow ")
NOT_FOUND = ("Failed to spawn", "No module named", "invalid choice", "Unknown command", "command not found")
PLACEHOLDER = re.compile(r"[<\[…]|^[A-Z][A-Z_]+$")  # <job id>, [INPUT], CONFIG, …: what the reader fills in


DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[str]:
    """The commands of README.md and docs/*.md that run a program, from their ``sh`` blocks and inline code, as
    typed (without leading ``VAR=value`` assignments; ``a && b`` and ``a & b`` are two commands)."""
    candidates = []
    for document in DOCUMENTS:
        text = document.read_text()
        candidates += [line for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        candidates += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    commands = []
    for candidate in candidates:
        for command in re.split(r" && | & ", candidate.strip()):
            command = re.sub(r"^(\w+=\S* )+", "", command.strip())
            if command.startswith(PROGRAMS):
                commands.append(command)
    return commands


def test_every_documented_command_runs_in_the_projects_environment():
    """After the Quick start only ``uv`` is on the PATH: ``prefect``, ``python -m flows.run`` and the like work as
    typed through ``uv run``."""
    commands = documented_commands()
    assert len(commands) > 20
    assert [command for command in commands if not command.startswith("uv run ")] == []


# Prefect's own entry point (``prefect = prefect.cli:app``) called for each ``prefect`` command in one process: each
# as a process of its own spent 2 s importing Prefect, 15 times over.
PREFECT_HELPS = """
import json, sys
from prefect.cli import app
for argv in json.loads(sys.argv[1]):
    sys.argv = ["prefect", *argv, "--help"]
    try:
        app()
    except SystemExit as ended:
        if ended.code not in (None, 0):
            print(f"{argv}: exit {ended.code}", file=sys.stderr)
"""


@pytest.mark.slow
def test_every_documented_command_starts_as_typed_up_to_what_the_reader_fills_in():
    """Each command, cut before its first placeholder, with ``--help``: the program, module and subcommands exist
    (a benchmark that takes no ``--help`` fails on it, after it started). ``uv run prefect`` starts as typed once;
    its subcommands are asked for their help in one process."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    tried: dict[tuple[str, ...], str] = {("uv", "run", "prefect"): "uv run prefect"}
    prefect_commands: list[list[str]] = []
    for command in documented_commands():
        argv = tuple(itertools.takewhile(lambda token: not PLACEHOLDER.search(token), shlex.split(command)))
        if argv[:3] == ("uv", "run", "prefect") and len(argv) > 3:
            prefect_commands.append(list(argv[3:]))
        elif argv[-1] != "-m":  # else a module named by a placeholder (bench_<name>)
            tried.setdefault(argv, command)

    def started(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
        return subprocess.run([*argv, "--help"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(2) as pool:  # most of a command's time is its interpreter starting: two at once
        for command, done in zip(tried.values(), pool.map(started, tried), strict=True):
            not_found = [marker for marker in NOT_FOUND if marker in done.stdout + done.stderr]
            assert done.returncode == 0 or not not_found, (command, done.stdout[-2000:], done.stderr[-2000:])
    helps = [sys.executable, "-c", PREFECT_HELPS, json.dumps(prefect_commands)]
    done = subprocess.run(helps, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    not_found = [marker for marker in NOT_FOUND if marker in done.stdout + done.stderr]
    assert done.returncode == 0 and done.stderr == "" and not not_found, (prefect_commands, done.stderr[-3000:])
    assert len(tried) > 15 and len(prefect_commands) > 10


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_the_dupflow_console_script_works_from_any_directory(tmp_path):
    """``uv run --project CLONE dupflow …`` from a directory outside the clone, as the README says."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APP_")}
    uv_run = ["uv", "run", "--locked", "--project", str(REPO_ROOT), "dupflow"]
    default = REPO_ROOT / "config" / "default.yaml"
    for args, said in ((["--help"], "exit codes"), (["config", "check", str(default)], "configuration OK")):
        done = subprocess.run([*uv_run, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and said in done.stdout + done.stderr, (args, done.stdout, done.stderr)


README_LINES = 400  # issue 30: a README for users; the rest lives in docs/


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings: lower case, punctuation dropped, spaces to ``-``."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_readme_is_short_and_every_link_between_it_and_the_docs_leads_somewhere():
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= README_LINES
    assert len(DOCUMENTS) > 1, "docs/*.md are read too"
    broken = []
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if "://" in target:
                continue
            file, _, fragment = target.partition("#")
            linked = (document.parent / file).resolve() if file else document
            if not linked.exists() or (fragment and fragment not in anchors(linked)):
                broken.append(f"{document.name}: {target}")
    assert broken == []


# --- 11. no per-command noise or cost ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_uv_run_compiles_nothing_and_prints_nothing_of_its_own():
    """Byte-compiling is the install step's (``uv sync --compile-bytecode``), not every command's."""
    done = subprocess.run(
        ["uv", "run", "--locked", "python", "-c", "pass"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
