"""Every configuration error of the spec: the message names the full key path and says how to fix it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from config.errors import ConfigError
from config.loader import load_settings
from config.fields import env_var_name

LOCAL_ONLY = {"pipeline": {"enabled_steps": ["local_import"]}}
OAUTH = {
    "oauth_issuer_uri": "https://auth.example.org",
    "oauth_client_id": "dupflow",
    "oauth_client_secret": "oauth-secret-value",
}
BASIC = {"username": "dupflow", "password": "basic-secret-value"}


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**LOCAL_ONLY, **config}), encoding="utf-8")
    return path


def rejected(tmp_path: Path, config: dict[str, Any], env: dict[str, str] | None = None, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as error:
        load_settings(_write(tmp_path, config), env=env or {}, **kwargs)
    return error.value


def assert_reported(error: ConfigError, key_path: str, fix: str) -> None:
    """One problem starts with the key path and contains the fix."""
    matching = [p for p in error.problems if p.startswith((f"{key_path}:", f"{key_path} (")) and fix in p]
    assert matching, f"no problem for {key_path} with {fix!r} in {error.problems}"


def services(**blocks: Any) -> dict[str, Any]:
    return {"services": blocks}


@pytest.mark.parametrize(
    ("config", "key_path", "fix"),
    [
        pytest.param(
            services(extractor={"auth": {**BASIC, **OAUTH}}),
            "services.extractor.auth",
            "keep only one of the two schemes",
            id="basic-and-oauth",
        ),
        pytest.param(
            services(pseudonymizer={"auth": {"username": "u"}}),
            "services.pseudonymizer.auth.password",
            "needs username and password together",
            id="username-without-password",
        ),
        pytest.param(
            services(send={"auth": {"password": "p"}}),
            "services.send.auth.username",
            "needs username and password together",
            id="password-without-username",
        ),
        pytest.param(
            services(extractor={"auth": {"oauth_issuer_uri": "https://i"}}),
            "services.extractor.auth.oauth_client_secret",
            "together (set it or remove the others)",
            id="oauth-without-client",
        ),
        pytest.param(
            services(extractor={"auth": {"api_key_header": "x api key"}}),
            "services.extractor.auth.api_key_header",
            "e.g. x-api-key",
            id="header-not-a-token",
        ),
        pytest.param(
            services(extractor={"auth": {**BASIC, "api_key_header": "authorization"}}),
            "services.extractor.auth.api_key_header",
            "use another header",
            id="authorization-with-basic",
        ),
        pytest.param(
            services(send={"auth": {**OAUTH, "api_key_header": "Authorization"}}),
            "services.send.auth.api_key_header",
            "use another header",
            id="authorization-with-oauth",
        ),
        pytest.param(
            services(extractor={"username": "u", "password": "p", "auth": {"api_key": "k"}}),
            "services.extractor.auth",
            "move them into services.extractor.auth",
            id="flat-and-block",
        ),
        pytest.param(
            services(extractor={"polling_interval": "500ms"}),
            "services.extractor.polling_interval",
            "at least PT1S",
            id="polling-below-1s",
        ),
        pytest.param(
            services(extractor={"polling_interval": "PT10S", "max_polling_interval": "PT5S"}),
            "services.extractor.max_polling_interval",
            "at least polling_interval",
            id="max-polling-below-polling",
        ),
        pytest.param(
            {"pipeline": {**LOCAL_ONLY["pipeline"], "file_batches": {"max_files": 0}}},
            "pipeline.file_batches.max_files",
            "must be between 1 and 100000; set a value in that range",
            id="batch-files-0",
        ),
        pytest.param(
            {"pipeline": {**LOCAL_ONLY["pipeline"], "file_batches": {"max_mb": 0}}},
            "pipeline.file_batches.max_mb",
            "must be between 1 and 100000; set a value in that range",
            id="batch-mb-0",
        ),
        pytest.param(
            {"pipeline": {**LOCAL_ONLY["pipeline"], "file_batches": {"max_mb": 100_001}}},
            "pipeline.file_batches.max_mb",
            "must be between 1 and 100000; set a value in that range",
            id="batch-mb-too-large",
        ),
        pytest.param({"retry": {"max_attempts": 0}}, "retry.max_attempts", "between 1 and 10", id="attempts-0"),
        pytest.param({"retry": {"max_attempts": 11}}, "retry.max_attempts", "between 1 and 10", id="attempts-11"),
        pytest.param(
            services(pseudonymizer={"bundle_split_threshold_mb": 0}),
            "services.pseudonymizer.bundle_split_threshold_mb",
            "between 1 and 100",
            id="split-0",
        ),
        pytest.param(
            services(pseudonymizer={"bundle_split_threshold_mb": 101}),
            "services.pseudonymizer.bundle_split_threshold_mb",
            "between 1 and 100",
            id="split-101",
        ),
        pytest.param(
            services(send={"batch_size": 1001}), "services.send.batch_size", "between 0 and 1000", id="batch-1001"
        ),
        pytest.param(
            services(send={"batch_size": -1}), "services.send.batch_size", "between 0 and 1000", id="batch-negative"
        ),
        pytest.param(
            services(crtdl_preprocessing={"enrichments_path": "e.json", "enrichments": []}),
            "services.crtdl_preprocessing",
            "keep either the inline rules",
            id="enrichments-twice",
        ),
        pytest.param(
            services(extractor={"polling_interval": "PT5S", "polling_interval_seconds": 5}),
            "services.extractor.polling_interval_seconds",
            "delete the deprecated",
            id="legacy-and-new-key",
        ),
        pytest.param(
            services(extractor={"base_ulr": "https://x"}),
            "services.extractor.base_ulr",
            "did you mean base_url?",
            id="misspelt-key",
        ),
        pytest.param(
            services(extractor={"polling_interval": 30}),
            "services.extractor.polling_interval",
            "PT30M",
            id="bare-integer-duration",
        ),
        pytest.param({"compression": {"level": "max"}}, "compression.level", "set one of those", id="bad-level"),
        pytest.param(
            {"pipeline": {"enabled_steps": ["local_import", "wait"], "wait_timeout": "PT0S"}},
            "pipeline.wait_timeout",
            "must be longer than zero; set e.g. PT30S",
            id="wait-timeout-0",
        ),
        *[
            pytest.param(
                services(**{service: {key: url}}),
                f"services.{service}.{key}",
                "is not an http(s) URL with a host; write it as https://host[:port][/path]",
                id=f"{service}-{url}",
            )
            for service, key, url in [
                ("pseudonymizer", "url", "localhost:8080"),  # no scheme: it failed the step, naming no key
                ("extractor", "base_url", "ftp://torch.example"),
                ("validation", "url", "http://"),
                ("flattening", "service_url", "torch.example.org"),
                ("send", "url", "http://h:99999"),
            ]
        ],
    ],
)
def test_configuration_error_names_key_path_and_fix(
    tmp_path: Path, config: dict[str, Any], key_path: str, fix: str
) -> None:
    assert_reported(rejected(tmp_path, config), key_path, fix)


@pytest.mark.parametrize(
    ("formats", "fix"),
    [
        pytest.param(["parquet"], "csv is always written", id="parquet-alone"),
        pytest.param([], "csv is always written", id="empty"),
        pytest.param(["csv", "xlsx", "orc"], "unknown format orc, xlsx; the formats are csv and parquet", id="unknown"),
    ],
)
def test_flattening_formats_rules(tmp_path: Path, formats: list[str], fix: str) -> None:
    error = rejected(tmp_path, {"services": {"flattening": {"formats": formats}}})
    assert_reported(error, "services.flattening.formats", fix)
    assert any("set formats: [csv" in problem for problem in error.problems)


@pytest.mark.parametrize(
    ("formats", "loaded"),
    [(["CSV"], ["csv"]), (["Parquet", " csv", "parquet"], ["csv", "parquet"]), (["csv"], ["csv"])],
)
def test_flattening_formats_take_csv_and_parquet_in_any_case_and_order(
    tmp_path: Path, formats: list[str], loaded: list[str]
) -> None:
    path = _write(tmp_path, {"services": {"flattening": {"formats": formats}}})
    assert load_settings(path, env={}).settings.services.flattening.formats == loaded


@pytest.mark.parametrize(
    ("steps", "fix"),
    [
        pytest.param([], "list the steps to run", id="empty"),
        pytest.param(["pseudonymizer"], "needs exactly one import step", id="no-import-step"),
        pytest.param(["local_import", "extractor"], "found local_import, extractor", id="two-import-steps"),
        pytest.param(["pseudonymizer", "local_import"], "must come first", id="import-not-first"),
        pytest.param(["wait", "local_import"], "cannot be first", id="wait-first"),
        pytest.param(["local_import", "wait", "wait"], "cannot directly follow another wait", id="wait-wait"),
        pytest.param(["local_import", "pseudo"], "valid steps are extractor, local_import", id="unknown-step"),
        pytest.param(["local_import", "csv_conversion"], "use flattening instead", id="csv-conversion"),
        pytest.param(["local_import", "parquet_conversion"], "use flattening instead", id="parquet-conversion"),
        pytest.param(["local_import", "validation", "validation"], "list it once", id="duplicate-step"),
        pytest.param(
            ["http_import", "flattening"],
            "the flattening step needs a CRTDL, which a job of http_import cannot be given",
            id="flattening-after-http-import",
        ),
        pytest.param(
            ["local_import", "flattening", "wait", "validation"], "put validation before flattening", id="validate-csv"
        ),
    ],
)
def test_pipeline_step_rules(tmp_path: Path, steps: list[str], fix: str) -> None:
    assert_reported(rejected(tmp_path, {"pipeline": {"enabled_steps": steps}}), "pipeline.enabled_steps", fix)


@pytest.mark.parametrize(
    "steps",
    [
        ["local_import", "validation", "flattening"],
        ["local_import", "flattening", "pseudonymizer", "validation"],  # not a useful order, but NDJSON to validate
    ],
)
def test_validation_that_gets_ndjson_is_accepted_with_flattening_in_the_list(tmp_path: Path, steps: list[str]) -> None:
    blocks = services(validation={"url": "https://v"}, flattening={"lookup_path": str(tmp_path / "lookup.json")})
    blocks["services"]["pseudonymizer"] = {"url": "https://pseudo.example"}
    loaded = load_settings(_write(tmp_path, {"pipeline": {"enabled_steps": steps}, **blocks}), env={})
    assert loaded.settings.pipeline.enabled_steps == steps


def test_wait_may_appear_twice_when_not_adjacent(tmp_path: Path) -> None:
    steps = ["local_import", "wait", "validation", "wait"]
    loaded = load_settings(
        _write(tmp_path, {"pipeline": {"enabled_steps": steps}, **services(validation={"url": "https://v"})}), env={}
    )
    assert loaded.settings.pipeline.enabled_steps == steps


@pytest.mark.parametrize(
    ("steps", "config", "key_path"),
    [
        (["extractor"], {}, "services.extractor.base_url"),
        (["local_import", "pseudonymizer"], {}, "services.pseudonymizer.url"),
        (["local_import", "validation"], {}, "services.validation.url"),
        (["local_import", "flattening"], {}, "services.flattening.lookup_path"),
        (["local_import", "send"], {}, "services.send.send_as"),
        (["local_import", "send"], {"send_as": "direct_resource_load", "auth": BASIC}, "services.send.url"),
        (
            ["local_import", "send"],
            {"send_as": "transfer_load", "url": "https://f", "auth": BASIC},
            "services.send.transfer.project_identifier",
        ),
        (
            ["local_import", "send"],
            {"send_as": "transfer_load", "url": "https://f", "auth": BASIC},
            "services.send.transfer.organization_identifier",
        ),
        (["local_import", "send"], {"send_as": "s3_upload"}, "services.send.s3.bucket"),
        (["local_import", "send"], {"send_as": "s3_upload"}, "services.send.s3.region"),
        (["local_import", "send"], {"send_as": "s3_upload"}, "services.send.s3.access_key_id"),
        (["local_import", "send"], {"send_as": "s3_upload"}, "services.send.s3.secret_access_key"),
    ],
)
def test_keys_required_by_an_enabled_step(
    tmp_path: Path, steps: list[str], config: dict[str, Any], key_path: str
) -> None:
    error = rejected(tmp_path, {"pipeline": {"enabled_steps": steps}, **services(send=config)})
    fix = "set one of direct_resource_load" if key_path.endswith("send_as") else env_var_name(key_path)
    assert_reported(error, key_path, fix)


def test_keys_of_disabled_steps_are_not_required(tmp_path: Path) -> None:
    loaded = load_settings(_write(tmp_path, services(send={"send_as": "s3_upload"})), env={})
    assert loaded.settings.services.send.s3.bucket is None


@pytest.mark.parametrize("mode", ["direct_resource_load", "transfer_load"])
@pytest.mark.parametrize("auth", [{}, {"api_key": "api-key-value"}], ids=["no-auth", "api-key-only"])
def test_send_fhir_modes_need_basic_or_oauth(tmp_path: Path, mode: str, auth: dict[str, str]) -> None:
    """The spec's auth rule 6: the FHIR send modes choose exactly one of Basic Auth or OAuth 2.0."""
    transfer = {"project_identifier": "p", "organization_identifier": "o"}
    send = {"send_as": mode, "url": "https://fhir", "auth": auth, "transfer": transfer}
    error = rejected(tmp_path, {**SEND_STEPS, **services(send=send)})
    assert_reported(
        error, "services.send.auth", f"exactly one of Basic Auth or OAuth 2.0 client credentials for send_as {mode}"
    )
    assert_reported(error, "services.send.auth", "set username and password, or oauth_issuer_uri")


