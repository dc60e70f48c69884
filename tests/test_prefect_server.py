"""The local Prefect server of the command line: started once, found again from other processes, restarted
when gone, stopped on request, never started twice; ``PREFECT_API_URL`` wins.

Every test has its own PREFECT_HOME. A server start takes 10-40 s on a busy 2-core machine (a fresh home
migrates its database first), so the scenarios that start servers are few, long and marked slow.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import httpx
import pytest

from flows.server_process import process_runs
from flows.prefect_api import ApiUnreachableError, require_answer
from flows.prefect_server import (
    DATABASE_URL_SETTINGS,
    new_database_note,
    server_environment,
    PORT_FILE,
    SERVER_COMMAND,
    STATE_FILE,
    ServerRecord,
    ServerStartError,
    ensure_server,
    home_port,
    read_record,
    server_status,
    serves_home,
    stop_server,
    ui_url,
)
from flows.run import EXIT_USAGE, main
from flows.server_cli import register
from tests.conftest import REPO_ROOT, seed_prefect_home
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.support.prefect_servers import (
    SERVER_TIMEOUT,
    kill_servers_of,
    servers_of,
    wait_until_gone,
    wait_until_stopped,
)

SECRET = "pw-Sekr3t-api"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_database: Path):
    """A fresh PREFECT_HOME (its database migrated) and no PREFECT_API_URL; every server started in it is ended
    afterwards."""
    home = seed_prefect_home(tmp_path / "prefect-home", prefect_database)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    yield home
    stop_server(home)
    kill_servers_of(home)


def ensure_server_in_subprocess(home: Path) -> subprocess.Popen:
    env = {name: value for name, value in os.environ.items() if name != "PREFECT_API_URL"}
    return subprocess.Popen(
        [sys.executable, "-c", "from flows.prefect_server import ensure_server; print(ensure_server())"],
        cwd=REPO_ROOT,
        env={**env, "PREFECT_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def url_from(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=SERVER_TIMEOUT)
    assert process.returncode == 0, err
    return out.strip()


def is_healthy(url: str) -> bool:
    response = httpx.get(f"{url}/health", timeout=10)
    return response.status_code == 200 and response.json() is True


def wait_for_record(home: Path, process: subprocess.Popen, timeout: float = 60.0) -> ServerRecord:
    deadline = time.monotonic() + timeout
    while (record := read_record(home)) is None:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no server recorded in time"
        time.sleep(0.02)
    return record


def run_server_command(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(required=True))
    args = parser.parse_args(["server", *argv])
    return args.command(args)


@pytest.mark.slow
def test_a_server_is_started_once_reused_restarted_when_gone_and_stopped(home, monkeypatch, capsys):
    # First need: a server starts in PREFECT_HOME, bound to 127.0.0.1, without dupflow's secrets; from nothing, as
    # after the Quick start (no migrated database in the home).
    (home / "prefect.db").unlink()
    monkeypatch.setenv("APP_SERVICES__PSEUDONYMIZER__PASSWORD", "not-for-the-server")
    monkeypatch.setenv("TORCH_PASSWORD", "a-config-reference-not-for-the-server")  # ${TORCH_PASSWORD} in a config
    url = ensure_server(startup_timeout=SERVER_TIMEOUT)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    assert is_healthy(url)
    # It migrated the new database, started once: a newcomer waits for one start.
    said = capsys.readouterr().err
    assert said.count("starting a local Prefect server") == 1, said
    assert (home / "prefect.db").is_file()
    first = read_record(home)
    assert first is not None and first.url == url and servers_of(home) == [first.pid]
    assert (home / "dupflow-server.log").is_file()
    server_environ = Path(f"/proc/{first.pid}/environ").read_bytes()
    assert b"not-for-the-server" not in server_environ and b"PREFECT_HOME=" in server_environ
    ui_settings = httpx.get(f"{ui_url(first.url)}/ui-settings", timeout=10).json()
    assert ui_settings["api_url"] == url  # the UI on a port other than 4200 calls this server

    # Later commands, in other processes too, reuse it; `server start|status` print its UI URL.
    assert url_from(ensure_server_in_subprocess(home)) == url
    assert run_server_command("start") == 0
    assert run_server_command("status") == 0
    assert capsys.readouterr().out.count(f"Prefect UI: {ui_url(first.url)}") == 2
    assert read_record(home) == first and servers_of(home) == [first.pid]

    # Gone (kill -9): the next command starts another on the same database.
    os.killpg(first.pid, signal.SIGKILL)
    wait_until_gone(first.pid)
    assert server_status() is None
    again = ensure_server(startup_timeout=SERVER_TIMEOUT)
    second = read_record(home)
    assert second.pid != first.pid and again == second.url == url  # the address the UI and workers know
    assert is_healthy(again) and servers_of(home) == [second.pid]
    block_types = httpx.post(f"{again}/block_types/filter", json={}, timeout=30).json()
    assert any(block["slug"] == "secret" for block in block_types)  # the UI's block catalog is still there
    status = server_status()
    assert (status["url"], status["pid"], status["healthy"]) == (again, second.pid, True)

    # Frozen (SIGSTOP, Ctrl+Z in its terminal): said at once with both ways out, not waited on for 120 s in silence.
    os.kill(second.pid, signal.SIGSTOP)
    try:
        wait_until_stopped(second.pid)
        began = time.monotonic()
        with pytest.raises(ServerStartError) as frozen:
            ensure_server(startup_timeout=SERVER_TIMEOUT)
        assert time.monotonic() - began < 10 and f"kill -CONT {second.pid}" in str(frozen.value), str(frozen.value)
        assert "server stop" in str(frozen.value)
    finally:
        os.kill(second.pid, signal.SIGCONT)
    assert ensure_server(startup_timeout=SERVER_TIMEOUT) == again

    # Stopped: the process ends and the state file goes.
    assert stop_server() is True
    assert not process_runs(second.pid, SERVER_COMMAND) and servers_of(home) == []
    assert not (home / STATE_FILE).exists()
    assert server_status() is None
    assert stop_server() is False


@pytest.mark.slow
def test_commands_starting_at_once_or_after_a_killed_starter_share_one_server(home):
    # A command killed (kill -9) while its server starts leaves that server recorded and starting.
    starter = ensure_server_in_subprocess(home)
    started = wait_for_record(home, starter)
    starter.kill()
    starter.wait()

    # The next two commands, at once, wait for that server instead of starting their own.
    first, second = ensure_server_in_subprocess(home), ensure_server_in_subprocess(home)
    urls = {url_from(first), url_from(second)}

    assert urls == {started.url}
    assert read_record(home) == started and servers_of(home) == [started.pid]
    assert is_healthy(started.url)


def test_the_server_gets_what_a_prefect_server_uses_of_the_environment_and_nothing_else():
    """The server outlives the command: a variable a configuration's ${VAR} reads (a password) stayed readable in
    its environment (``ps eww``, /proc/PID/environ) for as long as it ran."""
    caller = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "https_proxy": "http://proxy:3128",
        "SSL_CERT_FILE": "/etc/ssl/site.pem",
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect@db/prefect",
        "PGPASSWORD": "the-databases-own",
        "PYTHONPATH": "/opt/site",
        "TORCH_PASSWORD": "a-config-reference",
        "APP_SERVICES__SEND__AUTH__PASSWORD": "an-app-setting",
        "AWS_SECRET_ACCESS_KEY": "an-s3-key",
        "SLACK_WEBHOOK": "a-notification-url",
    }
    kept = server_environment(caller)
    assert sorted(kept) == sorted(
        set(caller) - {"TORCH_PASSWORD", "APP_SERVICES__SEND__AUTH__PASSWORD", "AWS_SECRET_ACCESS_KEY", "SLACK_WEBHOOK"}
    )
    assert all(kept[name] == caller[name] for name in kept)


def test_prefect_api_url_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")

    assert ensure_server(tmp_path) == "http://prefect.example:4200/api"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_server_that_does_not_come_up_is_ended_and_its_log_named(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    home = tmp_path / "prefect-home"

    with pytest.raises(ServerStartError, match=str(home / "dupflow-server.log")):
        ensure_server(home, startup_timeout=0)

    assert not (home / STATE_FILE).exists()
    assert servers_of(home) == []


@pytest.mark.slow
def test_a_server_that_ends_at_start_up_is_told_as_ended_not_as_slow(home):
    home.mkdir(exist_ok=True)
    (home / "prefect.db").write_bytes(b"this is not an SQLite database, " * 512)

    with pytest.raises(ServerStartError, match="ended during start-up") as refused:
        ensure_server(home, startup_timeout=SERVER_TIMEOUT)

    assert str(home / "dupflow-server.log") in str(refused.value)
    assert servers_of(home) == []


@pytest.mark.slow
def test_a_starting_server_is_its_server_at_every_check_of_its_start_up(home):
    """Its command line read empty now and then while it imported (about 1 in 10,000 reads): a start polling every
    50 ms took such a read for an ended server, ended it and failed (CI, 6 tests of one module). Port 0: the system
    gives a free one at the bind, which no other test's server can take first (a stressed CI saw this server end
    early; the likely cause, its home's port, was chosen seconds before its bind)."""
    log = home / "server.log"
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", "0"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=home, stdout=output, stderr=output, start_new_session=True)
        try:
            checks = [process_runs(process.pid, SERVER_COMMAND) for _ in range(20_000) if process.poll() is None]
        finally:
            with suppress(ProcessLookupError):  # it ended by itself, and poll() collected it
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert len(checks) > 10_000, f"the server ended while it started: {log.read_text()[-3000:]}"
    assert all(checks)


