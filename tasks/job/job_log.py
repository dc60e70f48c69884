"""The job log's line format, the same in the flow process and in Dask workers.

Note: also the plain text of every log line a terminal shows.
"""

import logging
from pathlib import Path

from tasks.core.readable import plain_multiline
from tasks.core.redaction import redact_record


class JobLogFormatter(logging.Formatter):
    """Format the job log's lines, each naming its run as Prefect's console does.

    Note: e.g. "Task run 'flatten[a.ndjson]' - ...", also for dupflow's own loggers called inside a
    task or flow run.
    Note: plain text (``plain_multiline``), a traceback whole: ``cat job.log`` is a terminal too.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return (
            f"{record.asctime} {record.levelname} {record.name}: "
            f"{run_label(record)}{record.message}"
        )

    def format(self, record: logging.LogRecord) -> str:
        return plain_multiline(super().format(record))


def job_log_handler(log_file: str | Path) -> logging.FileHandler:
    """Send ``prefect``'s and ``dupflow``'s records (INFO up) to the job log, redacted.

    Note: Prefect's logging is configured first: configuring it drops a handler added before.
    """
    import prefect.main  # noqa: F401

    handler = logging.FileHandler(log_file)
    handler.setFormatter(JobLogFormatter())
    handler.addFilter(redact_record)
    for name in ("prefect", "dupflow"):
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("dupflow").setLevel(logging.INFO)
    return handler


class PlainFormatter(logging.Formatter):
    """Make ``wrapped``'s text plain: a record's message, arguments and trace.

    Why: a job's input, a file's name or a service's error text may hold escape sequences; on a
    terminal they would clear the screen, set its title or forge a line. Prefect's records too.
    """

    def __init__(self, wrapped: logging.Formatter | None = None) -> None:
        super().__init__()
        self._wrapped = wrapped or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return plain_multiline(self._wrapped.format(record))


def stream_handlers() -> list[logging.Handler]:
    """Every handler that writes to a stream (the terminal), the last resort's too.

    Note: once, though several loggers hold it (patched twice, it kept the wrapper).
    """
    loggers = [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]
    handlers = dict.fromkeys([*(h for log in loggers for h in log.handlers), logging.lastResort])
    return [
        h
        for h in handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]


def run_label(record: logging.LogRecord) -> str:
    """``Task run 'NAME' - `` or ``Flow run 'NAME' - `` for a record logged in a run.

    Note: said by Prefect's run loggers, else by the logging thread's run context; outside a run,
    nothing.
    """
    from prefect.context import FlowRunContext, TaskRunContext

    if task_run := getattr(record, "task_run_name", None):
        return f"Task run {task_run!r} - "
    if flow_run := getattr(record, "flow_run_name", None):
        return f"Flow run {flow_run!r} - "
    if task_context := TaskRunContext.get():
        return f"Task run {task_context.task_run.name!r} - "
    if (flow_context := FlowRunContext.get()) is not None and flow_context.flow_run is not None:
        return f"Flow run {flow_context.flow_run.name!r} - "
    return ""