SECRET_KEYS = [
    ("services.send.auth.password", {"send": {"auth": {"username": "u", "password": "${SECRET}"}}}),
    (
        "services.extractor.auth.oauth_client_secret",
        {"extractor": {"auth": {**OAUTH, "oauth_client_secret": "${SECRET}"}}},
    ),
    ("services.pseudonymizer.auth.api_key", {"pseudonymizer": {"auth": {"api_key": "${SECRET}"}}}),
    ("services.send.s3.secret_access_key", {"send": {"s3": {"secret_access_key": "${SECRET}"}}}),
]


@pytest.mark.parametrize(("key_path", "blocks"), SECRET_KEYS, ids=[key for key, _ in SECRET_KEYS])
@pytest.mark.parametrize(
    "control", ["\r\n", "\n", "\x00", "\x1b", "\x7f", "\t"], ids=["CRLF", "LF", "NUL", "ESC", "DEL", "TAB"]
)
@pytest.mark.parametrize("door", ["variable", "APP_"])
def test_a_secret_holding_a_control_character_is_refused_naming_the_key_never_the_value(
    tmp_path: Path, key_path: str, blocks: dict[str, Any], control: str, door: str
) -> None:
    """httpx quotes a header value holding CR or LF whole in its error, so such a secret is refused at load."""
    secret = f"pasted-secret-value{control}"
    env = {"SECRET": secret} if door == "variable" else {"SECRET": "fine-secret-value", env_var_name(key_path): secret}
    error = rejected(tmp_path, services(**blocks), env=env)
    assert_reported(error, key_path, "remove it where the value is set")
    assert "pasted-secret-value" not in str(error)