def test_server_commands_without_a_server(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))

    assert run_server_command("status") == 1
    assert run_server_command("stop") == 0
    assert "no local Prefect server" in capsys.readouterr().out

    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")
    assert run_server_command("start") == 0
    assert "PREFECT_API_URL is set" in capsys.readouterr().out
    assert not (tmp_path / STATE_FILE).exists()


# --- issue 33 item 6, issue 32 item 2: a server that is one home's own, told by a secret of its start ------------


@pytest.fixture
def foreign_api():
    """An HTTP server that is no Prefect API (scripted replies: ``foreign_api.state.replies``)."""
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            Reply(404, {"Content-Type": "text/html"}, b"<html>Not Found</html>"),
            "is no Prefect API (GET /health answered HTTP 404)",
        ),
        (
            Reply(200, {"Content-Type": "text/html"}, b"<html>welcome</html>"),
            "is no Prefect API (GET /health answered HTTP 200)",
        ),
        (Reply(reset=True), "does not answer"),
    ],
    ids=["404-html", "200-not-prefect", "reset"],
)
def test_a_foreign_server_behind_prefect_api_url_is_one_line_and_exit_2(
    write_config, foreign_api, monkeypatch, capsys, reply, said
):
    foreign_api.state.replies.extend([reply] * 3)
    monkeypatch.setenv("PREFECT_API_URL", f"http://admin:{SECRET}@127.0.0.1:{foreign_api.port}/api?token={SECRET}")
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})

    exit_code = main(["start", str(config), "https://example.org/data.ndjson", "--no-progress"])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and error.count("\n") == 1, error
    assert f"the Prefect API http://127.0.0.1:{foreign_api.port}/api (PREFECT_API_URL) {said}" in error
    assert SECRET not in error and "admin" not in error


