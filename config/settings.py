"""Typed settings of dupflow: pydantic models that mirror the YAML tree of the configuration file.

Every block forbids unknown keys. Values that arrive as text (environment variables, command-line flags,
``${VAR}`` substitution) are coerced by the field types: ints, bools, durations (see config.durations) and
lists (comma-separated ``a,b`` or a flow list ``[a, b]``). An empty string counts as "not set" for optional
strings and secrets.

Rules that span several fields raise one ``config_rule`` error per model that carries every problem as a
(key path relative to the model, message) pair in ``ctx["problems"]``; config.loader turns them into full
key paths. Rules that depend on the enabled steps live on ``Settings`` and are checked only for the steps
that are enabled, so an unused block may stay half configured.

Warnings (deprecated shapes, ignored keys) are logged on ``dupflow.config`` and, when the validation
context has a ``"warnings"`` list, appended to it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import unicodedata
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from config.durations import Duration, format_duration
from tasks.core.jsonfile import JsonFileError, read_json_file
from tasks.core.url_credentials import CredentialsInUrlError, refuse_credentials_in_url

logger = logging.getLogger("dupflow.config")

ENV_PREFIX = "APP_"

Problem = tuple[str, str]
"""(key path relative to the model being validated, message that says what is wrong and how to fix it)"""


def env_var_name(key_path: str) -> str:
    """The APP_* environment variable that overrides a dotted key path."""
    return ENV_PREFIX + key_path.upper().replace(".", "_")


def join_key_path(*parts: str) -> str:
    """Join key path fragments with dots, skipping empty ones."""
    return ".".join(part for part in parts if part)


def raise_problems(problems: list[Problem]) -> None:
    """Raise every problem of one model at once as a single pydantic error the loader can unpack."""
    if problems:
        summary = "; ".join(f"{path}: {message}" if path else message for path, message in problems)
        raise PydanticCustomError("config_rule", "{summary}", {"summary": summary, "problems": list(problems)})


def emit_warning(info: ValidationInfo | None, message: str) -> None:
    """Log a configuration warning and hand it to the loader through the validation context."""
    logger.warning(message)
    context = info.context if info is not None else None
    if isinstance(context, dict) and isinstance(context.get("warnings"), list):
        context["warnings"].append(message)


# --- field types --------------------------------------------------------------------------------------


def _blank_to_none(value: Any) -> Any:
    """An empty or blank string means "not set" (e.g. APP_X= or ${VAR} with an empty VAR)."""
    return None if isinstance(value, str) and not value.strip() else value


def _list_from_text(value: Any) -> Any:
    """Accept lists written as text: ``a,b`` or a JSON/YAML flow list ``[a, b]``."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise PydanticCustomError("list_syntax", "is not a valid flow list; write a,b or [a, b]") from None
    return [item.strip() for item in text.split(",") if item.strip()]


OptionalStr = Annotated[str | None, BeforeValidator(_blank_to_none)]


def _refuse_control_characters(path: str | None) -> str | None:
    """A path with a NUL, newline or other control character passes every other check and then fails the step
    that opens it: refused here, so ``config check`` names the key."""
    control = next((char for char in path or "" if unicodedata.category(char) == "Cc"), None)
    if control is not None:
        raise PydanticCustomError(
            "path_control",
            "contains the control character U+{code}, which no path should have; remove it from the path",
            {"code": f"{ord(control):04X}"},
        )
    return path


OptionalPath = Annotated[str | None, BeforeValidator(_blank_to_none), AfterValidator(_refuse_control_characters)]
OptionalSecret = Annotated[SecretStr | None, BeforeValidator(_blank_to_none)]
StrList = Annotated[list[str], BeforeValidator(_list_from_text)]

_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""RFC 7230 token (tchar+), the grammar of an HTTP header name."""


class ConfigModel(BaseModel):
    """Base of every configuration block: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


