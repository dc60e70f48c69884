"""The one root of every error dupflow raises on purpose (a message a user can act on; for a failed service call
also operation, HTTP status and transient or terminal), and the drawing of the whole tree, which
``tests/test_house_rules.py`` checks. Anything else escaping a step is a bug, logged with its traceback::

    DupflowError
    ├── ConfigError                     config.errors: every problem of a configuration, each naming key and fix
    ├── UsageError                      a command asked for something it cannot do as given (exit 2)
    ├── JobError                        a job cannot be started or continued as asked
    │   ├── JobLockedError              flows.job_state: another process works on the job
    │   └── RecordError                 tasks.job.record: a job.json that cannot be read as a job record
    ├── StepError                       a step cannot go on with its input (terminal)
    │   ├── LocalImportError            tasks.local_import
    │   ├── HttpImportError             tasks.http_import
    │   ├── SubmissionInDoubtError      tasks.extractor: a kick-off whose answer was lost
    │   ├── ExtractionError             tasks.clients.extraction_documents
    │   │   ├── InvalidCrtdlError, DeadHandleError, ExtractionCancelledError, ExtractionFailedError,
    │   │   └── ExtractionTimeoutError, NoMatchingDataError, StatusUrlMismatchError
    │   ├── DownloadError               tasks.clients.downloads
    │   │   └── FileNotReadyError, UnsafeFileNameError
    │   ├── PseudonymizationError       tasks.clients.pseudonymizer
    │   │   └── EntryTooLargeError
    │   ├── PseudonymizerStepError      tasks.pseudonymizer
    │   ├── FlattenerError              tasks.clients.flattener
    │   ├── FlatteningError             tasks.job.flattening_outcome
    │   ├── NdjsonError                 tasks.streams.ndjson: LineTooLongError, TruncatedLineError, UnsafeNameError
    │   └── EnrichmentError             tasks.job.crtdl_enrichment (also ValueError): UnresolvedLinkError
    ├── ServiceError                    tasks.clients.errors: a failed call (operation, status, transient or not)
    │   ├── TransactionRejected         tasks.clients.fhir_server
    │   └── JobNotFoundError, TransitionRefusedError, SearchRejectedError, VersionConflictError,
    │       CohortPreviewUnsupportedError                         tasks.clients.extraction_jobs
    ├── ValidationServiceError          tasks.clients.validator: a 2xx answer that is no OperationOutcome
    ├── SofError                        tasks.sof.errors (also ValueError): the SQL-on-FHIR engine
    │   ├── CrtdlError, FhirPathError, LookupFileError, ResourceLineError
    │   └── ViewError: ViewDefinitionError, ViewEvaluationError
    ├── JsonFileError                   tasks.core.jsonfile: a JSON file too big, too deep or broken
    ├── CredentialsInUrlError           tasks.core.url_credentials: a URL with user:password
    ├── JobWriteError                   tasks.streams.files (also OSError): the job directory cannot be written
    ├── TaskRunnerError                 tasks.job.filework: the configured Dask cluster cannot be used
    ├── FlowRunEndedError               tasks.job.flow_run_watch: a file task on a Dask worker whose flow run ended
    ├── ApiUnreachableError             flows.prefect_api: no Prefect API answers, or it refuses the login
    ├── ServerStartError                flows.prefect_server
    └── AutomationFileError             deployments.automations.apply

Outside the tree on purpose (control flow caught before a user sees it): ``tasks.streams.fanout.Cancelled``,
``tasks.streams.ndjson._InputWanted``, ``config.yaml_file._DuplicateKeyError`` and
``config.yaml_file._UnusableBlock``.
Import-light on purpose (no httpx, no Prefect): the command line and the job record use it.
"""

from __future__ import annotations


class DupflowError(Exception):
    """A failure with a message for the user; ``transient`` says whether trying again may help."""

    def __init__(
        self, message: str, *, operation: str | None = None, status_code: int | None = None, transient: bool = False
    ):
        self.message, self.operation = message, operation
        self.status_code, self.transient = status_code, transient
        super().__init__(message)

    @property
    def kind(self) -> str:
        return "transient" if self.transient else "terminal"

    def __reduce__(self) -> tuple:
        """Pickled as its class, ``args`` and attributes, never through its constructor, whose parameters differ by
        subclass: an error raised on a Dask worker reaches the flow process whole (it came as a TypeError naming
        ``__init__``, the real reason lost)."""
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[DupflowError], args: tuple, state: dict) -> DupflowError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class StepError(DupflowError):
    """A step cannot go on with its input (a missing file, bad data, a refused setting); terminal."""


class UsageError(DupflowError):
    """A command was asked for something it cannot do as given (exit 2)."""


class JobError(DupflowError):
    """A job cannot be started or continued as asked (locked, unknown, already completed, …)."""
