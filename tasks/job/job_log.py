"""The job log's line format, the same in the flow process and in local Dask workers (``dask_worker_log``)."""

from __future__ import annotations

import logging


class JobLogFormatter(logging.Formatter):
    """The job log's lines, each naming the run it comes from as Prefect's console does ("Task run
    'flatten[a.ndjson]' - ..."), also for dupflow's own loggers called inside a task or flow run."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return f"{record.asctime} {record.levelname} {record.name}: {run_label(record)}{record.message}"


def run_label(record: logging.LogRecord) -> str:
    """``Task run 'NAME' - `` or ``Flow run 'NAME' - `` for a record logged in a run (said by Prefect's run loggers,
    else by the logging thread's run context), else nothing."""
    from prefect.context import FlowRunContext, TaskRunContext

    if task_run := getattr(record, "task_run_name", None):
        return f"Task run {task_run!r} - "
    if flow_run := getattr(record, "flow_run_name", None):
        return f"Flow run {flow_run!r} - "
    if (task_context := TaskRunContext.get()) is not None:
        return f"Task run {task_context.task_run.name!r} - "
    if (flow_context := FlowRunContext.get()) is not None and flow_context.flow_run is not None:
        return f"Flow run {flow_context.flow_run.name!r} - "
    return ""
