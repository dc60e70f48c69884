"""The typed settings of dupflow: the root of the YAML tree.

Its ``services`` blocks are in config.services; here the ``pipeline`` block (step names and
their order), the small blocks, and the rules that depend on the enabled steps: checked only for
the steps that are enabled, so an unused block may stay half configured.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections import Counter
from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from config.durations import Duration
from config.fields import (
    ConfigModel,
    OptionalPath,
    OptionalStr,
    Problem,
    StrList,
    emit_warning,
    env_var_name,
    positive,
    raise_problems,
    refuse_control_characters,
    refuse_invisible_url_characters,
    zero_means,
)
from config.services import SendSettings, ServicesSettings
from tasks.core.url_credentials import has_user_info

# The one list of step names, then their kinds: the configuration checks enabled_steps by them,
# tasks.job.layout names the import steps' folder by them, and the flow gives each step the output
# of the last data step or gate before it (validation and send pass their input on).
STEP_NAMES = (
    "extractor",
    "local_import",
    "http_import",
    "pseudonymizer",
    "wait",
    "flattening",
    "send",
    "validation",
)
IMPORT_STEPS = ("extractor", "local_import", "http_import")
# the steps that write data the next steps read
DATA_STEPS = (*IMPORT_STEPS, "pseudonymizer", "flattening")
# the gates, the only steps that may be listed more than once: the next step reads their
# corrections, else their input
GATE_STEPS = ("wait",)
REMOVED_STEPS = {"csv_conversion": "flattening", "parquet_conversion": "flattening"}
MAX_LISTED_UNKNOWN_STEPS = 5
_NO_CRTDL_WITH_HTTP_IMPORT = (
    "the flattening step needs a CRTDL, which a job of http_import cannot be given (its one input "
    "is the URL of the NDJSON file); download the file and import its folder with local_import "
    "(start CONFIG CRTDL --dir DATA), or extract with extractor"
)
# Validation checks NDJSON and a direct send loads it: after the flattening (CSV) they failed once
# every step before them had run, and a job's steps are fixed at its start.
_VALIDATION_AFTER_FLATTENING = (
    "has validation after flattening, so validation would get the flattening's CSV files, but it "
    "checks FHIR resources (NDJSON); put validation before flattening"
)
_DIRECT_SEND_AFTER_FLATTENING = (
    "is direct_resource_load, which loads FHIR resources (NDJSON), but send comes after "
    "flattening in pipeline.enabled_steps and would get its CSV files; put send before "
    "flattening, or send the CSV files with send_as s3_upload or transfer_load"
)


def _step_name_problems(steps: list[str]) -> list[str]:
    problems = []
    counts = Counter(steps)
    if unknown := [step for step in counts if step not in STEP_NAMES and step not in REMOVED_STEPS]:
        shown = ", ".join(f"'{step}'" for step in unknown[:MAX_LISTED_UNKNOWN_STEPS])
        more = (
            f" and {len(unknown) - MAX_LISTED_UNKNOWN_STEPS} more"
            if len(unknown) > MAX_LISTED_UNKNOWN_STEPS
            else ""
        )
        problems.append(f"unknown step {shown}{more}; valid steps are {', '.join(STEP_NAMES)}")
    problems += [
        f"step {step} was a placeholder and no longer exists; use {REMOVED_STEPS[step]} "
        "instead (it produces CSV through the flattening service)"
        for step in counts
        if step in REMOVED_STEPS
    ]
    once_only = set(STEP_NAMES) - set(GATE_STEPS + IMPORT_STEPS)
    duplicates = sorted(step for step, count in counts.items() if count > 1 and step in once_only)
    return problems + [f"step {step} is listed more than once; list it once" for step in duplicates]


def _step_order_problems(steps: list[str]) -> list[str]:
    problems = []
    imports = [step for step in steps if step in IMPORT_STEPS]
    if len(imports) != 1:
        found = f"found {', '.join(dict.fromkeys(imports))}" if imports else "found none"
        needs = f"needs exactly one import step ({', '.join(IMPORT_STEPS)}), {found}"
        problems.append(f"{needs}; keep exactly one and put it first")
    elif steps[0] not in IMPORT_STEPS:
        problems.append(
            f"the import step {imports[0]} must come first; move it to the start of the list"
        )
    if steps[0] == "wait":
        problems.append("a wait step cannot be first; put it after the import step")
    if any(a == b == "wait" for a, b in itertools.pairwise(steps)):
        problems.append("a wait step cannot directly follow another wait step; remove one of them")
    if steps[0] == "http_import" and "flattening" in steps:  # spec rule 3
        problems.append(_NO_CRTDL_WITH_HTTP_IMPORT)
    if _after_flattening(steps, "validation"):
        problems.append(_VALIDATION_AFTER_FLATTENING)
    return problems


def _after_flattening(steps: list[str], step: str) -> bool:
    """Whether ``step`` is listed and gets the flattening's CSV files.

    Note: that is, the last data step before it is flattening.
    """
    producers = (
        [name for name in steps[: steps.index(step)] if name in DATA_STEPS] if step in steps else []
    )
    return bool(producers) and producers[-1] == "flattening"


class TaskRunnerSettings(ConfigModel):
    """Where the per-file work runs: threads of the flow process, or task runs on Dask.

    Note:
    - Dask: the scheduler at ``dask_address``, else a local cluster of ``dask_workers``
      processes (default one per core) started for the flow run. Every worker must see the jobs
      directory at the same path and reach the same Prefect API.
    - Dask costs ~0.1 s per task run: it pays for file-sized work only.
    """

    kind: Literal["in_process", "dask"] = "in_process"
    dask_address: OptionalStr = None
    dask_workers: int | None = Field(default=None, ge=1, le=1024)

    @property
    def local_workers(self) -> int:
        return self.dask_workers or os.cpu_count() or 1

    @field_validator("dask_address")
    @classmethod
    def _scheduler_address(cls, address: str | None) -> str | None:
        if address is None:
            return None
        refuse_invisible_url_characters(address)
        parts = urlsplit(address.strip())
        try:
            port = parts.port
        except ValueError:
            port = None
        if has_user_info(address):  # shown by config check and in errors
            raise ValueError(
                "carries a user name or password; a Dask scheduler address is tcp://<host>:<port> "
                "(or tls://, its certificates set in Dask's own configuration)",
            )
        if (
            parts.scheme not in ("tcp", "tls")
            or not parts.hostname
            or port is None
            or parts.path.strip("/")
        ):
            raise ValueError(
                "is not a Dask scheduler address; write tcp://<host>:<port> (or tls://), e.g. "
                "tcp://scheduler:8786",
            )
        return address.strip()

    @model_validator(mode="after")
    def _keys_fit_the_kind(self) -> TaskRunnerSettings:
        if self.kind == "in_process":
            fix = (
                "is set but kind is in_process; set kind: dask to run the per-file work on Dask, "
                "or remove it"
            )
            raise_problems(
                [
                    (key, fix)
                    for key in ("dask_address", "dask_workers")
                    if getattr(self, key) is not None
                ]
            )
        elif self.dask_address is not None and self.dask_workers is not None:
            message = (
                "sizes a local cluster, but dask_address names a running scheduler whose workers "
                "are started where they run; remove dask_workers (or dask_address, for a local "
                "cluster)"
            )
            raise_problems([("dask_workers", message)])
        return self


class FileBatchSettings(ConfigModel):
    """pipeline.file_batches: a step's consecutive files in one cached task run.

    Note: up to ``max_files`` files or ``max_mb`` MB; a larger file is a batch of its own. A task
    run costs the Prefect server about 30 ms of CPU and a row of its database; a resumed job does
    again at most the batch that was interrupted.
    """

    max_files: int = Field(default=5000, ge=1, le=100_000)
    max_mb: int = Field(default=32, ge=1, le=100_000)

    @property
    def max_bytes(self) -> int:
        return self.max_mb * 1024 * 1024


class PipelineSettings(ConfigModel):
    enabled_steps: StrList = Field(default_factory=list, validate_default=True)
    max_ndjson_line_size_mb: Annotated[int, zero_means(100)] = Field(default=100, ge=0, le=4096)
    # How long a deployment run stays suspended at a wait step; then Prefect fails it.
    wait_timeout: Annotated[Duration, positive("how long a suspended run waits, default P7D")] = (
        timedelta(days=7)
    )
    file_batches: FileBatchSettings = FileBatchSettings()
    task_runner: TaskRunnerSettings = TaskRunnerSettings()

    @property
    def max_ndjson_line_size_bytes(self) -> int:
        return self.max_ndjson_line_size_mb * 1024 * 1024

    @field_validator("enabled_steps")
    @classmethod
    def _steps_follow_the_rules(cls, steps: list[str]) -> list[str]:
        if not steps:
            raise ValueError(
                "is empty; list the steps to run in order, starting with one import step, e.g. "
                "[local_import, pseudonymizer, send]"
            )
        raise_problems(
            [("", problem) for problem in _step_name_problems(steps) + _step_order_problems(steps)]
        )
        return steps


class RetrySettings(ConfigModel):
    """retry: wait = min(initial_backoff_ms * 2^attempt, max_backoff_ms)."""

    max_attempts: int = Field(default=5, ge=1, le=10)
    initial_backoff_ms: int = Field(default=1000, ge=0, le=3_600_000)
    max_backoff_ms: int = Field(default=30000, ge=0, le=3_600_000)


class TlsSettings(ConfigModel):
    ca_cert_path: OptionalPath = None
    insecure_skip_verify: bool = False


class CompressionSettings(ConfigModel):
    enabled: bool = True
    level: Literal["fastest", "default", "better", "best"] = "default"


def _required(key_path: str, reason: str) -> Problem:
    return (
        key_path,
        f"is required {reason}; set it in the configuration file or with {env_var_name(key_path)}",
    )


_REQUIRED_BY_STEP = {
    "extractor": "services.extractor.base_url",
    "pseudonymizer": "services.pseudonymizer.url",
    "validation": "services.validation.url",
    "flattening": "services.flattening.lookup_path",
}
_SEND_AS_MISSING = (
    "is required because the send step is enabled; set one of direct_resource_load, "
    "transfer_load, s3_upload"
)
_FHIR_SEND_AUTH = (
    "needs exactly one of Basic Auth or OAuth 2.0 client credentials {reason}; set username and "
    "password, or oauth_issuer_uri, oauth_client_id and oauth_client_secret, in services.send.auth"
)
_S3_SEND_OAUTH = (
    "OAuth 2.0 is not supported with send_as s3_upload, where the auth block only carries proxy "
    "Basic Auth (username, password); remove the oauth_* keys (the bucket itself uses "
    "services.send.s3.access_key_id/secret_access_key)"
)
PROXY_AUTH_WITHOUT_ENDPOINT = (
    "carries the Basic Auth of a proxy that services.send.s3.endpoint names, but the endpoint is "
    "not set, so every request would go to AWS itself with the proxy's password in it; set the "
    "proxy's address as services.send.s3.endpoint, or remove username and password from "
    "services.send.auth"
)


def _send_problems(send: SendSettings, info: ValidationInfo) -> list[Problem]:
    if send.send_as is None:
        return [("services.send.send_as", _SEND_AS_MISSING)]
    reason = f"for send_as {send.send_as}"
    if send.send_as == "s3_upload":
        problems = [
            _required(f"services.send.s3.{key}", reason)
            for key in ("bucket", "region", "access_key_id", "secret_access_key")
            if getattr(send.s3, key) is None
        ]
        if send.auth.uses_oauth:
            problems.append(("services.send.auth", _S3_SEND_OAUTH))
        elif send.auth.uses_basic and send.s3.endpoint is None:
            problems.append(("services.send.auth", PROXY_AUTH_WITHOUT_ENDPOINT))
        for key, value in (("auth.api_key", send.auth.api_key), ("url", send.url)):
            if value is not None:
                emit_warning(
                    info, f"services.send.{key} is ignored with send_as s3_upload; remove it"
                )
        return problems
    problems = [_required("services.send.url", reason)] if send.url is None else []
    if not (send.auth.uses_basic or send.auth.uses_oauth):
        problems.append(("services.send.auth", _FHIR_SEND_AUTH.format(reason=reason)))
    keys = (
        ("project_identifier", "organization_identifier") if send.send_as == "transfer_load" else ()
    )
    return problems + [
        _required(f"services.send.transfer.{key}", reason)
        for key in keys
        if getattr(send.transfer, key) is None
    ]


class Settings(ConfigModel):
    services: ServicesSettings = ServicesSettings()
    pipeline: PipelineSettings = Field(  # validated from {}: an empty enabled_steps is refused
        default_factory=dict,  # type: ignore[arg-type, unused-ignore]  # pydantic's plugin knows
        validate_default=True,
    )
    retry: RetrySettings = RetrySettings()
    tls: TlsSettings = TlsSettings()
    compression: CompressionSettings = CompressionSettings()
    jobs_dir: Annotated[str, AfterValidator(refuse_control_characters)] = Field(
        default="./jobs", min_length=1
    )

    @model_validator(mode="after")
    def _enabled_steps_are_configured(self, info: ValidationInfo) -> Settings:
        problems = [
            _required(path, f"because the {step} step is enabled")
            for step, path in _REQUIRED_BY_STEP.items()
            if step in self.pipeline.enabled_steps
            and functools.reduce(getattr, path.split("."), self) is None
        ]
        send = self.services.send
        if "send" in self.pipeline.enabled_steps:
            problems += _send_problems(send, info)
            if send.send_as == "direct_resource_load" and _after_flattening(
                self.pipeline.enabled_steps, "send"
            ):
                problems.append(("services.send.send_as", _DIRECT_SEND_AFTER_FLATTENING))
        raise_problems(problems)
        return self
