"""The command line's ``server``: start, stop, status and URL of the local server."""

import argparse
from functools import partial

from config.runtime import prefect_api_url
from flows.prefect_server import (
    ServerStartError,
    ensure_runner,
    ensure_server,
    server_status,
    stop_server,
    ui_url,
)
from flows.terminal import Commands, command_group, print_stderr
from tasks.core.url_credentials import shown_url


def register(commands: Commands) -> None:
    server_commands = command_group(
        commands, "server", "the local Prefect server (and its UI) that jobs use"
    )
    for name, command, text in (
        (
            "start",
            partial(
                print_server,
                "PREFECT_API_URL is set: jobs use {}; no local server started",
                "Prefect UI: {ui}\nAPI: {api}",
            ),
            "start the local Prefect server if none runs; print its UI URL",
        ),
        ("stop", cmd_server_stop, "stop the local Prefect server"),
        ("status", cmd_server_status, "show the local Prefect server (exit code 1 if none runs)"),
        (
            "url",  # export PREFECT_API_URL=$(… server url)
            partial(print_server, "{}", "{api}"),
            "print the API URL for PREFECT_API_URL (this home's server, started if none runs)",
        ),
    ):
        server_commands.add_parser(name, help=text).set_defaults(command=command)


def print_server(when_set: str, started: str, args: argparse.Namespace) -> int:
    """Print ``when_set`` with PREFECT_API_URL (no user info), else ``started``.

    Note: ``server start`` and ``server url``; ``started`` comes with the home's server's URLs.
    """
    if api_url := prefect_api_url():
        print(when_set.format(shown_url(api_url)))
        return 0
    try:
        api_url = ensure_server()
    except ServerStartError as exc:
        print_stderr(f"error: {exc}")
        return 1
    ensure_runner(api_url)
    print(started.format(ui=ui_url(api_url), api=api_url))
    return 0


def cmd_server_stop(args: argparse.Namespace) -> int:
    print(
        "stopped the local Prefect server"
        if stop_server()
        else "no local Prefect server was running"
    )
    return 0


def cmd_server_status(args: argparse.Namespace) -> int:
    if api_url := prefect_api_url():
        print(f"PREFECT_API_URL is set: jobs use {shown_url(api_url)}, not the local server")
    if (status := server_status()) is None:
        print("no local Prefect server is running (the next job starts one)")
        return 1
    print(f"Prefect UI: {status['ui_url']}")
    print(f"API: {status['url']} ({'healthy' if status['healthy'] else 'not answering'})")
    print(f"pid {status['pid']}, started {status['started_at']}, log {status['log']}")
    return 0
