"""The terminal's failure line: Prefect's record of a run ended by a signal is the interruption's echo, not a
failure, whether our handler or Prefect's own (a flow run's SIGTERM) took the signal.

And every text a handler writes to the terminal or the job log is plain: escape sequences in a
record's message, arguments or exception become spaces there."""

import io
import logging
import sys
import uuid

import pytest

from flows import run_logging
from tasks.job.job_log import JobLogFormatter
from tests.support.hostile_text import HOSTILE, NOT_PLAIN, assert_plain


@pytest.fixture
def console_filter():
    yield run_logging._OneFailureLine()
    run_logging._interrupted.clear()


def record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("prefect.task_runs", level, __file__, 1, message, None, None)


@pytest.mark.parametrize("crash", run_logging.SIGNAL_CRASHES, ids=["interrupt", "termination"])
def test_prefects_crash_record_of_a_signal_stays_off_the_terminal_and_so_do_the_failures_after_it(
    console_filter, crash
):
    assert not console_filter.filter(record(crash))  # the run's first ERROR, yet no failure
    assert not console_filter.filter(record("Task run failed with exception: TerminationSignal()"))
    assert console_filter.filter(record("extraction: Pending", logging.INFO))


def test_a_failure_without_a_signal_shows_once(console_filter):
    assert console_filter.filter(record("Task run failed with exception: ValueError('no JSON')"))
    assert not console_filter.filter(record("Flow run failed with exception: ValueError('no JSON')"))
    assert not console_filter.filter(record("Finished in state Failed('no JSON')"))


def test_the_local_clusters_teardown_warning_stays_off_the_terminal_and_other_dask_warnings_show(console_filter):
    """On a loaded machine a worker may take over 4 s to end as the cluster closes; the nanny kills it and says so.
    The run's work is done: a line of the cluster's life, for the job log only."""
    teardown = "Worker process still alive after 4.0 seconds, killing"
    assert not console_filter.filter(
        logging.LogRecord("distributed.nanny", logging.WARNING, "", 1, teardown, None, None)
    )
    lost = "Removing worker 'tcp://127.0.0.1:1' caused the cluster to lose scattered data"
    assert console_filter.filter(logging.LogRecord("distributed.scheduler", logging.WARNING, "", 1, lost, None, None))


def test_prefects_services_handing_over_the_runs_last_events_stay_off_the_terminal(console_filter):
    """CI under load: the events worker's note came after the command's last line ("interrupted; resume with: …").
    ``job_logging`` hands the events over before that line; its note is for the job log."""
    for service in run_logging.PREFECT_SERVICES:
        note = logging.LogRecord(
            service, logging.WARNING, "", 1, "Still processing items: 1 items remaining...", None, None
        )
        assert not console_filter.filter(note)


def test_prefects_event_client_noise_stays_off_the_terminal_and_other_prefect_warnings_show(console_filter):
    """With its server killed, Prefect's event client warned of the websocket and its services' machinery logged
    each undelivered event whole (2.4-2.9 kB on one line): the API watch tells the loss in two lines; these records
    are for the job log. Prefect's other warnings still show."""
    event = "Event(occurred=DateTime(2026, 11, 26), event='prefect.task-run.Completed', resource=" + "x" * 2500 + ")"
    noise = [
        ("prefect.events.clients", logging.WARNING, "Unable to connect to 'ws://127.0.0.1:4578/api/events/in'.", ()),
        (
            "prefect._internal.concurrency",
            logging.ERROR,
            "Service %r failed to process item %r",
            ("EventsWorker", event),
        ),
    ]
    for name, level, message, args in noise:
        assert not console_filter.filter(logging.LogRecord(name, level, "", 1, message, args, None))
    other = logging.LogRecord("prefect.flow_runs", logging.WARNING, "", 1, "a flow run warning", None, None)
    assert console_filter.filter(other)