def _require_positive(value: timedelta, key: str) -> timedelta:
    if value <= timedelta(0):
        raise PydanticCustomError(
            "duration_positive", "must be longer than zero; set e.g. PT30S or 30s ({key})", {"key": key}
        )
    return value


def _refuse_userinfo(url: str | None) -> str | None:
    """A URL must not carry a user name or password (the one rule of tasks.core.url_credentials)."""
    try:
        refuse_credentials_in_url(
            url,
            door="the URL",
            fix="remove them from the URL and put the credentials in the service's auth block (username, "
            "password, set with ${VAR} or an APP_* variable)",
        )
    except CredentialsInUrlError as exc:
        raise PydanticCustomError("url_userinfo", "{message}", {"message": str(exc)}) from None
    return url


OptionalUrl = Annotated[str | None, BeforeValidator(_blank_to_none), AfterValidator(_refuse_userinfo)]


def _strip_fhir_suffix(url: str | None, key_path: str, info: ValidationInfo) -> str | None:
    """Drop a trailing /fhir (the clients append it) and warn, as the earlier shape included it."""
    if url is None:
        return None
    trimmed = url.rstrip("/")
    if not trimmed.lower().endswith("/fhir"):
        return url
    emit_warning(
        info,
        f"{key_path}: ends with /fhir, which the client appends itself; the suffix was dropped. "
        f"Remove /fhir from {key_path}.",
    )
    return trimmed[: -len("/fhir")]


# --- auth -----------------------------------------------------------------------------------------------

_BASIC_FIELDS = ("username", "password")
_OAUTH_FIELDS = ("oauth_issuer_uri", "oauth_client_id", "oauth_client_secret")


class AuthSettings(ConfigModel):
    """Common auth block (services.extractor.auth, services.pseudonymizer.auth, services.send.auth)."""

    username: OptionalStr = None
    password: OptionalSecret = None
    oauth_issuer_uri: OptionalUrl = None
    oauth_client_id: OptionalStr = None
    oauth_client_secret: OptionalSecret = None
    api_key: OptionalSecret = None
    api_key_header: str = "x-api-key"

    @property
    def uses_basic(self) -> bool:
        return self.username is not None and self.password is not None

    @property
    def uses_oauth(self) -> bool:
        return self.oauth_issuer_uri is not None

    def _set_fields(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if getattr(self, name) is not None]

    @model_validator(mode="after")
    def _check_schemes(self) -> AuthSettings:
        raise_problems(self._scheme_problems())
        return self

    def _scheme_problems(self) -> list[Problem]:
        basic, oauth = self._set_fields(_BASIC_FIELDS), self._set_fields(_OAUTH_FIELDS)
        problems: list[Problem] = []
        if basic and oauth:
            problems.append(
                (
                    "",
                    "sets both Basic Auth (username/password) and OAuth 2.0 (oauth_*); both would set the "
                    "Authorization header, so keep only one of the two schemes",
                )
            )
        problems += [
            (
                name,
                f"is missing while {', '.join(basic)} is set; Basic Auth needs username and password "
                "together (set it, e.g. via ${VAR}, or remove the other)",
            )
            for name in _BASIC_FIELDS
            if basic and name not in basic
        ]
        problems += [
            (
                name,
                f"is missing while {', '.join(oauth)} is set; OAuth 2.0 needs oauth_issuer_uri, "
                "oauth_client_id and oauth_client_secret together (set it or remove the others)",
            )
            for name in _OAUTH_FIELDS
            if oauth and name not in oauth
        ]
        if not _HTTP_TOKEN.fullmatch(self.api_key_header):
            problems.append(
                (
                    "api_key_header",
                    f"'{self.api_key_header}' is not a valid HTTP header name; use only letters, digits and "
                    "!#$%&'*+-.^_`|~ (no spaces or colons), e.g. x-api-key",
                )
            )
        elif self.api_key_header.lower() == "authorization" and (basic or oauth):
            problems.append(
                (
                    "api_key_header",
                    "is Authorization, which Basic Auth/OAuth 2.0 also set; use another header for the API "
                    "key (default x-api-key) or remove the Basic/OAuth fields",
                )
            )
        return problems