def test_the_uis_address_given_as_prefect_api_url_is_told_with_the_api_url_to_set(foreign_api):
    # `start` prints "Prefect UI: http://127.0.0.1:PORT"; exported as PREFECT_API_URL, that address was refused as
    # "is no Prefect API ... start that server", while the server ran: the API is the same address + /api.
    foreign_api.state.replies.extend([Reply(404, {"Content-Type": "text/html"}, b"<html/>"), Reply(200, {}, b"true")])
    with pytest.raises(ApiUnreachableError) as refused:
        require_answer(foreign_api.base_url)
    said = str(refused.value)
    assert f"PREFECT_API_URL {foreign_api.base_url} is the address of a Prefect server's UI, not its API" in said
    assert f"set PREFECT_API_URL={foreign_api.base_url}/api" in said, said
    assert [request.path for request in foreign_api.state.requests] == ["/health", "/api/health"]


def test_a_prefect_api_or_one_that_wants_credentials_is_accepted(foreign_api):
    version = json.dumps(importlib.metadata.version("prefect")).encode()
    unauthorized = Reply(401, {}, b'{"detail": "unauthorized"}')
    foreign_api.state.replies.extend([Reply(200, {}, b"true"), Reply(200, {}, version), unauthorized])
    foreign_api.state.replies.extend([Reply(200, {}, b"true"), unauthorized])
    for _ in range(3):
        require_answer(foreign_api.base_url + "/api")
    paths = [request.path for request in foreign_api.state.requests]
    assert paths == ["/api/health", "/api/admin/version", "/api/health", "/api/health", "/api/admin/version"]


