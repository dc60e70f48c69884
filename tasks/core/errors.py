"""The one root of dupflow's errors, and the core's part of their tree.

Import-light: the command line and the job record use it. Each layer draws its part beside
its classes (docs/development.md, Errors): ``config.errors``, ``tasks.streams``,
``tasks.clients.errors``, ``tasks.sof.errors``, ``tasks.job``, ``tasks`` (steps), ``flows``::

    DupflowError                a message a user can act on; transient or terminal
    ├── UsageError              a command asked for something it cannot do as given (exit 2)
    ├── JobError                a job cannot be started or continued as asked
    ├── StepError               a step cannot go on with its input (terminal)
    ├── JsonFileError           jsonfile: a JSON file too big, too deep or broken
    └── CredentialsInUrlError   url_credentials: a URL with user:password

Outside the tree (control flow caught before a user sees it): ``tasks.streams.fanout.Cancelled``,
``tasks.streams.ndjson._InputWanted``, ``config.yaml_file._DuplicateKeyError``, ``_UnusableBlock``.
"""

from __future__ import annotations

from collections.abc import Callable


class DupflowError(Exception):
    """A failure with a message for the user; ``transient``: trying again may help."""

    def __init__(
        self,
        message: str,
        *,
        operation: str | None = None,
        status_code: int | None = None,
        transient: bool = False,
    ):
        self.message, self.operation = message, operation
        self.status_code, self.transient = status_code, transient
        super().__init__(message)

    @property
    def kind(self) -> str:
        return "transient" if self.transient else "terminal"

    def __reduce__(self) -> tuple[Callable[..., DupflowError], tuple[object, ...], object]:
        """Pickled as its class and attributes (``args`` too), never through ``__init__``.

        Why:
        - Its parameters differ by subclass: an error raised on a Dask worker came to the flow
          process as a TypeError naming ``__init__``, the real reason lost.
        """
        return type(self).__new__, (type(self),), {**self.__dict__, "args": self.args}


class StepError(DupflowError):
    """A step cannot go on with its input (a missing file, bad data, a setting)."""


class UsageError(DupflowError):
    """A command was asked for something it cannot do as given (exit 2)."""


class JobError(DupflowError):
    """A job cannot be started or continued as asked (locked, unknown, completed, …)."""
