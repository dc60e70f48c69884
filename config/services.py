"""The ``services`` blocks of the configuration: one model per service client.

Also their auth block, and the deprecated extractor keys still accepted (and warned about).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from config.durations import MAX_DURATION, Duration, format_duration
from config.enrichment import CrtdlPreprocessingSettings
from config.fields import (
    ConfigModel,
    HeaderSecret,
    OptionalPath,
    OptionalSecret,
    OptionalStr,
    OptionalUrl,
    Problem,
    StrList,
    emit_warning,
    positive,
    raise_problems,
    refuse_invisible_url_characters,
    refuse_userinfo,
    zero_means,
)
from tasks.core.json_shapes import JsonObject
from tasks.core.names import show_name
from tasks.core.redaction import basic_token

_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 7230 token: a header name

_SCHEMES = (
    (
        ("username", "password"),
        "Basic Auth needs username and password together (set it, e.g. via ${VAR}, or remove the "
        "other)",
    ),
    (
        ("oauth_issuer_uri", "oauth_client_id", "oauth_client_secret"),
        "OAuth 2.0 needs oauth_issuer_uri, oauth_client_id and oauth_client_secret together (set "
        "it or remove the others)",
    ),
)
_BOTH_SCHEMES = (
    "sets both Basic Auth (username/password) and OAuth 2.0 (oauth_*); both would set the "
    "Authorization header, so keep only one of the two schemes"
)
_NOT_A_HEADER = (
    "is not a valid HTTP header name; use only letters, digits and !#$%&'*+-.^_`|~ (no spaces or "
    "colons), e.g. x-api-key"
)
_SPACE_AT_AN_END = (
    "starts or ends with a space, which no HTTP header value may; remove it where the value is "
    "set (a space pasted with the key?)"
)
_AUTHORIZATION_HEADER = (
    "is Authorization, which Basic Auth/OAuth 2.0 also set; use another header for the API key "
    "(default x-api-key) or remove the Basic/OAuth fields"
)


class AuthSettings(ConfigModel):
    username: OptionalStr = None
    password: OptionalSecret = None
    oauth_issuer_uri: OptionalUrl = None
    oauth_client_id: OptionalStr = None
    oauth_client_secret: OptionalSecret = None
    api_key: HeaderSecret = None
    api_key_header: str = "x-api-key"

    @property
    def uses_basic(self) -> bool:
        return self.username is not None and self.password is not None

    @property
    def basic_header_token(self) -> str | None:
        """``user:password`` in Base64 of its UTF-8, as httpx sends Basic auth; else None.

        Why: urllib3's helper encodes Latin-1: a password with € failed with a UnicodeEncodeError
        quoting a character of it.
        """
        if self.username is None or self.password is None:
            return None
        return basic_token(f"{self.username}:{self.password.get_secret_value()}")

    @property
    def uses_oauth(self) -> bool:
        return self.oauth_issuer_uri is not None

    @model_validator(mode="after")
    def _check_schemes(self) -> AuthSettings:
        basic, oauth = (
            [name for name in names if getattr(self, name) is not None] for names, _ in _SCHEMES
        )
        problems: list[Problem] = [("", _BOTH_SCHEMES)] if basic and oauth else []
        for present, (names, needs) in zip((basic, oauth), _SCHEMES, strict=True):
            problems += [
                (name, f"is missing while {', '.join(present)} is set; {needs}")
                for name in names
                if present and name not in present
            ]
        if self.api_key is not None and (key := self.api_key.get_secret_value()) != key.strip(" "):
            problems.append(("api_key", _SPACE_AT_AN_END))  # h11 would refuse it, quoting it
        if not _HTTP_TOKEN.fullmatch(self.api_key_header):
            problems.append(("api_key_header", f"'{self.api_key_header}' {_NOT_A_HEADER}"))
        elif self.api_key_header.lower() == "authorization" and (basic or oauth):
            problems.append(("api_key_header", _AUTHORIZATION_HEADER))
        raise_problems(problems)
        return self


def _fhir_base(block: str) -> AfterValidator:
    """Drops a trailing /fhir (the clients append it), with a warning.

    Why: the earlier configuration shape had it.
    """

    def strip(url: str | None, info: ValidationInfo) -> str | None:
        trimmed, key_path = (url or "").rstrip("/"), f"services.{block}.{info.field_name}"
        if not trimmed.lower().endswith("/fhir"):
            return url
        emit_warning(
            info,
            f"{key_path}: ends with /fhir, which the client appends itself; the suffix was "
            f"dropped. Remove /fhir from {key_path}.",
        )
        return trimmed[: -len("/fhir")]

    return AfterValidator(strip)


LEGACY_FLAT_AUTH_KEYS = (
    "username",
    "password",
    "oauth_issuer_uri",
    "oauth_client_id",
    "oauth_client_secret",
)
LEGACY_DURATION_KEYS: dict[str, tuple[str, str]] = {
    "extraction_timeout_minutes": ("extraction_timeout", "minutes"),
    "polling_interval_seconds": ("polling_interval", "seconds"),
    "max_polling_interval_seconds": ("max_polling_interval", "seconds"),
}
EXTRACTOR_PATH = "services.extractor"
# Deprecated dotted key -> the current key it feeds (for env names and value sources).
LEGACY_TIMING_KEY_PATHS = {
    f"{EXTRACTOR_PATH}.{old}": f"{EXTRACTOR_PATH}.{new}"
    for old, (new, _) in LEGACY_DURATION_KEYS.items()
}
LEGACY_KEY_PATHS = {
    f"{EXTRACTOR_PATH}.{key}": f"{EXTRACTOR_PATH}.auth.{key}" for key in LEGACY_FLAT_AUTH_KEYS
} | LEGACY_TIMING_KEY_PATHS


def _migrate_flat_auth(data: JsonObject, info: ValidationInfo) -> list[Problem]:
    flat = [key for key in LEGACY_FLAT_AUTH_KEYS if key in data]
    if flat and data.get("auth") not in (None, {}):
        return [
            (
                "auth",
                f"is used together with the deprecated flat keys {', '.join(flat)} in "
                f"{EXTRACTOR_PATH}; move them into {EXTRACTOR_PATH}.auth and delete the flat keys",
            )
        ]
    if flat:
        data["auth"] = {key: data.pop(key) for key in flat}
        emit_warning(
            info,
            f"{EXTRACTOR_PATH}: the flat auth keys {', '.join(flat)} are deprecated and will be "
            f"removed in a later major version; move them into {EXTRACTOR_PATH}.auth (e.g. "
            f"{EXTRACTOR_PATH}.auth.{flat[0]}). They are used as auth keys for now.",
        )
    return []


def _migrate_legacy_durations(data: JsonObject, info: ValidationInfo) -> list[Problem]:
    problems: list[Problem] = []
    for old, (new, unit) in LEGACY_DURATION_KEYS.items():
        if old not in data:
            continue
        amount = data.pop(old)
        amount = (
            int(amount.strip()) if isinstance(amount, str) and amount.strip().isdigit() else amount
        )
        if new in data:
            problem = f"and {new} are both set; delete the deprecated {old} and keep {new}"
        elif not isinstance(amount, int) or isinstance(amount, bool):
            problem = (
                f"must be a whole number of {unit}; better, replace it with {new} (e.g. PT30S)"
            )
        # timedelta() of it would overflow, or sleep for ages
        elif abs(amount) > MAX_DURATION / timedelta(**{unit: 1}):
            longest = f"{format_duration(MAX_DURATION)}, 10 years"
            problem = f"is longer than the maximum of {longest}; replace it with {new} (e.g. PT30S)"
        else:
            data[new] = timedelta(**{unit: amount})
            duration = f"{format_duration(data[new])} (a duration)"
            emit_warning(
                info,
                f"{EXTRACTOR_PATH}.{old} is deprecated; replace it with {EXTRACTOR_PATH}.{new}: "
                f"{duration}.",
            )
            continue
        problems.append((old, problem))
    return problems


def _at_least_one_second(value: timedelta) -> timedelta:
    if value < timedelta(seconds=1):
        raise ValueError(
            f"is {format_duration(value)}, below the minimum of 1 second; set it to at least PT1S "
            "(default PT5S)"
        )
    return value


def _origins_only(values: list[str]) -> list[str]:
    for value in values:
        refuse_invisible_url_characters(value)
        refuse_userinfo(value)
        parts = urlsplit(value.strip())
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
        ):
            raise ValueError(
                f"'{value}' is not an origin; write scheme://host[:port], e.g. "
                "https://files.example.org"
            )
    return [value.strip().rstrip("/") for value in values]


STALL_TIMEOUT = timedelta(minutes=1)


class ExtractorSettings(ConfigModel):
    base_url: Annotated[OptionalUrl, _fhir_base("extractor")] = None
    auth: AuthSettings = AuthSettings()
    extraction_timeout: Annotated[
        Duration, positive("a liveness window of silence, default PT30M")
    ] = timedelta(minutes=30)
    polling_interval: Annotated[Duration, AfterValidator(_at_least_one_second)] = timedelta(
        seconds=5
    )
    max_polling_interval: Duration = timedelta(seconds=30)
    file_ready_retries: int = Field(default=10, le=10_000)
    file_ready_interval: Duration = timedelta(seconds=10)
    download_stall_timeout: Annotated[Duration, zero_means(STALL_TIMEOUT)] = STALL_TIMEOUT
    max_result_files: int = Field(default=100_000, ge=1)
    # Origins (scheme://host[:port]) besides base_url's that get the credentials when the manifest
    # says the result files need a token (requiresAccessToken); without it no other origin does.
    file_origins: Annotated[StrList, AfterValidator(_origins_only)] = []

    @model_validator(mode="before")
    @classmethod
    def _accept_legacy_shapes(cls, data: Any, info: ValidationInfo) -> Any:
        """Map the deprecated flat auth keys and integer timing keys to the current shape."""
        if not isinstance(data, dict):
            return data
        migrated = dict(data)
        raise_problems(
            _migrate_flat_auth(migrated, info) + _migrate_legacy_durations(migrated, info)
        )
        return migrated

    @model_validator(mode="after")
    def _max_polling_not_below_polling(self) -> ExtractorSettings:
        if self.max_polling_interval < self.polling_interval:
            message = (
                f"is {format_duration(self.max_polling_interval)}, below polling_interval "
                f"{format_duration(self.polling_interval)}; set it to at least polling_interval"
            )
            raise_problems([("max_polling_interval", message)])
        return self


class PseudonymizerSettings(ConfigModel):
    url: Annotated[OptionalUrl, _fhir_base("pseudonymizer")] = None
    bundle_split_threshold_mb: int = Field(default=10, ge=1, le=100)
    timeout: Annotated[Duration, positive("default PT30S")] = timedelta(seconds=30)
    auth: AuthSettings = AuthSettings()
    anonymization_config: OptionalPath = None
    max_concurrent_requests: int = Field(default=4, ge=1, le=1000)


FLATTENING_FORMATS = ("csv", "parquet")


class FlatteningSettings(ConfigModel):
    service_url: Annotated[OptionalUrl, _fhir_base("flattening")] = None
    lookup_path: OptionalPath = None
    formats: StrList = Field(default_factory=lambda: ["csv"])
    timeout: Annotated[Duration, positive("default PT30M")] = timedelta(minutes=30)
    batch_size_mb: Annotated[int, zero_means(500)] = Field(default=500, ge=0, le=1_000_000)

    @field_validator("formats")
    @classmethod
    def _csv_then_parquet(cls, formats: list[str]) -> list[str]:
        """csv, and parquet beside it if asked for; any case, in any order, each once.

        Why: the Parquet is converted from the finished CSV, and the step's record lists the CSVs.
        """
        names = {name.strip().lower() for name in formats}
        if unknown := sorted(names - set(FLATTENING_FORMATS)):
            raise ValueError(
                f"unknown format {', '.join(unknown)}; the formats are csv and parquet: set "
                "formats: [csv] or [csv, parquet]"
            )
        if "csv" not in names:
            raise ValueError(
                "csv is always written (a Parquet file is made from its group's CSV): set "
                "formats: [csv, parquet], or [csv] or remove the key for CSV alone",
            )
        return [name for name in FLATTENING_FORMATS if name in names]


class TransferSettings(ConfigModel):
    """services.send.transfer (transfer_load only)."""

    project_identifier: OptionalStr = None
    organization_identifier: OptionalStr = None


def _s3_name(kind: str, rule: str) -> AfterValidator:
    """Refuses what botocore refuses as a region or a bucket (or an access point ARN).

    Why: such a value failed the send step, at the end of the job, with botocore's words that
    name no key. Note: botocore is imported only for a value to check (a quarter of a second).
    """

    def check(value: str | None) -> str | None:
        if value is None:
            return None
        from botocore.exceptions import BotoCoreError
        from botocore.handlers import validate_bucket_name
        from botocore.utils import validate_region_name

        try:
            if kind == "region":
                validate_region_name(value)
            else:
                validate_bucket_name({"Bucket": value})
            # botocore's patterns end in $, which lets one line end through; the request would not
            refused = value.endswith("\n")
        except BotoCoreError:
            refused = True
        if refused:
            raise ValueError(f"{show_name(value)} {rule}")
        return value

    return AfterValidator(check)


_REGION_RULE = (
    "is not an S3 region name (letters, digits and -, e.g. eu-central-1); set the store's region"
)
_BUCKET_RULE = (
    "is not an S3 bucket name (letters, digits, . - _; no / or spaces: the objects' keys start "
    "with the job id); set the bucket's name alone"
)


class S3Settings(ConfigModel):
    """services.send.s3 (s3_upload only)."""

    bucket: Annotated[OptionalStr, _s3_name("bucket", _BUCKET_RULE)] = None
    region: Annotated[OptionalStr, _s3_name("region", _REGION_RULE)] = None
    access_key_id: HeaderSecret = None
    secret_access_key: OptionalSecret = None
    endpoint: OptionalUrl = None  # an S3-compatible store's address; unset: AWS's
    use_path_style: bool = False
    timeout: Annotated[Duration, positive("default PT30M")] = timedelta(minutes=30)


class SendSettings(ConfigModel):
    send_as: Literal["direct_resource_load", "transfer_load", "s3_upload"] | None = None
    url: Annotated[OptionalUrl, _fhir_base("send")] = None
    batch_size: int = Field(default=100, ge=0, le=1000)
    auth: AuthSettings = AuthSettings()
    transfer: TransferSettings = TransferSettings()
    s3: S3Settings = S3Settings()


class ValidationSettings(ConfigModel):
    url: OptionalUrl = None
    max_concurrent_requests: int = Field(default=4, ge=1, le=1000)
    bundle_chunk_size_mb: int = Field(default=10, ge=1, le=1024)
    fail_on_error: bool = True


class LocalImportSettings(ConfigModel):
    dir: OptionalPath = None
    recursive: bool = False


class ServicesSettings(ConfigModel):
    extractor: ExtractorSettings = ExtractorSettings()
    pseudonymizer: PseudonymizerSettings = PseudonymizerSettings()
    flattening: FlatteningSettings = FlatteningSettings()
    send: SendSettings = SendSettings()
    validation: ValidationSettings = ValidationSettings()
    local_import: LocalImportSettings = LocalImportSettings()
    crtdl_preprocessing: CrtdlPreprocessingSettings = CrtdlPreprocessingSettings()
