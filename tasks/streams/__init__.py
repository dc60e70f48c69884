"""Streaming I/O: NDJSON(.zst), small files, progress, worker processes, fan-out.

Its part of the exception tree (the root's: ``tasks.core.errors``)::

    DupflowError
    ├── StepError
    │   └── NdjsonError           ndjson: a data file that cannot be read as NDJSON
    │       └── LineTooLongError, TruncatedLineError, UnsafeNameError
    └── JobWriteError             files (also OSError): the job directory cannot be written
"""
