"""How a flow run logs: each failure's trace once (Prefect logs it at every run it passes through), and, for a run
started from the command line, the job's log file with everything in it while the terminal gets one line per
event, no traceback, and a failure only once.
"""

from __future__ import annotations

import copy
import logging
import signal
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from config.runtime import apply_prefect_defaults
from tasks.core.redaction import RedactingFilter, redact, redact_records_sent_to_prefect
from tasks.job.job_log import JobLogFormatter
from tasks.streams.fanout import Cancelled

RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
DASK_LOGGERS = ("distributed", "prefect.task_runner.dask")  # their INFO (a cluster's life) goes to the job log only
PREFECT_SERVICES = ("EventsWorker", "APILogWorker")
SERVICE_DRAINING = "Still processing items"
"""Prefect's note while a service hands its queued events or logs to the server as the run ends: for the job log."""
EVENT_CLIENT_NOISE = ("prefect.events.clients", "prefect._internal.concurrency")
"""Prefect's event client (no websocket to the API) and its services' thread machinery ("Service 'EventsWorker'
failed to process item Event(…)", the whole event, kilobytes on one line): where the server is lost, the API watch
says so in two lines; these are for the job log."""
HAND_OVER_SECONDS = 10
CLUSTER_TEARDOWN = "Worker process still alive after"
"""distributed.nanny's WARNING when a worker takes more than 4 s to end as the local cluster closes (a loaded
machine): it is killed and joined, the run's work is done; a line of the cluster's life, for the job log only."""


class OneTracePerFailure(logging.Filter):
    """Prefect logs a failure with its trace at every run it passes through (file task, step task, flow run): the
    first record keeps the trace, later records of the same failure (same type and text) keep their one line.
    ``forget`` starts over for a new flow run, so a later job failing the same way gets its trace too."""

    def __init__(self) -> None:
        super().__init__()
        self._traced: deque[tuple[str, str]] = deque(maxlen=64)

    def forget(self) -> None:
        self._traced.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and (failure := record.exc_info[1]) is not None:
            identity = (type(failure).__qualname__, str(failure))
            if identity in self._traced:
                record.exc_info, record.exc_text = None, None
            else:
                self._traced.append(identity)
        return True


_one_trace = OneTracePerFailure()


def keep_one_trace_per_failure() -> None:
    """On Prefect's run loggers, so the console, the job log and the UI's run log all get one trace, and on the
    handlers that send records to Prefect's API the redaction job.log has: Prefect's own records ("Task run failed
    with exception", its traceback) reach the server redacted (idempotent); called at the start of each flow run."""
    _one_trace.forget()
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _one_trace not in logger.filters:
            logger.addFilter(_one_trace)
    redact_records_sent_to_prefect()


FAILED_FINISHES = ("Finished in state Failed", "Finished in state Crashed")
SIGNAL_CRASHES = (
    "Crash detected! Execution was aborted by an interrupt signal.",
    "Crash detected! Execution was aborted by a termination signal.",
)
"""What Prefect logs when its own handler (a flow run's SIGTERM) or Ctrl+C ended a run: the interruption itself."""
_interrupted = threading.Event()


def take_interrupts() -> None:
    """SIGTERM, and SIGINT and SIGHUP unless they are ignored (a job started in the background, ``nohup``), interrupt
    the run as Ctrl+C does, and from then on its tasks' failures (a worker process ended by the same Ctrl+C, a
    fan-out cancelled) stay off the terminal: they are the interruption's echo; the one line ``run_job`` prints says
    it all. (During a flow run Prefect's own SIGTERM handler raises instead; a cancelled fan-out's failure is known
    by its type.)"""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        _interrupted.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # a closed terminal or SSH session; nohup ignores it
        signal.signal(signal.SIGHUP, interrupt)