# --- services -------------------------------------------------------------------------------------------

LEGACY_FLAT_AUTH_KEYS = ("username", "password", "oauth_issuer_uri", "oauth_client_id", "oauth_client_secret")
LEGACY_DURATION_KEYS: dict[str, tuple[str, str]] = {
    "extraction_timeout_minutes": ("extraction_timeout", "minutes"),
    "polling_interval_seconds": ("polling_interval", "seconds"),
    "max_polling_interval_seconds": ("max_polling_interval", "seconds"),
}
EXTRACTOR_PATH = "services.extractor"


def legacy_key_paths() -> dict[str, str]:
    """Deprecated dotted key -> the current key it feeds (used for env names and value sources)."""
    flat = {f"{EXTRACTOR_PATH}.{key}": f"{EXTRACTOR_PATH}.auth.{key}" for key in LEGACY_FLAT_AUTH_KEYS}
    durations = {f"{EXTRACTOR_PATH}.{old}": f"{EXTRACTOR_PATH}.{new}" for old, (new, _) in LEGACY_DURATION_KEYS.items()}
    return flat | durations


def _legacy_whole_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _migrate_flat_auth(data: dict[str, Any], info: ValidationInfo) -> list[Problem]:
    flat = [key for key in LEGACY_FLAT_AUTH_KEYS if key in data]
    if not flat:
        return []
    if data.get("auth") not in (None, {}):
        return [
            (
                "auth",
                f"is used together with the deprecated flat keys {', '.join(flat)} in {EXTRACTOR_PATH}; "
                f"move them into {EXTRACTOR_PATH}.auth and delete the flat keys",
            )
        ]
    data["auth"] = {key: data.pop(key) for key in flat}
    emit_warning(
        info,
        f"{EXTRACTOR_PATH}: the flat auth keys {', '.join(flat)} are deprecated and will be removed in a "
        f"later major version; move them into {EXTRACTOR_PATH}.auth (e.g. {EXTRACTOR_PATH}.auth.{flat[0]}). "
        "They are used as auth keys for now.",
    )
    return []


def _migrate_legacy_durations(data: dict[str, Any], info: ValidationInfo) -> list[Problem]:
    problems: list[Problem] = []
    for old, (new, unit) in LEGACY_DURATION_KEYS.items():
        if old not in data:
            continue
        if new in data:
            problems.append((old, f"and {new} are both set; delete the deprecated {old} and keep {new}"))
            continue
        amount = _legacy_whole_number(data.pop(old))
        if amount is None:
            problems.append((old, f"must be a whole number of {unit}; better, replace it with {new} (e.g. PT30S)"))
            continue
        data[new] = timedelta(**{unit: amount})
        emit_warning(
            info,
            f"{EXTRACTOR_PATH}.{old} is deprecated; replace it with {EXTRACTOR_PATH}.{new}: "
            f"{format_duration(data[new])} (a duration).",
        )
    return problems