def hostile_failure(logger: str = "prefect.task_runs") -> logging.LogRecord:
    """A task's failure record as Prefect logs it, escapes in its message, arguments, exception."""
    try:
        raise ValueError(f"import directory {HOSTILE}")
    except ValueError:
        failure = sys.exc_info()
    message = f"Task {HOSTILE} failed: %s"
    return logging.LogRecord(logger, logging.ERROR, __file__, 1, message, (HOSTILE,), failure)


def test_the_terminal_tells_a_run_loggers_failure_with_escape_sequences_in_one_plain_line():
    line = run_logging._NoTraceback(logging.Formatter()).format(hostile_failure())
    assert line.startswith("failed: import directory run [2J ]0;owned") and "\n" not in line, line
    assert_plain(line)


def test_the_terminal_shows_a_records_message_and_arguments_whole_and_plain_on_one_line():
    """A carriage return or line separator in the message forges no line and cuts none short."""
    record = hostile_failure("dupflow.flattening")
    line = run_logging._NoTraceback(logging.Formatter()).format(record)
    assert line.count("exe.gnp") == 2 and "Traceback" not in line, line
    assert_plain(line)


def test_a_record_shown_whole_keeps_its_own_lines_each_plain():
    record = logging.LogRecord("dupflow.send", logging.INFO, "", 1, f"sent:\n{HOSTILE}", None, None)
    record.show_whole = True
    text = run_logging._NoTraceback(logging.Formatter()).format(record)
    assert text.split("\n")[0] == "sent:" and text.count("\n") == 1, text
    assert_plain(text)


def test_the_job_log_keeps_a_records_whole_text_and_trace_plain():
    text = JobLogFormatter().format(hostile_failure())
    assert "Traceback (most recent call last):" in text and text.count("exe.gnp") == 3, text
    assert text.endswith("ValueError: import directory run [2J ]0;owned  x 31m exe.gnp  y z"), text
    assert_plain(text)


def test_a_job_run_makes_every_stream_handler_write_plain_prefects_console_and_the_last_resort_too(
    tmp_path, monkeypatch
):
    """``job_logging`` reaches the handlers, not the call sites: Prefect's console (Rich), the last
    resort (a record of a logger without handlers) and the job log, whoever logged the record."""
    from prefect.logging.handlers import PrefectConsoleHandler

    shown, last = io.StringIO(), io.StringIO()
    console = PrefectConsoleHandler(stream=shown)
    with_console = logging.getLogger("dupflow.test-console")
    alone = logging.getLogger("dupflow.test-alone")
    for logger in (with_console, alone):
        monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logging, "lastResort", logging.StreamHandler(last))
    with_console.addHandler(console)
    try:
        with run_logging.job_logging(tmp_path / "job.log"):
            failure = hostile_failure("dupflow.test-console")
            with_console.handle(failure)
            alone.warning("%s", HOSTILE)
            logging.getLogger("dupflow.test").error("%s", HOSTILE, exc_info=failure.exc_info)
    finally:
        with_console.removeHandler(console)
    terminal = shown.getvalue()
    assert terminal.count("\n") == 1 and "Traceback" not in terminal, terminal
    assert_plain(terminal)
    assert_plain(last.getvalue())
    job_log = (tmp_path / "job.log").read_bytes().decode()  # as bytes: as text, a CR ends a line
    assert "Traceback (most recent call last):" in job_log, job_log
    assert NOT_PLAIN.search(job_log) is None, job_log


def test_a_task_stopped_with_its_jobs_run_is_logged_without_a_trace_a_failure_with_one():
    """A Cancel stops a step's file tasks with ``Cancelled``: the UI's log showed each with a 20-line traceback."""
    from flows.run_logging import one_trace_per_failure
    from tasks.streams.fanout import Cancelled

    def record(exc: BaseException) -> logging.LogRecord:
        try:
            raise exc
        except BaseException:
            failed = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
        one_trace_per_failure(failed)
        return failed

    assert record(Cancelled("the run was interrupted")).exc_info is None
    text = f"a bad line ({uuid.uuid4()})"  # the filter remembers failures for the process: a new one
    assert record(ValueError(text)).exc_info is not None
    assert record(ValueError(text)).exc_info is None, "the same failure again is logged without a trace"
