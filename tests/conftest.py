"""Session-wide fixtures: one Prefect test API for the whole run, shared with CLI subprocesses."""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from config.runtime import apply_process_defaults
from tests.support.ports import free_port

# The two tiers (fast: no Prefect server, no process; slow: marked) and the check that no test leaves Prefect's
# settings changed; the fixtures of a real Prefect server with this repository's deployments (server, deployed, site).
pytest_plugins = [
    "tests.support.tiers",
    "tests.support.deployments",
    "tests.support.s3",
    "tests.support.postgres",
    "tests.support.nginx",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTDATA = REPO_ROOT.parent / "shared" / "testdata"

apply_process_defaults()  # as every command line sets them, before Prefect is imported
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")
# The command line's local Prefect server listens on PREFECT_SERVER_API_PORT (else 4200): never 4200 in tests.
os.environ["PREFECT_SERVER_API_PORT"] = str(free_port())


@pytest.fixture(autouse=True)
def no_caller_app_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test depends on the caller's APP_* variables (they would override every configuration under test)."""
    for name in [name for name in os.environ if name.startswith("APP_")]:
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def secrets_registered_by_the_test_end_with_it():
    """The redaction's registry of secrets as the test found it, afterwards: a command registers the secrets of the
    configuration it loads, a test worker those of thousands. Each registration compiles one pattern of every form
    of every registered secret; kept across a worker's tests, a registration grew to seconds (a 64 KB secret's forms
    among 1,200 others) and the redaction of each log record tenfold."""
    from tasks.core import redaction

    with redaction._secrets_lock:
        secrets, pattern = set(redaction._secrets), redaction._secrets_pattern
    yield
    with redaction._secrets_lock:
        redaction._secrets.clear()
        redaction._secrets.update(secrets)
        redaction._secrets_pattern = pattern


FAST_RETRY = {"initial_backoff_ms": 1, "max_backoff_ms": 5}


@pytest.fixture
def write_config(tmp_path: Path):
    """The one way a test writes a configuration file: YAML dumped from a dict tree (the YAML tree of the spec).

    ``write_config({"pipeline": {"enabled_steps": ["local_import"]}, ...})`` writes ``tmp_path/config.yaml`` (or
    ``path``) and returns its path. ``jobs_dir`` defaults to ``tmp_path/jobs``; pass ``jobs_dir=None`` to leave the
    key out. Paths anywhere in the tree may be ``Path`` objects.
    """

    def write(tree: dict, path: Path | str | None = None, *, jobs_dir: Path | str | None = tmp_path / "jobs") -> Path:
        target = Path(path) if path is not None else tmp_path / "config.yaml"
        document = {"jobs_dir": jobs_dir, **tree} if jobs_dir is not None and "jobs_dir" not in tree else tree
        target.write_text(yaml.safe_dump(plain(document), sort_keys=False), encoding="utf-8")
        return target

    return write


SECOND_POLLING = {"polling_interval": "PT1S", "max_polling_interval": "PT1S", "file_ready_interval": "PT1S"}


def extraction_tree(base_url: str, **extractor) -> dict:
    """An extraction-only configuration tree for ``write_config``: the extractor at ``base_url``, polling every
    second, with ``extractor``'s keys added (``auth=...``)."""
    return {
        "pipeline": {"enabled_steps": ["extractor"]},
        "compression": {"level": "fastest"},
        "services": {"extractor": {"base_url": base_url, **SECOND_POLLING, **extractor}},
    }


def plain(value):
    """``value`` with every ``Path`` as a string, so ``yaml.safe_dump`` takes it."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return str(value) if isinstance(value, Path) else value


@pytest.fixture
def empty_prefect_api(monkeypatch: pytest.MonkeyPatch):
    """A Prefect API that answers and knows no job (``tests.fakes.prefect_api``), as PREFECT_API_URL: ``status``,
    ``list`` and ``prune`` go by the jobs' records, in the fast tier."""
    from tests.fakes.prefect_api import start_prefect_api

    server = start_prefect_api()
    monkeypatch.setenv("PREFECT_API_URL", f"{server.base_url}/api")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_server_left_behind(request: pytest.FixtureRequest):
    """A slow test's Prefect server in a home under its ``tmp_path`` ends with the test: one left running holds a
    port, its share of the cores and its database for the rest of the run (two were, unseen, for a whole suite)."""
    if request.node.get_closest_marker("slow") is None or "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")
    yield
    from tests.support.prefect_servers import servers_under

    left = servers_under(tmp_path)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    assert left == [], f"the test left Prefect servers running (pids {left}, now killed): stop them in the test"