@pytest.mark.parametrize(
    ("version", "said"),
    [
        (
            Reply(200, {"Content-Type": "text/html"}, b"<html>\x1b[2JWelcome</html>"),
            "answered HTTP 200 '<html> [2JWelcome",
        ),
        (Reply(200, {}, b"true"), "answered HTTP 200 'true'"),  # Prefect's client: a 58-line InvalidVersion traceback
        (Reply(404, {}, b'{"detail": "Not Found"}'), 'answered HTTP 404 \'{"detail": "Not Found"}\''),
        (Reply(200, {}, b'"2.20.3"'), "is Prefect 2.20.3, this client Prefect 3."),
    ],
    ids=["web-page", "true-everywhere", "not-found", "other-major-version"],
)
def test_a_server_whose_health_says_true_but_is_no_prefect_api_is_refused_in_one_line(foreign_api, version, said):
    foreign_api.state.replies.extend([Reply(200, {}, b"true"), version])
    with pytest.raises(ApiUnreachableError) as refused:
        require_answer(foreign_api.base_url + "/api")
    line = str(refused.value)
    assert f"the Prefect API {foreign_api.base_url}/api (PREFECT_API_URL)" in line and said in line, line
    assert "\n" not in line and "\x1b" not in line and "unset it to use the local server" in line, line


def test_a_process_that_echoes_the_homes_path_is_not_its_server(tmp_path, foreign_api):
    nonce = "0123456789abcdef0123456789abcdef"
    record = ServerRecord(1, foreign_api.port, foreign_api.base_url + "/api", "log", "now", nonce)
    echoing_home = json.dumps({"home": str(tmp_path), "logging": {"extra_loggers": ["dupflow.server.guessed"]}})
    with_nonce = json.dumps({"home": str(tmp_path), "logging": {"extra_loggers": [f"dupflow.server.{nonce}"]}})
    foreign_api.state.replies.extend([Reply(200, {}, echoing_home.encode()), Reply(200, {}, with_nonce.encode())])

    assert not serves_home(record, tmp_path)
    assert serves_home(record, tmp_path)