@pytest.mark.parametrize(("key_path", "blocks"), SECRET_KEYS, ids=[key for key, _ in SECRET_KEYS])
def test_a_secret_over_64_kb_is_refused_at_once(tmp_path: Path, key_path: str, blocks: dict[str, Any]) -> None:
    error = rejected(tmp_path, services(**blocks), env={"SECRET": "k" * (64 * 1024 + 1)})
    assert_reported(error, key_path, "is longer than 64 KB")
    assert "kkkkkkkk" not in str(error)


API_KEYS = ["services.extractor.auth.api_key", "services.pseudonymizer.auth.api_key", "services.send.auth.api_key"]


@pytest.mark.parametrize("key_path", API_KEYS)
@pytest.mark.parametrize("secret", ["api-key-6b0e2f ", " api-key-6b0e2f"], ids=["trailing", "leading"])
@pytest.mark.parametrize("door", ["variable", "APP_"])
def test_an_api_key_with_a_space_at_either_end_is_refused_naming_the_key_never_the_value(
    tmp_path: Path, key_path: str, secret: str, door: str
) -> None:
    """An API key is sent as a header value, which cannot start or end with a space: the job got as far as the first
    request, which h11 refused quoting the key ("Illegal header value b'…'"), taken for a network error and retried."""
    block = key_path.split(".")[1]
    env = {"KEY": secret} if door == "variable" else {"KEY": "fine-api-key", env_var_name(key_path): secret}
    error = rejected(tmp_path, services(**{block: {"auth": {"api_key": "${KEY}"}}}), env=env)
    assert_reported(error, key_path, "starts or ends with a space, which no HTTP header value may; remove it")
    assert "api-key-6b0e2f" not in str(error)


