"""Watch the Prefect API while a job runs; stop the job cleanly if it is gone.

See docs/development.md#losing-the-prefect-server.
"""

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from config.runtime import job_on_command_line, CLI
from flows.prefect_api import REFUSED, Answer, api_answer
from flows.prefect_server import prefect_home, read_record, settings_of_home
from flows.terminal import print_stderr
from tasks.core.url_credentials import shown_url
from tasks.job.layout import JobPaths

PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 5.0
LOST_AFTER = 15.0  # a server busy with a burst of runs answers within seconds; a gone one never
# without its database Prefect's client gives the run up after about 19 s
DATABASE_LOST_AFTER = 10.0
# Prefect's /ready when its database does not connect
NO_DATABASE = (503, b"Database is not available")
EXIT_FAILED = 1
SERVER_RUNS = "when the server runs again"
NOT_OURS = "not the Prefect server the job ran on"
# probes in a row: a job whose server was killed -9 once stopped saying another one answered
FOREIGN_ANSWERS = 2


class Loss(NamedTuple):
    """What a probe found missing: how long it may last, why it stops, when to resume."""

    after: float
    reason: str
    resume_when: str


@contextmanager
def api_watched(paths: JobPaths, api_url: str | None) -> Iterator[None]:
    done = threading.Event()
    if api_url is not None:
        threading.Thread(
            target=watch, args=(paths, api_url, done), name="dupflow-api-watch", daemon=True
        ).start()
    try:
        yield
    finally:
        done.set()


def watch(paths: JobPaths, api_url: str, done: threading.Event) -> None:
    """Probe until ``done``.

    Note: ``logging.raiseExceptions`` is off meanwhile, which hides Prefect's "Error logging to
    API".
    """
    answered, foreign = time.monotonic(), 0
    same = same_server(api_url)
    while not done.wait(PROBE_INTERVAL):
        loss = probe(api_url)
        foreign = foreign + 1 if loss is None and not same() else 0
        if foreign == FOREIGN_ANSWERS and not done.is_set():
            stop_job(
                paths,
                Loss(0, f"another server answers at {shown_url(api_url)}, {NOT_OURS}", SERVER_RUNS),
            )
        logging.raiseExceptions = loss is None
        if loss is None:
            answered = time.monotonic()
        elif time.monotonic() - answered >= loss.after and not done.is_set():
            stop_job(paths, loss)
    logging.raiseExceptions = True


def probe(api_url: str) -> Loss | None:
    """Say what is lost: the server or its database; None for any other answer.

    Note: a busy 503 and an old server's 404 are other answers.
    """
    status, body = api_answer(api_url, "/ready", PROBE_TIMEOUT)
    shown = shown_url(api_url)
    if not status:
        reason = f"the Prefect server at {shown} went away (no answer for {LOST_AFTER:.0f} s)"
        return Loss(LOST_AFTER, reason, SERVER_RUNS)
    if status == NO_DATABASE[0] and NO_DATABASE[1] in body:
        reason = (
            f"the Prefect server at {shown} lost its database (not available for "
            f"{DATABASE_LOST_AFTER:.0f} s)"
        )
        return Loss(DATABASE_LOST_AFTER, reason, "when the server's database runs again")
    return None


def same_server(api_url: str) -> Callable[[], bool]:
    """Whether the server at ``api_url`` is still the job's.

    Note: the home's own as ``start`` checks it (a restarted one passes: same database), another by
    unchanged settings. An answer telling nothing is taken for the job's.
    """
    home = prefect_home()
    if (record := read_record(home)) and record.url == api_url:
        return lambda: (
            (answer := shown_settings(api_url)) is None
            or settings_of_home(answer, read_record(home) or record, home)
        )
    first = shown_settings(api_url)
    return lambda: first is None or (answer := shown_settings(api_url)) is None or answer == first


def shown_settings(api_url: str) -> Answer | None:
    """Return the answer to ``/admin/settings``; None where it tells nothing.

    Note: none in time, a 5xx, 401 or 403 tell nothing.
    """
    answer = api_answer(api_url, "/admin/settings", PROBE_TIMEOUT)
    return None if not answer[0] or answer[0] in REFUSED or answer[0] >= 500 else answer


def stop_job(paths: JobPaths, loss: Loss) -> None:
    """Say why the job stopped and end the process.

    Note: no Prefect call: ``flows.job_state`` tells its run Crashed.
    """
    line = logging.LogRecord(
        "dupflow", logging.ERROR, __file__, 0, "job stopped: %s", (loss.reason,), None
    )
    for handler in logging.getLogger("dupflow").handlers:
        # job.log; the terminal gets the two lines below
        if isinstance(handler, logging.FileHandler):
            handler.handle(line)
            handler.flush()
    # after a line Prefect may have left open
    print_stderr(f"\njob {paths.job_id} stopped: {loss.reason}")
    command = f"{CLI} continue {job_on_command_line(paths.job_dir)}"
    print_stderr(f"{loss.resume_when}, resume with: {command}")
    sys.stderr.flush()
    os._exit(EXIT_FAILED)
