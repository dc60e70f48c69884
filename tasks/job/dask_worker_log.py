"""The job log of a local Dask cluster's worker processes (imported for Dask only)."""

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from tasks.job.job_log import PlainFormatter, job_log_handler, stream_handlers


class WorkerLogToJobLog(WorkerPlugin):
    """Send a worker's records of Dask, Tornado and its file tasks to the job log.

    Why: not to the inherited stderr: a worker losing the closing scheduler logs an ERROR with its
    trace at every shutdown, and a failing file's trace reached the terminal.
    Note: the UI still gets task runs' records through Prefect's handler.
    """

    name = "dupflow-job-log"

    def __init__(self, log_file: str):
        self.log_file = log_file

    def setup(self, worker: Any) -> None:
        # the job log's lines, as the flow process writes them (also Dask's, as there)
        job_log = job_log_handler(self.log_file)
        for name in ("distributed", "tornado"):
            logger = logging.getLogger(name)
            for console in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
                logger.removeHandler(console)
            logger.addHandler(job_log)
        # the root logger's console is Prefect's: not for them here
        for name in ("prefect", "dupflow"):
            logging.getLogger(name).propagate = False
        for terminal in stream_handlers():  # what still reaches the terminal: plain
            terminal.setFormatter(PlainFormatter(terminal.formatter))