class ExtractorSettings(ConfigModel):
    """services.extractor: the extraction server client."""

    DEFAULT_DOWNLOAD_STALL_TIMEOUT: ClassVar[timedelta] = timedelta(minutes=1)

    base_url: OptionalUrl = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    extraction_timeout: Duration = timedelta(minutes=30)
    polling_interval: Duration = timedelta(seconds=5)
    max_polling_interval: Duration = timedelta(seconds=30)
    file_ready_retries: int = Field(default=10, le=10_000)
    file_ready_interval: Duration = timedelta(seconds=10)
    download_stall_timeout: Duration = DEFAULT_DOWNLOAD_STALL_TIMEOUT
    max_result_files: int = Field(default=100_000, ge=1)
    # Origins (scheme://host[:port]) besides base_url's that get the credentials when the manifest says the result
    # files need a token (requiresAccessToken); without it no other origin gets them.
    file_origins: StrList = Field(default_factory=list)

    @field_validator("file_origins")
    @classmethod
    def _origins_only(cls, values: list[str]) -> list[str]:
        for value in values:
            _refuse_userinfo(value)
            parts = urlsplit(value.strip())
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path not in ("", "/")
                or parts.query
            ):
                raise PydanticCustomError(
                    "origin",
                    "'{value}' is not an origin; write scheme://host[:port], e.g. https://files.example.org",
                    {"value": value},
                )
        return [value.strip().rstrip("/") for value in values]

    @model_validator(mode="before")
    @classmethod
    def _accept_legacy_shapes(cls, data: Any, info: ValidationInfo) -> Any:
        """Map the deprecated flat auth keys and integer timing keys onto the current shape."""
        if not isinstance(data, dict):
            return data
        migrated = dict(data)
        problems = _migrate_flat_auth(migrated, info) + _migrate_legacy_durations(migrated, info)
        raise_problems(problems)
        return migrated

    @field_validator("extraction_timeout")
    @classmethod
    def _extraction_timeout_positive(cls, value: timedelta) -> timedelta:
        return _require_positive(value, "a liveness window of silence, default PT30M")

    @field_validator("polling_interval")
    @classmethod
    def _polling_at_least_one_second(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=1):
            raise PydanticCustomError(
                "polling_interval",
                "is {value}, below the minimum of 1 second; set it to at least PT1S (default PT5S)",
                {"value": format_duration(value)},
            )
        return value

    @field_validator("download_stall_timeout")
    @classmethod
    def _zero_stall_means_default(cls, value: timedelta) -> timedelta:
        return value if value > timedelta(0) else cls.DEFAULT_DOWNLOAD_STALL_TIMEOUT

    @model_validator(mode="after")
    def _max_polling_not_below_polling(self) -> ExtractorSettings:
        if self.max_polling_interval < self.polling_interval:
            raise_problems(
                [
                    (
                        "max_polling_interval",
                        f"is {format_duration(self.max_polling_interval)}, below polling_interval "
                        f"{format_duration(self.polling_interval)}; set it to at least polling_interval",
                    )
                ]
            )
        return self


class PseudonymizerSettings(ConfigModel):
    """services.pseudonymizer."""

    url: OptionalUrl = None
    bundle_split_threshold_mb: int = Field(default=10, ge=1, le=100)
    timeout: Duration = timedelta(seconds=30)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    anonymization_config: OptionalPath = None
    max_concurrent_requests: int = Field(default=4, ge=1, le=1000)

    @field_validator("url")
    @classmethod
    def _no_fhir_suffix(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _strip_fhir_suffix(value, "services.pseudonymizer.url", info)

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: timedelta) -> timedelta:
        return _require_positive(value, "default PT30S")


class FlatteningSettings(ConfigModel):
    """services.flattening."""

    DEFAULT_BATCH_SIZE_MB: ClassVar[int] = 500
    FORMATS: ClassVar[tuple[str, ...]] = ("csv", "parquet")

    service_url: OptionalUrl = None
    lookup_path: OptionalPath = None
    formats: StrList = Field(default_factory=lambda: ["csv"])
    timeout: Duration = timedelta(minutes=30)
    batch_size_mb: int = Field(default=DEFAULT_BATCH_SIZE_MB, ge=0, le=1_000_000)

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: timedelta) -> timedelta:
        return _require_positive(value, "default PT30M")

    @field_validator("formats")
    @classmethod
    def _csv_then_parquet(cls, formats: list[str]) -> list[str]:
        """csv (always: the Parquet is converted from the finished CSV, and the step's record lists the CSVs),
        optionally parquet beside it; any case, in any order, each once."""
        names = {name.strip().lower() for name in formats}
        if unknown := sorted(names - set(cls.FORMATS)):
            raise PydanticCustomError(
                "formats",
                "unknown format {unknown}; the formats are csv and parquet: set formats: [csv] or [csv, parquet]",
                {"unknown": ", ".join(unknown)},
            )
        if "csv" not in names:
            raise PydanticCustomError(
                "formats",
                "csv is always written (a Parquet file is made from its group's CSV): set formats: [csv, parquet], "
                "or [csv] or remove the key for CSV alone",
            )
        return [name for name in cls.FORMATS if name in names]

    @field_validator("batch_size_mb")
    @classmethod
    def _zero_means_default(cls, value: int) -> int:
        return value or cls.DEFAULT_BATCH_SIZE_MB