@pytest.fixture(scope="session", autouse=True)
def no_lasting_prefect_server():
    """A command run without the test API starts the local Prefect server of PREFECT_HOME: stop it at the end."""
    yield
    from flows.prefect_server import stop_server

    stop_server()


@pytest.fixture(scope="session")
def prefect_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Prefect database migrated once per test run, shared by its worker processes, for the servers tests start in
    PREFECT_HOMEs of their own (``seed_prefect_home``): a first start in a new home spends 10-13 s migrating one.
    A first start from nothing stays covered (``test_prefect_server``'s first test)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: the workers' common folder
    template = root / "prefect-database" / "template.db"
    with (root / "prefect-database.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker migrates; the others wait for its template
        if not template.exists():
            migrate_into(template)
    return template


def migrate_into(template: Path) -> None:
    """``prefect server database upgrade`` in a home of its own, its database copied whole to ``template``."""
    home = template.parent
    home.mkdir(parents=True, exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name != "PREFECT_API_URL"} | {"PREFECT_HOME": str(home)}
    prefect = str(Path(sys.executable).parent / "prefect")
    done = subprocess.run(
        [prefect, "server", "database", "upgrade", "-y"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    partial = template.with_suffix(".part")
    with sqlite3.connect(home / "prefect.db") as source, sqlite3.connect(partial) as copy:
        source.backup(copy)  # one file, whatever the write-ahead log still held
    partial.rename(template)


def seed_prefect_home(home: Path, database: Path) -> Path:
    """``home`` (made if missing) holding a copy of the migrated ``database`` (``prefect_database``)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(database, home / "prefect.db")
    return home


def pytest_configure(config: pytest.Config) -> None:
    if not TESTDATA.is_dir():
        raise pytest.UsageError(f"the tests read real third-party inputs from {TESTDATA}: put shared/ beside the clone")
    if "PYTEST_XDIST_WORKER" not in os.environ:
        # With PYTHONDONTWRITEBYTECODE=1 (as on CI's machines) every process a test starts would compile the modules
        # it imports again, about 0.15 s each: compiled once here, in 0.4 s (up to date: nothing is written).
        for package in ("flows", "tasks", "config", "deployments", "tests"):
            compileall.compile_dir(REPO_ROOT / package, quiet=1)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory, prefect_database: Path):
    """The local Prefect server of a temporary PREFECT_HOME, as ``start`` runs one, on a migrated database;
    PREFECT_HOME and PREFECT_API_URL are exported so CLI subprocesses use it too."""
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from flows.prefect_server import ensure_server, stop_server
    from flows.run_logging import hand_over_to_prefect
    from tests.support.prefect_servers import SERVER_TIMEOUT, kill_servers_of

    home = seed_prefect_home(tmp_path_factory.mktemp("prefect-home"), prefect_database)
    with pytest.MonkeyPatch.context() as environment:
        environment.delenv("PREFECT_API_URL", raising=False)
        environment.setenv("PREFECT_HOME", str(home))
        api_url = ensure_server(home, startup_timeout=SERVER_TIMEOUT)
        environment.setenv("PREFECT_API_URL", api_url)
        try:
            with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_HOME: str(home)}):
                # Threads a test starts begin with no context of their own: they read the global one (as in
                # Prefect's own harness).
                with _temporary_global_settings_context(get_settings_context()):
                    yield {"api_url": api_url, "database": home / "prefect.db"}
                    hand_over_to_prefect()  # else they retry a gone server at exit for a minute
        finally:
            stop_server(home)
            kill_servers_of(home)


@pytest.fixture(scope="module")
def running_flattener():
    """The fake flattening service, one per test module."""
    from tests.fakes.flattener import start_flattener

    server = start_flattener()
    yield server
    server.stop()


@pytest.fixture
def flattener_fake(running_flattener):
    """The module's fake flattening service, reset for this test."""
    running_flattener.state.reset()
    return running_flattener


def wait_until(probe, what: str = "the condition", timeout: float = 60.0, every: float = 0.02) -> None:
    """Wait for an event (``probe()`` true), never for a fixed time: a loaded machine is slow, not wrong.

    ``every``: the seconds between probes. A probe that asks a Prefect server costs it and this process some 20 ms
    of CPU; asked every 0.02 s through a 90-second wait, that was a core's worth: such a probe asks less often."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"not reached within {timeout} s: {what}"
        time.sleep(every)


def complete_results(jobs_dir: Path, task: str) -> int:
    """Persisted results of ``task`` (e.g. ``00-local_import-import-files``) written whole: a result file seen while
    Prefect still writes it does not count (a kill then makes ``continue`` redo that file, harmlessly), nor does one
    under its temporary name (``.<name>.part``, whole before it is renamed)."""
    complete = 0
    for path in jobs_dir.glob(f"*/.prefect/results/[!.]*-{task}-*"):
        try:
            json.loads(path.read_bytes())
        except ValueError:
            continue
        complete += 1
    return complete


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120):
    """Run ``python -m flows.run`` in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "flows.run", *args],
        cwd=cwd or REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass
class RanHere:
    """What ``run_cli_here`` leaves: the fields of ``run_cli``'s ``CompletedProcess`` that tests read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_cli_here(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> RanHere:
    """``run_cli`` in this process, for a command that needs no process of its own (``status``, ``list``, ``prune``,
    ``config check``, ``view run``): a subprocess costs a CPU-second to start and import. The same entry point as
    ``python -m flows.run`` (``view`` by the engine alone, as there), the same environment, working directory and
    exit code (argparse's exit too). It begins as a new process does, with no secret registered for redaction and
    no configuration read; afterwards the environment (``use_server`` exports ``PREFECT_API_URL``), the working
    directory, the redaction's registry and Prefect's global settings context are as they were. Keep ``run_cli``
    where the test is about the process: a kill, a signal, a job's lock held by the test, a job's run."""
    from config.loader import _settings_of_identity
    from config.yaml_file import _parsed_yaml
    from flows.run import main
    from flows.view_cli import main as view_main
    from tasks.core import redaction

    saved_environment, saved_cwd = dict(os.environ), Path.cwd()
    with redaction._secrets_lock:
        saved_secrets, redaction._secrets = redaction._secrets, set()
        saved_pattern, redaction._secrets_pattern = redaction._secrets_pattern, None
    _settings_of_identity.cache_clear()
    _parsed_yaml.cache_clear()
    context = sys.modules.get("prefect.context")
    saved_settings = None if context is None else context.GLOBAL_SETTINGS_CONTEXT
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env or {})
        os.chdir(cwd or REPO_ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = view_main(list(args)) if args[:1] == ("view",) else main(list(args))
            except SystemExit as exc:  # argparse's refusals, as the process would exit
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        os.environ.clear()
        os.environ.update(saved_environment)
        os.chdir(saved_cwd)
        with redaction._secrets_lock:
            redaction._secrets, redaction._secrets_pattern = saved_secrets, saved_pattern
        if (context := sys.modules.get("prefect.context")) is not None:
            if saved_settings is None:
                context.refresh_global_settings_context()  # imported meanwhile: read from the environment put back
            else:
                context.GLOBAL_SETTINGS_CONTEXT = saved_settings
    return RanHere(list(args), code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def running_pseudonymizer():
    """The pseudonymizer fake, one per test module (starting a server per test is slow)."""
    from tests.fakes.pseudonymizer import start_pseudonymizer

    server = start_pseudonymizer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def running_validator():
    """The validator fake, one per test module."""
    from tests.fakes.validator import start_validator

    server = start_validator()
    yield server
    server.stop()


@pytest.fixture
def validator_fake(running_validator):
    """The module's validator fake, with every switch and record reset."""
    running_validator.state.reset()
    return running_validator


@pytest.fixture
def pseudonymizer_fake(running_pseudonymizer):
    """The module's pseudonymizer fake, with every switch and record reset."""
    running_pseudonymizer.state.reset()
    return running_pseudonymizer


@pytest.fixture
def unused_tcp_port() -> int:
    """A free port on 127.0.0.1, for a fake started as its own process."""
    from tests.support.ports import free_port

    return free_port()