def test_spaces_inside_an_api_key_and_around_a_password_are_kept(tmp_path: Path) -> None:
    """A password travels base64-encoded (Basic) and a space inside a header value is allowed."""
    auth = {"username": "u", "password": "${PASSWORD}", "api_key": "${KEY}"}
    env = {"PASSWORD": " pass word ", "KEY": "api key"}
    loaded = load_settings(_write(tmp_path, services(send={"auth": auth})), env=env).settings.services.send.auth
    assert (loaded.password.get_secret_value(), loaded.api_key.get_secret_value()) == (" pass word ", "api key")


def test_a_secret_of_exactly_64_kb_loads(tmp_path: Path) -> None:
    key_path, blocks = SECRET_KEYS[0]
    loaded = load_settings(_write(tmp_path, services(**blocks)), env={"SECRET": "k" * 64 * 1024})
    assert len(loaded.settings.services.send.auth.password.get_secret_value()) == 64 * 1024


@pytest.mark.parametrize(("key_path", "blocks"), SECRET_KEYS, ids=[key for key, _ in SECRET_KEYS])
def test_a_secret_under_8_characters_loads_with_a_warning_that_it_cannot_be_redacted_safely(
    tmp_path: Path, key_path: str, blocks: dict[str, Any]
) -> None:
    loaded = load_settings(_write(tmp_path, services(**blocks)), env={"SECRET": "1234567"})
    assert [w for w in loaded.warnings if w.startswith(f"{key_path}: ") and "redacted safely" in w]
    assert not any("1234567" in w for w in loaded.warnings)
    longer = load_settings(_write(tmp_path, services(**blocks)), env={"SECRET": "12345678"})
    assert not [w for w in longer.warnings if "redacted safely" in w]


