"""``prefect …`` commands typed in a shell reach this home's server: each start of it records its API URL in the
home's Prefect profile ``dupflow`` (``flows/prefect_profile.py``), made active unless the user chose a profile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from flows.prefect_profile import recorded
from flows.prefect_server import ensure_server, stop_server
from tests.conftest import run_cli, seed_prefect_home
from tests.support.ports import free_port
from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of

pytestmark = pytest.mark.slow

PREFECT = str(Path(sys.executable).parent / "prefect")


def typed(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    """A ``prefect`` command as typed in a new shell of this home: none of the test run's Prefect settings."""
    dropped = ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_PROFILE")
    dropped += ("PREFECT_SERVER_ANALYTICS_ENABLED",)
    env = {name: value for name, value in os.environ.items() if name not in dropped} | {"PREFECT_HOME": str(home)}
    return subprocess.run([PREFECT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_database: Path):
    """A fresh PREFECT_HOME, no PREFECT_API_URL, a free port; its server's database is a file outside the home, so
    a command that started a temporary server of its own (on the home's ``prefect.db``) would not see its runs."""
    home = seed_prefect_home(tmp_path / "prefect-home", prefect_database)
    shutil.copyfile(prefect_database, tmp_path / "server.db")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", str(free_port()))
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{tmp_path / 'server.db'}")
    yield home
    stop_server(home)
    kill_servers_of(home)


def test_a_prefect_command_typed_after_dupflow_started_the_server_talks_to_that_server(own_home, tmp_path):
    """As typed, `prefect flow-run ls` started a temporary server of its own: it saw none of the jobs' runs, and a
    worker so started had no work pool."""
    api_url = ensure_server(startup_timeout=SERVER_TIMEOUT)  # as start, serve and `server url` do
    flow = httpx.post(f"{api_url}/flows/", json={"name": "dupflow"}, timeout=30).json()
    run = {"flow_id": flow["id"], "name": f"job-seen-{os.getpid()}", "state": {"type": "SCHEDULED"}}
    httpx.post(f"{api_url}/flow_runs/", json=run, timeout=30).raise_for_status()

    listed = typed("flow-run", "ls", "--output", "json", home=own_home, cwd=tmp_path)

    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert run["name"] in [seen["name"] for seen in json.loads(listed.stdout)], listed.stdout + listed.stderr
    assert "temporary server" not in listed.stdout + listed.stderr
    shown = typed("config", "view", home=own_home, cwd=tmp_path).stdout
    assert f"PREFECT_API_URL='{api_url}' (from profile)" in shown, shown
    assert "PREFECT_SERVER_ANALYTICS_ENABLED='False' (from profile)" in shown, shown  # `prefect server start` too


def test_a_job_runs_on_the_started_server_though_the_profile_named_a_gone_one(own_home, tmp_path, unused_tcp_port):
    """Prefect reads the profile's URL when the job's checks import it, before the server is started: the flow
    went to the gone server ("Failed to reach API"), unless the command has Prefect read its settings again."""
    gone = f"http://127.0.0.1:{unused_tcp_port}/api"  # the port moved: another program held it at the last start
    (own_home / "profiles.toml").write_text(f'active = "dupflow"\n\n[profiles.dupflow]\nPREFECT_API_URL = "{gone}"\n')

    done = run_cli("start", "--set", f"jobs_dir={tmp_path / 'jobs'}", "--no-progress")

    assert done.returncode == 0, done.stdout + done.stderr
    assert gone not in (own_home / "profiles.toml").read_text()


def record(home: Path, api_url: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m flows.prefect_profile API_URL`` for ``home``, as a server start runs it."""
    base = {name: value for name, value in os.environ.items() if name not in ("PREFECT_API_URL", "PREFECT_PROFILE")}
    return subprocess.run(
        [sys.executable, "-m", "flows.prefect_profile", api_url],
        env=base | {"PREFECT_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_profile_the_user_chose_stays_active_and_the_start_says_how_to_switch(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "profiles.toml").write_text(
        'active = "mine"\n\n[profiles.mine]\nPREFECT_API_URL = "https://prefect.example.org/api"\n\n'
        '[profiles.dupflow]\nPREFECT_SERVER_ANALYTICS_ENABLED = "true"\n'
    )

    done = record(home, "http://127.0.0.1:4321/api")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "`prefect` commands use the Prefect profile 'mine', not this home's server: "
        "`uv run prefect profile use dupflow` points them at it"
    )
    written = tomllib.loads((home / "profiles.toml").read_text())
    assert written["active"] == "mine"
    assert written["profiles"]["mine"] == {"PREFECT_API_URL": "https://prefect.example.org/api"}
    assert written["profiles"]["dupflow"]["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"
    assert written["profiles"]["dupflow"]["PREFECT_SERVER_ANALYTICS_ENABLED"].lower() == "true"  # the user's


def test_prefects_default_profile_gives_way_unless_the_user_changed_it_or_chose_one(tmp_path):
    fresh, changed, chosen = (tmp_path / name for name in ("fresh", "changed", "chosen"))
    for home in (fresh, changed, chosen):
        home.mkdir()
    (changed / "profiles.toml").write_text('[profiles.ephemeral]\nPREFECT_LOGGING_LEVEL = "DEBUG"\n')

    assert record(fresh, "http://127.0.0.1:4321/api").stdout == ""
    assert "profile 'ephemeral'" in record(changed, "http://127.0.0.1:4321/api").stdout
    assert "profile 'ephemeral'" in record(chosen, "http://127.0.0.1:4321/api", PREFECT_PROFILE="ephemeral").stdout

    assert tomllib.loads((fresh / "profiles.toml").read_text())["active"] == "dupflow"
    # a restart on the kept port pays no Prefect import: the file already says it
    assert recorded(fresh, "http://127.0.0.1:4321/api") and not recorded(fresh, "http://127.0.0.1:4322/api")
    assert not recorded(changed, "http://127.0.0.1:4321/api")  # another profile active
    assert tomllib.loads((changed / "profiles.toml").read_text())["active"] == "ephemeral"
    assert tomllib.loads((chosen / "profiles.toml").read_text())["active"] == "ephemeral"
