"""The job log of a local Dask cluster's worker processes (imported only where the job runs on Dask)."""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from tasks.core.redaction import RedactingFilter


class WorkerLogToJobLog(WorkerPlugin):
    """A Dask worker plugin: in each local worker process, the records of Dask and Tornado go to the job log and
    no longer to the stderr the process inherited (a worker that loses the closing scheduler logs an ERROR with
    its trace, a race of every shutdown)."""

    name = "dupflow-job-log"

    def __init__(self, log_file: str):
        self.log_file = log_file

    def setup(self, worker: Any) -> None:
        handler = logging.FileHandler(self.log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(RedactingFilter())
        for name in ("distributed", "tornado"):
            logger = logging.getLogger(name)
            for console in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
                logger.removeHandler(console)
            logger.addHandler(handler)