class _OneFailureLine(logging.Filter):
    """The terminal tells a failure once (Prefect logs it at every run it passes): only the first ERROR of a run,
    and no "Finished in state Failed/Crashed" line; nor Dask's INFO and its teardown warning (``CLUSTER_TEARDOWN``).
    Nor Prefect's services' notes as they hand over the run's last events (``SERVICE_DRAINING``), nor its event
    client's and services' failures (``EVENT_CLIENT_NOISE``). The job log and the UI keep them all."""

    def __init__(self) -> None:
        super().__init__()
        self._shown = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(DASK_LOGGERS) and (
            record.levelno < logging.WARNING or str(record.msg).startswith(CLUSTER_TEARDOWN)
        ):
            return False
        if record.name in PREFECT_SERVICES and str(record.msg).startswith(SERVICE_DRAINING):
            return False
        if record.name.startswith(EVENT_CLIENT_NOISE):
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
        return first and not (_interrupted.is_set() or _tells_a_cancelled_fan_out(record))


def _tells_a_cancelled_fan_out(record: logging.LogRecord) -> bool:
    """A task's failure by the fan-out's ``Cancelled``: its exception, or (Prefect's "Task run failed with
    exception: Cancelled(...)", logged where no exception is at hand any more) its repr in the message."""
    exc = record.exc_info[1] if record.exc_info else None
    return isinstance(exc, Cancelled) or f"{Cancelled.__name__}(" in record.getMessage()


class _NoTraceback(logging.Formatter):
    """Console lines without tracebacks: one line per event (all lines of one logged with ``SHOW_WHOLE``, such as
    the inspection text at a wait step); a run's failure in the exception's own words (with the hint), not its repr."""

    def __init__(self, wrapped: logging.Formatter | None):
        super().__init__()
        self._wrapped = wrapped or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # the other handlers (job log, API) get the record as it was
        if record.name in RUN_LOGGERS and record.exc_info and record.exc_info[1] is not None:
            record.msg, record.args = redact(f"failed: {record.exc_info[1]}"), ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        text = self._wrapped.format(record)
        return text if getattr(record, "show_whole", False) else text.splitlines()[0]


class _HandTo(logging.Handler):
    """Hands each record to ``target``. No StreamHandler: a Dask LocalCluster sets those of the ``distributed``
    logger to WARNING while it runs (``silence_logs``), which would silence the job log for every logger."""

    def __init__(self, target: logging.Handler):
        super().__init__()
        self._target = target

    def emit(self, record: logging.LogRecord) -> None:
        self._target.handle(record)


@contextmanager
def job_logging(log_file: Path) -> Iterator[None]:
    """Send every log record (with tracebacks, each line naming its run) to the job's log file, and keep
    tracebacks and repeats of a failure off the terminal."""
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(JobLogFormatter())
    file_handler.addFilter(RedactingFilter())
    redacting, one_failure = RedactingFilter(), _OneFailureLine()
    apply_prefect_defaults()
    import prefect.main  # noqa: F401  (configures Prefect's logging, once per process; patched below)

    attached = [("prefect", file_handler), ("dupflow", file_handler), ("distributed", _HandTo(file_handler))]
    for name, handler in attached:
        logging.getLogger(name).addHandler(handler)
    patched = [(handler, handler.formatter) for handler in _console_handlers()]
    for handler, formatter in patched:
        handler.setFormatter(_NoTraceback(formatter))
        handler.addFilter(redacting)
        handler.addFilter(one_failure)
    logging.getLogger("dupflow").setLevel(logging.INFO)
    try:
        yield
    finally:
        hand_over_to_prefect()
        for handler, formatter in patched:
            handler.setFormatter(formatter)
            handler.removeFilter(redacting)
            handler.removeFilter(one_failure)
        for name, handler in attached:
            logging.getLogger(name).removeHandler(handler)
        file_handler.close()


def hand_over_to_prefect() -> None:
    """Let Prefect's services send the run's last events and logs now, while the job log is open and before the
    command's own last line: left to the interpreter's exit, a service still holding items tells so on the terminal
    after that line. Bounded, as an unreachable server would hold the command."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        service.drain_all(timeout=HAND_OVER_SECONDS, at_exit=False)


def _console_handlers() -> list[logging.Handler]:
    """Every stream handler once, though several loggers may hold it (patched twice, it kept the wrapper)."""
    handlers: dict[logging.Handler, None] = {}
    for logger in [logging.getLogger(), *(logging.getLogger(n) for n in logging.root.manager.loggerDict)]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handlers[handler] = None
    return list(handlers)
