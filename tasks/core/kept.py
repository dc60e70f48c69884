"""What a step read once, kept in its process by digest for its file tasks."""

import threading
from typing import Generic, TypeVar

T = TypeVar("T")
KEPT = 4  # a step's values at once: a job's, and a few jobs' beside it on a Dask worker


class KeptByDigest(Generic[T]):
    """The latest ``KEPT`` values given to ``keep``, by digest.

    Why: a step reads a file once (the anonymization config, the flattening's plan) and names it
    to its file tasks by digest, never as a task parameter; a process that has not seen it (a Dask
    worker) finds nothing and reads it again.
    """

    def __init__(self) -> None:
        self._values: dict[str, T] = {}
        self._lock = threading.Lock()

    def keep(self, digest: str, value: T) -> None:
        with self._lock:
            self._values.pop(digest, None)
            self._values[digest] = value
            while len(self._values) > KEPT:
                del self._values[next(iter(self._values))]

    def get(self, digest: str) -> T | None:
        with self._lock:
            return self._values.get(digest)