class TransferSettings(ConfigModel):
    """services.send.transfer (transfer_load only)."""

    project_identifier: OptionalStr = None
    organization_identifier: OptionalStr = None


class S3Settings(ConfigModel):
    """services.send.s3 (s3_upload only)."""

    bucket: OptionalStr = None
    region: OptionalStr = None
    access_key_id: OptionalSecret = None
    secret_access_key: OptionalSecret = None
    endpoint: OptionalUrl = None
    use_path_style: bool = False
    timeout: Duration = timedelta(minutes=30)

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: timedelta) -> timedelta:
        return _require_positive(value, "default PT30M")


SendMode = Literal["direct_resource_load", "transfer_load", "s3_upload"]
FHIR_SEND_MODES = ("direct_resource_load", "transfer_load")


class SendSettings(ConfigModel):
    """services.send."""

    send_as: SendMode | None = None
    url: OptionalUrl = None
    batch_size: int = Field(default=100, ge=0, le=1000)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    transfer: TransferSettings = Field(default_factory=TransferSettings)
    s3: S3Settings = Field(default_factory=S3Settings)

    @field_validator("url")
    @classmethod
    def _no_fhir_suffix(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _strip_fhir_suffix(value, "services.send.url", info)


class ValidationSettings(ConfigModel):
    """services.validation."""

    url: OptionalUrl = None
    max_concurrent_requests: int = Field(default=4, ge=1, le=1000)
    bundle_chunk_size_mb: int = Field(default=10, ge=1, le=1024)
    fail_on_error: bool = True


class LocalImportSettings(ConfigModel):
    """services.local_import."""

    dir: OptionalPath = None
    recursive: bool = False


# --- CRTDL enrichment -----------------------------------------------------------------------------------


class CreateIfNotExists(ConfigModel):
    group_name: str = Field(min_length=1)


class AttributeToAdd(ConfigModel):
    attribute_ref: str = Field(min_length=1)
    must_have: bool = False
    linked_groups: StrList = Field(default_factory=list)


class EnrichmentRule(ConfigModel):
    """One CRTDL enrichment: attributes to add to the attribute group with profile group_reference."""

    group_reference: str = Field(min_length=1)
    create_if_not_exists: CreateIfNotExists | None = None
    attributes_to_add: list[AttributeToAdd] = Field(default_factory=list)


class _EnrichmentFileModel(BaseModel):
    """The external JSON enrichment file uses camelCase names and rejects unknown fields."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=False)


class _FileCreateIfNotExists(_EnrichmentFileModel):
    group_name: str = Field(min_length=1)


class _FileAttributeToAdd(_EnrichmentFileModel):
    attribute_ref: str = Field(min_length=1)
    must_have: bool = False
    linked_groups: list[str] = Field(default_factory=list)


class _FileEnrichmentRule(_EnrichmentFileModel):
    group_reference: str = Field(min_length=1)
    create_if_not_exists: _FileCreateIfNotExists | None = None
    add_group_if_not_exists: bool = False
    attributes_to_add: list[_FileAttributeToAdd] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_way_to_create(self) -> _FileEnrichmentRule:
        if {"create_if_not_exists", "add_group_if_not_exists"} <= self.model_fields_set:
            raise PydanticCustomError(
                "enrichment_create",
                "addGroupIfNotExists and createIfNotExists are mutually exclusive; keep one "
                "(addGroupIfNotExists names the group after the profile URL's last path segment)",
            )
        return self

    def to_rule(self) -> EnrichmentRule:
        create = self.create_if_not_exists
        if self.add_group_if_not_exists:
            create = _FileCreateIfNotExists(groupName=_last_path_segment(self.group_reference))
        return EnrichmentRule(
            group_reference=self.group_reference,
            create_if_not_exists=CreateIfNotExists(group_name=create.group_name) if create else None,
            attributes_to_add=[
                AttributeToAdd(attribute_ref=a.attribute_ref, must_have=a.must_have, linked_groups=a.linked_groups)
                for a in self.attributes_to_add
            ],
        )


def _last_path_segment(profile_url: str) -> str:
    """Group name of the short form: the profile URL's last path segment, without a |version."""
    return profile_url.split("|", 1)[0].rstrip("/").rsplit("/", 1)[-1]


_ENRICHMENT_FILE = TypeAdapter(list[_FileEnrichmentRule])
MAX_ENRICHMENT_FILE_BYTES = 16 * 1024 * 1024  # rules for every MII profile fit in a few KB


def _file_error_text(error: Any) -> str:
    loc = error["loc"]
    where = f"rule [{loc[0]}]" if loc and isinstance(loc[0], int) else "top level"
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:]).lstrip(".")
    if error["type"] == "extra_forbidden":
        return (
            f"{where}: unknown field {field}; remove it (allowed: groupReference, createIfNotExists, "
            "addGroupIfNotExists, attributesToAdd with attributeRef, mustHave, linkedGroups)"
        )
    if error["type"] == "missing":
        return f"{where}: {field} is required; add it"
    if error["type"] == "list_type" and not field:
        return "the file must contain a JSON list of enrichment rules"
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {field + ': ' if field else ''}{message}"


