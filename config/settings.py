"""The typed settings of dupflow: the root of the YAML tree, its small blocks (retry, tls, compression), and the
rules that depend on the enabled steps.

Every block forbids unknown keys (see config.fields). The blocks of ``services`` live in config.services, the
``pipeline`` block in config.pipeline. Rules that depend on the enabled steps are checked here, and only for the
steps that are enabled, so an unused block may stay half configured.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from config.fields import ConfigModel, OptionalPath, Problem
from config.fields import emit_warning, env_var_name, raise_problems, refuse_control_characters
from config.pipeline import PipelineSettings
from config.services import FHIR_SEND_MODES, SendSettings, ServicesSettings


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
    return (key_path, f"is required {reason}; set it in the configuration file or with {env_var_name(key_path)}")


def _send_problems(send: SendSettings, info: ValidationInfo) -> list[Problem]:
    if send.send_as is None:
        return [
            (
                "services.send.send_as",
                "is required because the send step is enabled; set one of "
                "direct_resource_load, transfer_load, s3_upload",
            )
        ]
    if send.send_as in FHIR_SEND_MODES:
        reason = f"for send_as {send.send_as}"
        problems = [_required("services.send.url", reason)] if send.url is None else []
        keys = ("project_identifier", "organization_identifier") if send.send_as == "transfer_load" else ()
        return problems + [
            _required(f"services.send.transfer.{key}", reason) for key in keys if getattr(send.transfer, key) is None
        ]
    return _s3_send_problems(send, info)


def _s3_send_problems(send: SendSettings, info: ValidationInfo) -> list[Problem]:
    problems = [
        _required(f"services.send.s3.{key}", "for send_as s3_upload")
        for key in ("bucket", "region", "access_key_id", "secret_access_key")
        if getattr(send.s3, key) is None
    ]
    if send.auth.uses_oauth:
        problems.append(
            (
                "services.send.auth",
                "OAuth 2.0 is not supported with send_as s3_upload, where the auth "
                "block only carries proxy Basic Auth (username, password); remove the oauth_* keys (the "
                "bucket itself uses services.send.s3.access_key_id/secret_access_key)",
            )
        )
    if send.auth.api_key is not None:
        emit_warning(info, "services.send.auth.api_key is ignored with send_as s3_upload; remove it")
    if send.url is not None:
        emit_warning(info, "services.send.url is ignored with send_as s3_upload; remove it")
    return problems


class Settings(ConfigModel):
    """The whole configuration. Rules that depend on enabled steps are checked here."""

    services: ServicesSettings = Field(default_factory=ServicesSettings)
    pipeline: PipelineSettings = Field(default_factory=dict, validate_default=True)  # type: ignore[arg-type]
    retry: RetrySettings = Field(default_factory=RetrySettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    compression: CompressionSettings = Field(default_factory=CompressionSettings)
    jobs_dir: Annotated[str, AfterValidator(refuse_control_characters)] = Field(default="./jobs", min_length=1)

    @model_validator(mode="after")
    def _enabled_steps_are_configured(self, info: ValidationInfo) -> Settings:
        services, pipeline = self.services, self.pipeline
        required = [
            ("extractor", "services.extractor.base_url", services.extractor.base_url),
            ("pseudonymizer", "services.pseudonymizer.url", services.pseudonymizer.url),
            ("validation", "services.validation.url", services.validation.url),
            ("flattening", "services.flattening.lookup_path", services.flattening.lookup_path),
        ]
        problems = [
            _required(key_path, f"because the {step} step is enabled")
            for step, key_path, value in required
            if pipeline.has_step(step) and value is None
        ]
        raise_problems(problems + (_send_problems(services.send, info) if pipeline.has_step("send") else []))
        return self
