"""The job log of a local Dask cluster's worker processes (imported only where the job runs on Dask)."""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from tasks.core.redaction import RedactingFilter
from tasks.job.job_log import JobLogFormatter


class WorkerLogToJobLog(WorkerPlugin):
    """A Dask worker plugin: in each local worker process, the records of Dask and Tornado, and those of the file
    tasks it runs (Prefect's and dupflow's, tracebacks included), go to the job log as the flow process writes them,
    and no longer to the stderr the process inherited (a worker that loses the closing scheduler logs an ERROR with
    its trace, a race of every shutdown; a failing file's trace reached the terminal). The UI gets the task runs'
    records through Prefect's own API handler, as before."""

    name = "dupflow-job-log"

    def __init__(self, log_file: str):
        self.log_file = log_file

    def setup(self, worker: Any) -> None:
        plain = logging.FileHandler(self.log_file)
        plain.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        runs = logging.FileHandler(self.log_file)
        runs.setFormatter(JobLogFormatter())
        for handler in (plain, runs):
            handler.addFilter(RedactingFilter())
        for name in ("distributed", "tornado"):
            logger = logging.getLogger(name)
            for console in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
                logger.removeHandler(console)
            logger.addHandler(plain)
        import prefect.main  # noqa: F401  (configures Prefect's logging, which would drop a handler added before)

        for name in ("prefect", "dupflow"):  # the root logger's console is Prefect's: not for them here
            logger = logging.getLogger(name)
            logger.addHandler(runs)
            logger.propagate = False
        logging.getLogger("dupflow").setLevel(logging.INFO)
