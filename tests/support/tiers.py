"""The two test tiers, checked rather than hoped (a pytest plugin, loaded by ``tests/conftest.py``).

``pytest -m "not slow"`` is the fast tier: pure functions, the engine, the configuration, the clients against fakes
served in this process (threads). A test that needs a Prefect server, a subprocess or a real third-party server
(moto, sekmet) is marked ``slow``. Here:

- a test not marked slow that asks for a fixture of ``SLOW_FIXTURES`` fails before that fixture starts;
- while a test not marked slow runs, Prefect's API (setting and environment) is a closed local port and starting a
  process (``subprocess``, ``asyncio``'s subprocesses, ``multiprocessing``, ``os.fork``) raises ``SlowOnlyError``:
  a test that reaches either fails loudly instead of starting a server or a child;
- the modules of slow tests run first (``pytest_collection_modifyitems``), so that with ``-n 4 --dist loadscope``
  the fast modules fill the end of the run on every worker;
- every test, of either tier, must leave the ``PREFECT_*`` environment and Prefect's API setting as it found them
  (``flows.prefect_server.use_server`` exports ``PREFECT_API_URL`` for the whole process): one that does not fails,
  and what it changed is put back for the tests after it.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator

import pytest

# Fixtures that start a Prefect server, a process or a real third-party server: only slow tests may use them.
SLOW_FIXTURES = frozenset(
    {
        "prefect_api",
        "prefect_database",
        "moto_url",
        "moto_s3",
        "https_s3",
        "sekmet",
        "nginx_front",
        "postgres",
        "postgres_url",
    }
)


class SlowOnlyError(RuntimeError):
    """A test not marked ``slow`` reached for a process or a Prefect server."""


def pytest_configure(config: pytest.Config) -> None:
    """xdist's loadscope would hand out modules by their number of tests, most first: the slowest modules (a real
    server, a few tests) then start last and one worker waits for the other. The order below is kept instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules by their share of slow tests, most first (all-slow modules, with their servers, at the start); a
    module's tests keep their order. The same on every xdist worker, as it must be."""
    module_of = {item: item.nodeid.split("::", 1)[0] for item in items}
    tests = Counter(module_of.values())
    slow = Counter(module_of[item] for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[module_of[item]] / tests[module_of[item]])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture is set up: a test not marked slow may not use a slow fixture."""
    if item.get_closest_marker("slow") is None and (used := SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
        pytest.fail(f"a test that uses {', '.join(sorted(used))} must be marked slow", pytrace=False)


def prefect_state() -> dict[str, str | None]:
    """The ``PREFECT_*`` environment and the API URL of Prefect's current settings. Prefect is imported here, before
    the test's fixtures: imported first under a fixture's ``PREFECT_API_URL``, its global settings kept that URL."""
    from prefect.settings import get_current_settings

    state: dict[str, str | None] = {name: value for name, value in os.environ.items() if name.startswith("PREFECT_")}
    url = get_current_settings().api.url
    state["<prefect settings: api.url>"] = None if url is None else str(url)
    return state


@pytest.fixture(autouse=True)
def prefect_settings_kept() -> Iterator[None]:
    """Fail a test that leaves a ``PREFECT_*`` variable or Prefect's API URL changed, and put the variables back.

    Set up before every other function-scoped fixture (it is the first autouse one and asks for none), so it looks
    after they, ``monkeypatch`` included, have undone their changes; session and module fixtures (``prefect_api``)
    are set up before it and torn down after it, so what they export is part of the state it keeps."""
    before = prefect_state()
    yield
    after = prefect_state()
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    if not changed:
        return
    for name in changed:
        if name.startswith("PREFECT_"):
            if before.get(name) is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before[name]
    details = ", ".join(f"{name}: {before.get(name)!r} -> {after.get(name)!r}" for name in changed)
    pytest.fail(f"the test left Prefect's settings changed (restore them, e.g. with monkeypatch): {details}")


@pytest.fixture(scope="session")
def closed_port() -> Iterator[int]:
    """A loopback port bound but never listening: a connection to it is refused, and no server can take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


_dead_api_settings: dict[str, tuple[object, list[tuple[str, str]], object]] = {}


def dead_api_settings(settings, dead_api: str):
    """``settings`` with the API at ``dead_api`` and no client retries, as ``temporary_settings`` makes them; made
    once for as long as the settings and the PREFECT_* environment they are read with stay the same: making them
    (a Prefect ``Settings`` of some 50 sections, each read from the environment) cost 50 ms of CPU, for each of the
    2,400 fast tests."""
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES

    environment = sorted((name, value) for name, value in os.environ.items() if name.startswith("PREFECT_"))
    kept = _dead_api_settings.get(dead_api)
    if kept is None or kept[0] is not settings or kept[1] != environment:
        updates = {PREFECT_API_URL: dead_api, PREFECT_CLIENT_MAX_RETRIES: 0}
        kept = _dead_api_settings[dead_api] = (settings, environment, settings.copy_with_update(updates=updates))
    return kept[2]


def refuse(what: str):
    def refused(*args, **kwargs):
        raise SlowOnlyError(f"{what} in a test not marked slow: mark it @pytest.mark.slow")

    return refused


@pytest.fixture(autouse=True)
def fast_tier_guard(prefect_settings_kept, request: pytest.FixtureRequest):
    """For a test not marked slow: no Prefect server (the API is a closed port) and no process start.

    Its own ``MonkeyPatch``, not the test's: set up before the test's ``monkeypatch`` and torn down after it, it
    finds a PREFECT_API_URL that the test set without ``monkeypatch`` still there, and fails the test."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    from prefect.context import SettingsContext, get_settings_context

    dead_api = f"http://127.0.0.1:{request.getfixturevalue('closed_port')}/api"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_API_URL", dead_api)
        patch.setattr(subprocess.Popen, "_execute_child", refuse("a subprocess"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse("a multiprocessing process"))
        patch.setattr(os, "fork", refuse("os.fork"))
        patch.setattr(os, "posix_spawn", refuse("os.posix_spawn"))
        context = get_settings_context()
        with SettingsContext(profile=context.profile, settings=dead_api_settings(context.settings, dead_api)):
            yield
        left = os.environ.get("PREFECT_API_URL")
    if left != dead_api:
        pytest.fail(f"the test left PREFECT_API_URL changed (restore it, e.g. with monkeypatch): {left!r}")