def decoy_server(environment: dict[str, str]) -> subprocess.Popen:
    """A process whose command line reads ``prefect server start``, as a recycled pid may: it serves nothing."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "prefect", "server", "start"],
        env={**os.environ, **environment},
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_recycled_pid_now_another_server_is_neither_reused_nor_stopped(tmp_path):
    """The pid recorded for a home's server, recycled into another home's ``prefect server start``: stop, status
    and start leave it alone (its environment lacks the start's nonce); the home's own server is stopped."""
    nonce = "0123456789abcdef0123456789abcdef"
    other = decoy_server({"PREFECT_LOGGING_EXTRA_LOGGERS": "dupflow.server.fedcba9876543210fedcba9876543210"})
    own = decoy_server({"PREFECT_LOGGING_EXTRA_LOGGERS": f"dupflow.server.{nonce}"})
    try:
        for process in (other, own):
            assert wait_until_command_line(process.pid)
        write_record(tmp_path, ServerRecord(other.pid, 1, "http://127.0.0.1:1/api", "log", "now", nonce))
        assert server_status(tmp_path) is None
        assert stop_server(tmp_path) is False
        assert other.poll() is None and read_record(tmp_path) is None

        write_record(tmp_path, ServerRecord(own.pid, 1, "http://127.0.0.1:1/api", "log", "now", nonce))
        assert stop_server(tmp_path) is True
        assert own.wait(timeout=SERVER_TIMEOUT) is not None and other.poll() is None
    finally:
        for process in (other, own):
            process.kill()
            process.wait()


def wait_until_command_line(pid: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not process_runs(pid, SERVER_COMMAND):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def write_record(home: Path, record: ServerRecord) -> None:
    (home / STATE_FILE).write_text(json.dumps(record.__dict__))


def test_each_home_gets_its_own_port_kept_in_the_home(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_API_PORT", raising=False)
    homes = [tmp_path / f"home-{number}" for number in range(20)]
    ports = [home_port(home) for home in homes]
    assert len(set(ports)) >= 15 and all(4200 <= port < 4200 + 1000 + 100 for port in ports)

    (homes[0] / PORT_FILE).parent.mkdir()
    (homes[0] / PORT_FILE).write_text("4711\n")
    assert home_port(homes[0]) == 4711
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", "5100")
    assert home_port(homes[0]) == 5100
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", "http")
    with pytest.raises(ServerStartError, match="PREFECT_SERVER_API_PORT='http' is not a port"):
        home_port(homes[0])


def test_server_url_prints_prefect_api_url_without_credentials(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # a home where no local server runs
    monkeypatch.setenv("PREFECT_API_URL", f"https://ops:{SECRET}@prefect.example/api")
    assert run_server_command("url") == 0
    assert run_server_command("status") == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "https://prefect.example/api" and SECRET not in out


@pytest.mark.slow
def test_two_homes_each_keep_their_own_server_and_port_and_never_share_one(tmp_path, monkeypatch, prefect_database):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_SERVER_API_PORT", raising=False)
    a, b = (seed_prefect_home(tmp_path / name, prefect_database) for name in ("home-a", "home-b"))
    try:
        url_a = ensure_server(a, startup_timeout=SERVER_TIMEOUT)
        url_b = ensure_server(b, startup_timeout=SERVER_TIMEOUT)
        port_a, port_b = read_record(a).port, read_record(b).port
        assert port_a != port_b and (a / PORT_FILE).read_text() == f"{port_a}\n"

        # B's server comes to sit on A's port while A is stopped (B stopped starts again on the port its home keeps,
        # here A's): A never takes it for its own, and moves.
        stop_server(a)
        stop_server(b)
        (b / PORT_FILE).write_text(f"{port_a}\n")
        assert ensure_server(b, startup_timeout=SERVER_TIMEOUT) == url_a
        moved = ensure_server(a, startup_timeout=SERVER_TIMEOUT)
        assert moved != url_a and read_record(a).port == int((a / PORT_FILE).read_text())
        assert {read_record(a).pid, read_record(b).pid} == set(servers_of(a) + servers_of(b))
        settings = httpx.get(f"{moved}/admin/settings", timeout=30).json()
        assert Path(settings["home"]) == a and url_b  # each home's jobs reach their own server
    finally:
        for home in (a, b):
            stop_server(home)
            kill_servers_of(home)


def test_a_home_that_ran_on_another_database_says_so_when_it_starts_on_a_new_sqlite_one(tmp_path, monkeypatch):
    """A home whose server ran on PostgreSQL, started without PREFECT_API_DATABASE_CONNECTION_URL, silently got a
    second, SQLite database that holds none of its jobs' runs."""
    for name in DATABASE_URL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    assert new_database_note(home) is None  # a new home: nothing to say
    (home / PORT_FILE).write_text("4321\n")  # it ran a server, whose database was not here
    note = new_database_note(home)
    assert note is not None and str(home / "prefect.db") in note and "PREFECT_API_DATABASE_CONNECTION_URL" in note
    (home / "prefect.db").write_bytes(b"")
    assert new_database_note(home) is None  # it ran on its own SQLite database
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://prefect@db/prefect")
    (home / "prefect.db").unlink()
    assert new_database_note(home) is None  # configured: it goes there
