"""The terminal's failure line: Prefect's record of a run ended by a signal is the interruption's echo, not a
failure, whether our handler or Prefect's own (a flow run's SIGTERM) took the signal."""

import logging

import pytest

from flows import run_logging


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