DIRECT_SEND = {"send_as": "direct_resource_load", "url": "https://fhir.example", "auth": BASIC}


@pytest.mark.parametrize(
    ("steps", "refused"),
    [
        (["local_import", "flattening", "send"], True),
        (["local_import", "flattening", "wait", "send"], True),  # nothing between writes NDJSON
        (["local_import", "send", "flattening"], False),
        (["local_import", "flattening", "pseudonymizer", "send"], False),  # not a useful order, but NDJSON to send
    ],
)
def test_a_direct_send_of_the_flattening_s_csv_is_refused_when_the_configuration_is_read(tmp_path, steps, refused):
    """It failed after every step before it had run, and a job's steps are fixed at its start: no continue helped."""
    flattening = {"lookup_path": str(tmp_path / "lookup.json")}
    config = {"pipeline": {"enabled_steps": steps}, **services(send=DIRECT_SEND, flattening=flattening)}
    config["services"] |= {
        "pseudonymizer": {"url": "https://pseudo.example"},
        "validation": {"url": "https://v.example"},
    }
    if refused:
        assert_reported(rejected(tmp_path, config), "services.send.send_as", "put send before flattening")
    else:
        load_settings(_write(tmp_path, config), env={})


def test_send_fhir_modes_refuse_basic_and_oauth_together(tmp_path: Path) -> None:
    auth = {"username": "u", "password": "p", "oauth_issuer_uri": "https://i", "oauth_client_id": "c"}
    auth["oauth_client_secret"] = "s"
    send = {"send_as": "transfer_load", "url": "https://fhir", "auth": auth}
    error = rejected(tmp_path, {**SEND_STEPS, **services(send=send)})
    assert_reported(error, "services.send.auth", "keep only one of the two schemes")


def test_send_fhir_modes_refuse_an_incomplete_scheme(tmp_path: Path) -> None:
    send = {"send_as": "direct_resource_load", "url": "https://fhir", "auth": {"username": "u"}}
    error = rejected(tmp_path, {**SEND_STEPS, **services(send=send)})
    assert_reported(error, "services.send.auth.password", "Basic Auth needs username and password together")