def read_enrichment_file(path: str) -> tuple[list[EnrichmentRule], list[str]]:
    """Read an external enrichment JSON file: (rules, problems). The loader has made a path written in the
    configuration file absolute against the file's directory; other relative paths use the working directory."""
    try:
        raw = read_json_file(Path(path), MAX_ENRICHMENT_FILE_BYTES, path)
    except JsonFileError as error:
        return [], [str(error)]
    try:
        entries = _ENRICHMENT_FILE.validate_python(raw)
    except ValidationError as error:
        return [], [f"{path}: {_file_error_text(e)}" for e in error.errors(include_url=False, include_input=False)]
    return [entry.to_rule() for entry in entries], []


class CrtdlPreprocessingSettings(ConfigModel):
    """services.crtdl_preprocessing. ``rules`` is the effective list, inline or read from enrichments_path."""

    enabled: bool = False
    enrichments_path: OptionalPath = None
    enrichments: Annotated[list[EnrichmentRule] | None, BeforeValidator(_list_from_text)] = None
    _file_rules: list[EnrichmentRule] | None = PrivateAttr(default=None)

    @property
    def rules(self) -> list[EnrichmentRule]:
        """Inline enrichments, or the rules of enrichments_path (read when the settings are validated)."""
        return self.enrichments or self._file_rules or []

    @model_validator(mode="after")
    def _load_rules(self) -> CrtdlPreprocessingSettings:
        if self.enrichments is not None and self.enrichments_path is not None:
            raise_problems(
                [
                    (
                        "",
                        "enrichments and enrichments_path are both set; keep either the inline rules "
                        "(enrichments) or the external file (enrichments_path)",
                    )
                ]
            )
        if self.enrichments_path is not None:
            rules, problems = read_enrichment_file(self.enrichments_path)
            raise_problems([("enrichments_path", problem) for problem in problems])
            self._file_rules = rules
        return self


