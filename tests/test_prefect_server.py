"""The local Prefect server of the command line: started once, found again from other processes, restarted
when gone, stopped on request, never started twice; ``PREFECT_API_URL`` wins.

Every test has its own PREFECT_HOME. A server start takes 10-40 s on a busy 2-core machine (a fresh home
migrates its database first), so the scenarios that start servers are few, long and marked slow.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.prefect_server import (
    STATE_FILE,
    ServerRecord,
    ServerStartError,
    ensure_server,
    process_is_server,
    read_record,
    register,
    server_status,
    stop_server,
    ui_url,
)
from tests.conftest import REPO_ROOT, seed_prefect_home
from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of, servers_of, wait_until_gone


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
    url = ensure_server(startup_timeout=SERVER_TIMEOUT)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    assert is_healthy(url)
    first = read_record(home)
    assert first is not None and first.url == url and servers_of(home) == [first.pid]
    assert (home / "dupflow-server.log").is_file()
    assert b"not-for-the-server" not in Path(f"/proc/{first.pid}/environ").read_bytes()
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
    assert second.pid != first.pid and again == second.url
    assert is_healthy(again) and servers_of(home) == [second.pid]
    block_types = httpx.post(f"{again}/block_types/filter", json={}, timeout=30).json()
    assert any(block["slug"] == "secret" for block in block_types)  # the UI's block catalog is still there
    status = server_status()
    assert (status["url"], status["pid"], status["healthy"]) == (again, second.pid, True)

    # Stopped: the process ends and the state file goes.
    assert stop_server() is True
    assert not process_is_server(second.pid) and servers_of(home) == []
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
