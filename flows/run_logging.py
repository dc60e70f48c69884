"""How a flow run logs: a failure's trace once; on a terminal, a line per event.

See docs/development.md#logging.
"""

import copy
import logging
import signal
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from logging.handlers import MemoryHandler
from pathlib import Path
from types import FrameType

from config.runtime import apply_process_defaults
from tasks.core.redaction import redact, redact_record, redact_records_sent_to_prefect
from tasks.job.job_log import PlainFormatter, job_log_handler, stream_handlers
from tasks.streams.fanout import Cancelled

RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
# their INFO (a cluster's life) goes to the job log only
DASK_LOGGERS = ("distributed", "prefect.task_runner.dask")
PREFECT_SERVICES = ("EventsWorker", "APILogWorker")
SERVICE_DRAINING = "Still processing items"  # a service handing over its queue as the run ends
# Prefect's event client and its services' threads ("Service 'EventsWorker' failed to process item
# Event(…)", the whole event on one line): a lost server is told by the API watch in two lines.
EVENT_CLIENT_NOISE = ("prefect.events.clients", "prefect._internal.concurrency")
# The stop is said once, by the command's last line; Prefect's observers of a run's controls lose a
# gone server as the API watch does, which says so in two lines.
JOB_LOG_ONLY = (
    *EVENT_CLIENT_NOISE,
    "dupflow.stop",
    "prefect.FlowRunCancellingObserver",
    "prefect.FlowRunSuspending",
)
HAND_OVER_SECONDS = 10
# distributed.nanny's WARNING when a worker takes over 4 s to end as the cluster closes: it is
# killed, the work done.
CLUSTER_TEARDOWN = "Worker process still alive after"


_traced: deque[tuple[str, str]] = deque(maxlen=64)  # the last failures' type and text


def one_trace_per_failure(record: logging.LogRecord) -> bool:
    """A logging filter: a trace on a failure's first record only (same type and text).

    Note: a task stopped by the job's stop keeps none; ``keep_one_trace_per_failure`` starts over
    for a new flow run.
    """
    if record.exc_info and (failure := record.exc_info[1]):
        identity = (type(failure).__qualname__, str(failure))
        if identity in _traced or isinstance(failure, Cancelled):
            record.exc_info, record.exc_text = None, None
        else:
            _traced.append(identity)
    return True


def keep_one_trace_per_failure() -> None:
    """At a flow run's start: one trace per failure, Prefect's own records redacted."""
    _traced.clear()
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if one_trace_per_failure not in logger.filters:
            logger.addFilter(one_trace_per_failure)
    redact_records_sent_to_prefect()


FAILED_FINISHES = (
    "Finished in state Failed",
    "Finished in state Crashed",
    "Finished in state Cancelled",
)
# Prefect's words when Ctrl+C or its own SIGTERM handler ended a run: the interruption itself
SIGNAL_CRASHES = (
    "Crash detected! Execution was aborted by an interrupt signal.",
    "Crash detected! Execution was aborted by a termination signal.",
)
_interrupted = threading.Event()


def take_interrupts() -> None:
    """Take SIGTERM, SIGINT and SIGHUP (unless ignored: ``nohup``) as Ctrl+C.

    Note: the failures they cause stay off screen.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        _interrupted.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)
    # a closed terminal or SSH session; nohup ignores it
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, interrupt)


class _OneFailureLine(logging.Filter):
    """Tell a failure once on the terminal (a run's first ERROR), none of the noise.

    Note: the job log keeps it all.
    """

    _shown = False  # set on the instance by its first ERROR

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(DASK_LOGGERS) and (
            record.levelno < logging.WARNING or str(record.msg).startswith(CLUSTER_TEARDOWN)
        ):
            return False
        if record.name in PREFECT_SERVICES and str(record.msg).startswith(SERVICE_DRAINING):
            return False
        if record.name.startswith(JOB_LOG_ONLY):
            return False
        if record.name not in RUN_LOGGERS:
            return True
        message = record.getMessage()
        if message.startswith(FAILED_FINISHES):
            return False
        if message in SIGNAL_CRASHES:
            _interrupted.set()
        if record.levelno < logging.ERROR:
            return True
        first, self._shown = not self._shown, True
        # a task failed by the fan-out's ``Cancelled`` (its exception, or its repr in the message)
        exc = record.exc_info[1] if record.exc_info else None
        cancelled = isinstance(exc, Cancelled) or f"{Cancelled.__name__}(" in message
        return first and not (_interrupted.is_set() or cancelled)


class _NoTraceback(PlainFormatter):
    """One plain line per event (all if logged ``SHOW_WHOLE``), no trace.

    Note: a failure in its words.
    """

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # the other handlers (job log, API) get the record as it was
        if record.name in RUN_LOGGERS and record.exc_info and record.exc_info[1] is not None:
            record.msg, record.args = redact(f"failed: {record.exc_info[1]}"), ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        text = super().format(record)
        return text if getattr(record, "show_whole", False) else text.split("\n")[0]


@contextmanager
def job_logging(log_file: Path) -> Iterator[None]:
    """Send every record to the job's log file; keep traces and repeats off screen.

    Note: every handler's text is plain there (Prefect's console, its debug handler, the last
    resort).
    """
    apply_process_defaults()  # before Prefect's settings are read
    file_handler = job_log_handler(log_file)
    one_failure = _OneFailureLine()
    # Each record handed on at once: a Dask LocalCluster sets the ``distributed`` logger's
    # StreamHandlers to WARNING while it runs (``silence_logs``), the file handler among them,
    # which would silence the job log for every logger.
    dask_handler = MemoryHandler(1, target=file_handler)
    logging.getLogger("distributed").addHandler(dask_handler)
    patched = [(handler, handler.formatter) for handler in stream_handlers()]
    for handler, formatter in patched:
        handler.setFormatter(_NoTraceback(formatter))
        handler.addFilter(redact_record)
        handler.addFilter(one_failure)
    try:
        yield
    finally:
        hand_over_to_prefect()
        for handler, formatter in patched:
            handler.setFormatter(formatter)
            handler.removeFilter(one_failure)  # redaction stays: one filter, maybe added elsewhere
        for name, handler in (
            ("prefect", file_handler),
            ("dupflow", file_handler),
            ("distributed", dask_handler),
        ):
            logging.getLogger(name).removeHandler(handler)
        file_handler.close()


def hand_over_to_prefect() -> None:
    """Send the run's last events and logs before the command's last line.

    Note: bounded, for an unreachable server.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        service.drain_all(timeout=HAND_OVER_SECONDS, at_exit=False)