class ServicesSettings(ConfigModel):
    extractor: ExtractorSettings = Field(default_factory=ExtractorSettings)
    pseudonymizer: PseudonymizerSettings = Field(default_factory=PseudonymizerSettings)
    flattening: FlatteningSettings = Field(default_factory=FlatteningSettings)
    send: SendSettings = Field(default_factory=SendSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    local_import: LocalImportSettings = Field(default_factory=LocalImportSettings)
    crtdl_preprocessing: CrtdlPreprocessingSettings = Field(default_factory=CrtdlPreprocessingSettings)


# --- pipeline -------------------------------------------------------------------------------------------

# The one list of step names, and which of them import data or may be listed more than once: the configuration
# checks enabled_steps by them, tasks.job.layout names the import steps' folder by them, and the flow's table of step
# tasks (flows.pipeline.STEPS) is checked against them by tests/test_step_names.py.
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
REPEATABLE_STEPS = ("wait",)
REMOVED_STEPS = {"csv_conversion": "flattening", "parquet_conversion": "flattening"}
MAX_LISTED_UNKNOWN_STEPS = 5


def _step_name_problems(steps: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    counts = Counter(steps)
    unknown = [step for step in counts if step not in STEP_NAMES and step not in REMOVED_STEPS]
    if unknown:
        shown = ", ".join(f"'{step}'" for step in unknown[:MAX_LISTED_UNKNOWN_STEPS])
        more = f" and {len(unknown) - MAX_LISTED_UNKNOWN_STEPS} more" if len(unknown) > MAX_LISTED_UNKNOWN_STEPS else ""
        problems.append(("", f"unknown step {shown}{more}; valid steps are {', '.join(STEP_NAMES)}"))
    for step in counts:
        if step in REMOVED_STEPS:
            problems.append(
                (
                    "",
                    f"step {step} was a placeholder and no longer exists; use "
                    f"{REMOVED_STEPS[step]} instead (it produces CSV through the flattening service)",
                )
            )
    once_only = set(STEP_NAMES) - set(REPEATABLE_STEPS + IMPORT_STEPS)
    duplicates = sorted(step for step, count in counts.items() if count > 1 and step in once_only)
    problems += [("", f"step {step} is listed more than once; list it once") for step in duplicates]
    return problems


def _step_order_problems(steps: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    imports = [step for step in steps if step in IMPORT_STEPS]
    if len(imports) != 1:
        found = f"found {', '.join(dict.fromkeys(imports))}" if imports else "found none"
        problems.append(
            (
                "",
                f"needs exactly one import step ({', '.join(IMPORT_STEPS)}), {found}; "
                "keep exactly one and put it first",
            )
        )
    elif steps[0] not in IMPORT_STEPS:
        problems.append(("", f"the import step {imports[0]} must come first; move it to the start of the list"))
    if steps[0] == "wait":
        problems.append(("", "a wait step cannot be first; put it after the import step"))
    if any(a == b == "wait" for a, b in itertools.pairwise(steps)):
        problems.append(("", "a wait step cannot directly follow another wait step; remove one of them"))
    return problems


DASK_ADDRESS_SCHEMES = ("tcp", "tls")


class TaskRunnerSettings(ConfigModel):
    """pipeline.task_runner: where the per-file work of every step runs.

    ``in_process`` (the default): threads of the flow's own process. ``dask``: each file is a Prefect task run on a
    Dask cluster (prefect-dask's ``DaskTaskRunner``): the running scheduler at ``dask_address``, or else a local
    cluster of ``dask_workers`` worker processes (one thread each; default one per core) started for the flow run
    and closed at its end. Every worker must see the jobs directory at the same path and reach the same Prefect
    API. Dask costs ~0.1 s per task run: it pays for file-sized work only.
    """

    kind: Literal["in_process", "dask"] = "in_process"
    dask_address: OptionalStr = None
    dask_workers: int | None = Field(default=None, ge=1, le=1024)

    @property
    def local_workers(self) -> int:
        """Worker processes of a local cluster."""
        return self.dask_workers or os.cpu_count() or 1

    @field_validator("dask_address")
    @classmethod
    def _scheduler_address(cls, address: str | None) -> str | None:
        if address is None:
            return None
        parts = urlsplit(address.strip())
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in DASK_ADDRESS_SCHEMES or not parts.hostname or port is None or parts.path.strip("/"):
            raise PydanticCustomError(
                "dask_address",
                "is not a Dask scheduler address; write tcp://<host>:<port> (or tls://), e.g. tcp://scheduler:8786",
            )
        return address.strip()

    @model_validator(mode="after")
    def _keys_fit_the_kind(self) -> TaskRunnerSettings:
        problems: list[Problem] = []
        if self.kind == "in_process":
            problems += [
                (key, "is set but kind is in_process; set kind: dask to run the per-file work on Dask, or remove it")
                for key in ("dask_address", "dask_workers")
                if getattr(self, key) is not None
            ]
        elif self.dask_address is not None and self.dask_workers is not None:
            problems.append(
                (
                    "dask_workers",
                    "sizes a local cluster, but dask_address names a running scheduler whose workers are started "
                    "where they run; remove dask_workers (or dask_address, for a local cluster)",
                )
            )
        raise_problems(problems)
        return self


class PipelineSettings(ConfigModel):
    """pipeline: the ordered steps of a job, and where their per-file work runs (``task_runner``)."""

    DEFAULT_MAX_NDJSON_LINE_SIZE_MB: ClassVar[int] = 100

    enabled_steps: StrList = Field(default_factory=list, validate_default=True)
    max_ndjson_line_size_mb: int = Field(default=DEFAULT_MAX_NDJSON_LINE_SIZE_MB, ge=0, le=4096)
    task_runner: TaskRunnerSettings = Field(default_factory=TaskRunnerSettings)

    @property
    def max_ndjson_line_size_bytes(self) -> int:
        return self.max_ndjson_line_size_mb * 1024 * 1024

    def has_step(self, step: str) -> bool:
        return step in self.enabled_steps

    @field_validator("enabled_steps")
    @classmethod
    def _steps_follow_the_rules(cls, steps: list[str]) -> list[str]:
        if not steps:
            raise_problems(
                [
                    (
                        "",
                        "is empty; list the steps to run in order, starting with one import step, "
                        "e.g. [local_import, pseudonymizer, send]",
                    )
                ]
            )
        raise_problems(_step_name_problems(steps) + _step_order_problems(steps))
        return steps

    @field_validator("max_ndjson_line_size_mb")
    @classmethod
    def _zero_means_default(cls, value: int) -> int:
        return value or cls.DEFAULT_MAX_NDJSON_LINE_SIZE_MB


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


# --- root -----------------------------------------------------------------------------------------------


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
        return _fhir_send_problems(send)
    return _s3_send_problems(send, info)


def _fhir_send_problems(send: SendSettings) -> list[Problem]:
    reason = f"for send_as {send.send_as}"
    problems = [_required("services.send.url", reason)] if send.url is None else []
    if send.send_as == "transfer_load":
        problems += [
            _required(f"services.send.transfer.{key}", reason)
            for key in ("project_identifier", "organization_identifier")
            if getattr(send.transfer, key) is None
        ]
    return problems


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
    jobs_dir: Annotated[str, AfterValidator(_refuse_control_characters)] = Field(default="./jobs", min_length=1)

    @model_validator(mode="after")
    def _enabled_steps_are_configured(self, info: ValidationInfo) -> Settings:
        raise_problems(self._enabled_step_problems(info))
        return self

    def _enabled_step_problems(self, info: ValidationInfo) -> list[Problem]:
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
        if pipeline.has_step("send"):
            problems += _send_problems(services.send, info)
        return problems
