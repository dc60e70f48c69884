"""The one root of every error dupflow raises on purpose.

Every deliberate failure is a ``DupflowError``: it carries a message a user can act on and, where a service
call failed, the operation, the HTTP status (None for network errors) and whether it is transient (worth
retrying) or terminal, as the spec's Errors section describes. Anything else that escapes a step is a bug
and is reported with its traceback in the job log.

Import-light on purpose (no httpx, no Prefect): the command line and the job record use it.
"""

from __future__ import annotations


class DupflowError(Exception):
    """A failure with a message for the user; ``transient`` says whether trying again may help."""

    def __init__(
        self,
        message: str,
        *,
        operation: str | None = None,
        status_code: int | None = None,
        transient: bool = False,
    ):
        self.message = message
        self.operation = operation
        self.status_code = status_code
        self.transient = transient
        super().__init__(message)

    @property
    def kind(self) -> str:
        return "transient" if self.transient else "terminal"


class StepError(DupflowError):
    """A step cannot go on with its input (a missing file, bad data, a refused setting); terminal."""


class JobError(DupflowError):
    """A job cannot be started or continued as asked (locked, unknown, already completed, …)."""