S3_SEND = {
    "send_as": "s3_upload",
    "s3": {"bucket": "b", "region": "r", "access_key_id": "ak", "secret_access_key": "sk"},
}
SEND_STEPS = {"pipeline": {"enabled_steps": ["local_import", "send"]}}


def test_s3_upload_rejects_oauth_proxy_auth(tmp_path: Path) -> None:
    error = rejected(tmp_path, {**SEND_STEPS, **services(send={**S3_SEND, "auth": OAUTH})})
    assert_reported(error, "services.send.auth", "remove the oauth_* keys")


def test_s3_upload_accepts_basic_proxy_auth_and_ignores_api_key_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3 = {**S3_SEND["s3"], "endpoint": "http://s3-proxy.example:3128"}
    config = {**SEND_STEPS, **services(send={**S3_SEND, "s3": s3, "auth": {**BASIC, "api_key": "k"}})}
    with caplog.at_level(logging.WARNING, logger="dupflow.config"):
        loaded = load_settings(_write(tmp_path, config), env={})
    assert loaded.settings.services.send.auth.uses_basic
    assert any("services.send.auth.api_key is ignored" in w for w in loaded.warnings)
    assert any("services.send.auth.api_key is ignored" in r.getMessage() for r in caplog.records)


def test_s3_upload_refuses_proxy_auth_without_an_endpoint_as_aws_would_get_the_password(tmp_path: Path) -> None:
    config = {**SEND_STEPS, **services(send={**S3_SEND, "auth": BASIC})}
    with pytest.raises(ConfigError) as caught:
        load_settings(_write(tmp_path, config), env={})
    message = str(caught.value)
    assert "services.send.auth: carries the Basic Auth of a proxy that services.send.s3.endpoint names" in message
    assert "set the proxy's address as services.send.s3.endpoint, or remove username and password" in message
    assert BASIC["password"] not in message


S3_REFUSED = [
    ("region", "eu central 1", "e.g. eu-central-1"),
    ("region", "eu-central-1 ", "e.g. eu-central-1"),
    ("region", "s3.eu-central-1.amazonaws.com", "e.g. eu-central-1"),
    ("bucket", "research/exports", "the bucket's name alone"),  # a key prefix put into the bucket
    ("bucket", "my bucket", "the bucket's name alone"),
]


@pytest.mark.parametrize(("key", "value", "fix"), S3_REFUSED, ids=[value for _, value, _ in S3_REFUSED])
@pytest.mark.parametrize("door", ["file", "APP_"])
def test_an_s3_region_or_bucket_the_s3_client_cannot_take_is_refused_naming_the_key(
    tmp_path: Path, key: str, value: str, fix: str, door: str
) -> None:
    """The S3 client refuses these (a region is a host label, a bucket has no / or space): they passed config check
    and failed the send step at the end of the job, with botocore's words that name no key."""
    import botocore.exceptions
    from botocore.handlers import validate_bucket_name
    from botocore.utils import validate_region_name

    check = validate_region_name if key == "region" else lambda name: validate_bucket_name({"Bucket": name})
    with pytest.raises((botocore.exceptions.InvalidRegionError, botocore.exceptions.ParamValidationError)):
        check(value)
    variable = env_var_name(f"services.send.s3.{key}")
    s3 = {**S3_SEND["s3"], key: value} if door == "file" else S3_SEND["s3"]
    error = rejected(
        tmp_path,
        {**SEND_STEPS, **services(send={**S3_SEND, "s3": s3})},
        env={variable: value} if door == "APP_" else None,
    )
    assert_reported(error, f"services.send.s3.{key}", fix)


@pytest.mark.parametrize(
    ("region", "bucket"), [("eu-central-1", "dupflow-exports"), ("garage", "Research_Exports.2024"), ("r", "b")]
)
def test_s3_regions_and_buckets_the_s3_client_takes_are_accepted(tmp_path: Path, region: str, bucket: str) -> None:
    s3 = {**S3_SEND["s3"], "region": region, "bucket": bucket}
    loaded = load_settings(_write(tmp_path, {**SEND_STEPS, **services(send={**S3_SEND, "s3": s3})}), env={})
    assert (loaded.settings.services.send.s3.region, loaded.settings.services.send.s3.bucket) == (region, bucket)


