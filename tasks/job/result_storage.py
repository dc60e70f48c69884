"""The job's results folder as Prefect's result storage, checked and written whole.

See ``tasks.job.result_records`` for what a record must be; docs/development.md for the step
contract.
"""

import logging
from typing import Any

from prefect._internal.compatibility.async_dispatch import async_dispatch
from prefect.filesystems import LocalFileSystem
from prefect.transactions import get_transaction

from tasks.job.record import RecordError
from tasks.job.result_records import checked_result
from tasks.streams.files import write_file_atomically

REJECTED_PREFIX = "rejected-"
log = logging.getLogger("dupflow.results")


class JobResultStorage(LocalFileSystem):
    """A job's ``.prefect/results``: records decoded only once checked, written whole.

    Note: a record that fails the check is set aside as ``rejected-<name>`` and named in one line;
    Prefect takes it as missing, so the task runs again.
    Why: ``LocalFileSystem`` writes in place: a full disk left 0-byte records.
    Note: the async methods run the sync ones (``_sync=True``: Prefect's ``async_dispatch``).
    """

    _block_type_name = "dupflow job results"

    async def aread_path(self, path: str) -> bytes:
        # async_dispatch's _sync keyword runs the sync method (typed as the async one)
        return self.read_path(path, _sync=True)  # type: ignore[call-arg, return-value]

    @async_dispatch(aread_path)
    def read_path(self, path: str) -> bytes:  # type: ignore[override]  # as LocalFileSystem's own
        record = self._resolve_path(path)
        if not record.exists():
            raise ValueError(f"Path {record} does not exist.")  # LocalFileSystem's: a cache miss
        try:
            return checked_result(record)
        except RecordError as exc:  # kept under another name: nothing is lost; said once
            kept = record.with_name(REJECTED_PREFIX + record.name)
            record.replace(kept)
            log.warning("%s: kept as %s; its work is done again", exc, kept.name)
            raise

    async def awrite_path(self, path: str, content: bytes) -> str:
        # async_dispatch's _sync keyword runs the sync method (typed as the async one)
        return self.write_path(path, content, _sync=True)  # type: ignore[call-arg, return-value]

    @async_dispatch(awrite_path)
    def write_path(self, path: str, content: bytes) -> str:  # type: ignore[override]  # likewise
        record = self._resolve_path(path)
        write_file_atomically(record, content)
        return str(record)


def persist_in_task(value: Any) -> None:
    """Write the running task's result record now, so a failed write fails the task.

    Why: Prefect writes it when the task's transaction commits, after the run is Completed, and only
    logs a failure there: a job on a full disk went on and ended Completed with 0-byte records.
    """
    txn = get_transaction()
    if txn is None or txn.store is None or txn.key is None or not txn.write_on_commit:
        return
    txn.store.persist_result_record(txn.store.create_result_record(value, key=txn.key))
    txn.write_on_commit = False  # written: the commit has nothing left to write