URL_KEYS = [
    "services.extractor.base_url",
    "services.extractor.auth.oauth_issuer_uri",
    "services.pseudonymizer.url",
    "services.flattening.service_url",
    "services.send.url",
    "services.send.s3.endpoint",
    "services.validation.url",
    "services.extractor.file_origins",
]


@pytest.mark.parametrize("key_path", URL_KEYS)
@pytest.mark.parametrize(
    ("url", "code"),
    [("https://service.example/api\r", "U+000D"), ("https://service.exa\tmple", "U+0009"), ("https://a\nb", "U+000A")],
    ids=["CR-of-a-windows-env-file", "tab", "newline"],
)
def test_a_url_with_a_control_character_is_refused_naming_the_key_never_the_url(
    tmp_path: Path, key_path: str, url: str, code: str
) -> None:
    """The URL checks read a URL as browsers do, dropping tabs and line ends, so such a value passed them and the
    client refused it (httpx's InvalidURL, naming no key) when the step first called the service."""
    with pytest.raises(httpx.InvalidURL):
        httpx.URL(url)
    error = rejected(tmp_path, {}, env={env_var_name(key_path): url + "?token=url-token-0c4e"})
    assert_reported(error, key_path, f"contains the control character {code}")
    assert "url-token-0c4e" not in str(error) and "service.exa" not in str(error)


@pytest.mark.parametrize("key_path", [*URL_KEYS, "pipeline.task_runner.dask_address"])
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://service.example/api\u2028x", "contains the line or paragraph separator U+2028, which no URL"),
        ("https://service.example/api\u2029", "contains the line or paragraph separator U+2029"),
        ("https://service.example/\u202elmth.exe", "contains the bidirectional text control character U+202E"),
        ("https://service\u200b.example", "contains the invisible format character U+200B"),
    ],
    ids=["line-separator", "paragraph-separator", "right-to-left-override", "zero-width-space"],
)
def test_a_url_with_a_character_that_does_not_show_as_itself_is_refused_naming_it_by_its_code(
    tmp_path: Path, key_path: str, url: str, said: str
) -> None:
    """The URL checks let these through and ``config check`` printed them raw: a line separator forges a line, a
    right-to-left override shows another address. Refused like a control character, the character never shown."""
    if key_path == "pipeline.task_runner.dask_address":
        url = url.replace("https://", "tcp://").replace(".example", ".example:8786", 1)
    error = rejected(tmp_path, {}, env={env_var_name(key_path): url + "?token=url-token-0c4e"})
    assert_reported(error, key_path, said)
    assert_reported(error, key_path, "remove it where the value is set")
    assert not any(char in str(error) for char in "\u2028\u2029\u202e\u200b") and ".example" not in str(error)


HEADER_SECRET_KEYS = [f"services.{block}.auth.api_key" for block in ("extractor", "pseudonymizer", "send")]


@pytest.mark.parametrize("key_path", [*HEADER_SECRET_KEYS, "services.send.s3.access_key_id"])
@pytest.mark.parametrize(
    "secret", ["schl\u00fcssel-5a1f-key", "key-\u20ac-2026-9b3c", "\uff21\uff30\uff29-fullwidth-7d2e"]
)
def test_a_header_secret_that_is_not_ascii_is_refused_naming_the_key_never_the_value(
    tmp_path: Path, key_path: str, secret: str
) -> None:
    """httpx sends such a key as UTF-8, a server reads its header as Latin-1: the key does not match, and a server
    quoting it back wrote ``schlÃ¼ssel`` into the terminal, job.log and the Prefect database."""
    error = rejected(tmp_path, {}, env={env_var_name(key_path): secret})
    assert_reported(error, key_path, "is not ASCII, and it is sent as an HTTP header value")
    assert_reported(error, key_path, "give the key exactly as issued (ASCII)")
    assert secret not in str(error) and str(error).isascii()


def test_a_basic_password_or_client_secret_beyond_ascii_is_taken(tmp_path: Path) -> None:
    """Basic auth sends Base64 of the UTF-8 (as browsers do) and the client secret goes URL-encoded in a form body:
    neither is a header value of its own, and a password with € works against the servers that expect it."""
    config = services(
        extractor={"auth": {"username": "dupflow", "password": "Kennw\u00f6rt-\u20ac-2026"}},
        send={"auth": {**OAUTH, "oauth_client_secret": "Geheimnis-\u00e4\u00f6\u00fc-2026"}},
    )
    loaded = load_settings(_write(tmp_path, config), env={})
    assert loaded.settings.services.extractor.auth.password.get_secret_value() == "Kennw\u00f6rt-\u20ac-2026"


def test_authorization_header_is_allowed_for_a_static_token_alone(tmp_path: Path) -> None:
    config = services(extractor={"auth": {"api_key": "Bearer static", "api_key_header": "Authorization"}})
    loaded = load_settings(_write(tmp_path, config), env={})
    assert loaded.settings.services.extractor.auth.api_key_header == "Authorization"


def test_several_errors_are_reported_together(tmp_path: Path) -> None:
    config = {
        "pipeline": {"enabled_steps": ["wait", "local_import"]},
        "retry": {"max_attempts": 42},
        **services(extractor={"auth": {**BASIC, **OAUTH}}, pseudonymizer={"bundle_split_threshold_mb": 500}),
    }
    error = rejected(tmp_path, config, env={"APP_SERVICES_VALIDATION_FAIL_ON_ERROR": "maybe"})
    assert_reported(error, "pipeline.enabled_steps", "cannot be first")
    assert_reported(error, "retry.max_attempts", "between 1 and 10")
    assert_reported(error, "services.extractor.auth", "keep only one")
    assert_reported(error, "services.pseudonymizer.bundle_split_threshold_mb", "between 1 and 100")
    assert_reported(error, "services.validation.fail_on_error", "must be true or false")
    assert str(error).startswith(f"invalid configuration ({len(error.problems)} problems)")
    assert all(problem in str(error) for problem in error.problems)


def test_malformed_env_value_names_the_variable(tmp_path: Path) -> None:
    error = rejected(tmp_path, {}, env={"APP_RETRY_MAX_ATTEMPTS": "many"})
    assert_reported(error, "retry.max_attempts", "(from APP_RETRY_MAX_ATTEMPTS)")
    assert_reported(error, "retry.max_attempts", "whole number")


def test_malformed_env_duration_names_the_variable(tmp_path: Path) -> None:
    error = rejected(tmp_path, {}, env={"APP_SERVICES_EXTRACTOR_POLLING_INTERVAL": "10"})
    assert_reported(error, "services.extractor.polling_interval", "(from APP_SERVICES_EXTRACTOR_POLLING_INTERVAL)")


def test_unknown_override_key_is_an_error_naming_it(tmp_path: Path) -> None:
    error = rejected(tmp_path, {}, overrides={"services.local_import.dirr": "/data"})
    assert any(
        "services.local_import.dirr" in p and "did you mean services.local_import.dir?" in p for p in error.problems
    ), error.problems
    far = rejected(tmp_path, {}, overrides={"nosuch.key": "1"})  # no key near it: where the keys are listed
    assert any("nosuch.key" in p and "config/example.yaml lists every key" in p for p in far.problems), far.problems


def test_errors_never_show_secret_values_or_pydantic_urls(tmp_path: Path) -> None:
    config = services(
        extractor={"auth": {**BASIC, **OAUTH, "api_key": ["list-secret-value"]}},
        send={"auth": {"password": "send-secret-value"}, "s3": {"secret_access_key": {"x": "s3-secret"}}},
    )
    error = rejected(tmp_path, config, env={"APP_SERVICES_PSEUDONYMIZER_AUTH_PASSWORD": "env-secret-value"})
    text = str(error)
    assert "services.extractor.auth.api_key" in text and "services.send.s3.secret_access_key" in text
    for secret in (
        "basic-secret-value",
        "oauth-secret-value",
        "list-secret-value",
        "send-secret-value",
        "s3-secret",
        "env-secret-value",
    ):
        assert secret not in text
    assert "pydantic.dev" not in text and "input_value" not in text


def test_missing_config_file_is_reported_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml: cannot read the file"):
        load_settings(tmp_path / "nope.yaml", env={})


def test_invalid_yaml_reports_position_without_content(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("services:\n  extractor: {password: hunter2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert "invalid YAML at line" in str(error.value) and "hunter2" not in str(error.value)
