"""Settings models and duration values, used directly (without the loader)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from config.durations import ACCEPTED_FORMS, format_duration, parse_duration
from config.services import AuthSettings, ExtractorSettings, FlatteningSettings
from config.settings import PipelineSettings, Settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT30M", timedelta(minutes=30)),
        ("PT5S", timedelta(seconds=5)),
        ("PT1M30S", timedelta(minutes=1, seconds=30)),
        ("P1D", timedelta(days=1)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("pt5s", timedelta(seconds=5)),
        ("30m", timedelta(minutes=30)),
        ("30s", timedelta(seconds=30)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5s", timedelta(seconds=1.5)),
        ("2d", timedelta(days=2)),
        ("0", timedelta(0)),
    ],
)
def test_duration_accepts_iso_8601_and_short_forms(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["PT", "P", "P1M", "P1Y", "30 minutes", "-5s", "5x", "PT5", ""])
def test_duration_rejects_other_spellings_and_names_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="PT30M.*30m"):
        parse_duration(text)


@pytest.mark.parametrize("value", [30, "30", 1.5])
def test_bare_number_duration_is_rejected_with_the_accepted_forms(value: object) -> None:
    with pytest.raises(ValidationError) as error:
        ExtractorSettings(polling_interval=value)
    assert "no unit" in str(error.value) and ACCEPTED_FORMS in str(error.value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=30), "PT30M"),
        (timedelta(minutes=1, seconds=30), "PT1M30S"),
        (timedelta(days=1), "P1D"),
        (timedelta(days=1, hours=2), "P1DT2H"),
        (timedelta(milliseconds=500), "PT0.5S"),
        (timedelta(0), "PT0S"),
    ],
)
def test_durations_format_as_iso_8601_and_parse_back(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


def test_durations_serialize_to_iso_in_json_and_validate_back() -> None:
    settings = Settings(pipeline=PipelineSettings(enabled_steps=["local_import"]))
    dumped = settings.model_dump(mode="json")
    assert dumped["services"]["extractor"]["extraction_timeout"] == "PT30M"
    assert Settings.model_validate(dumped).services.extractor.extraction_timeout == timedelta(minutes=30)


def test_defaults_follow_the_spec() -> None:
    settings = Settings(pipeline=PipelineSettings(enabled_steps=["local_import"]))
    extractor = settings.services.extractor
    assert (extractor.extraction_timeout, extractor.polling_interval, extractor.max_polling_interval) == (
        timedelta(minutes=30),
        timedelta(seconds=5),
        timedelta(seconds=30),
    )
    assert (extractor.file_ready_retries, extractor.file_ready_interval) == (10, timedelta(seconds=10))
    assert extractor.download_stall_timeout == timedelta(minutes=1)
    assert settings.services.pseudonymizer.bundle_split_threshold_mb == 10
    assert settings.services.pseudonymizer.timeout == timedelta(seconds=30)
    assert settings.services.flattening.formats == ["csv"]
    assert settings.services.flattening.timeout == timedelta(minutes=30)
    assert settings.services.send.batch_size == 100
    assert settings.services.send.s3.timeout == timedelta(minutes=30)
    assert settings.services.validation.fail_on_error is True
    assert (settings.retry.max_attempts, settings.retry.initial_backoff_ms, settings.retry.max_backoff_ms) == (
        5,
        1000,
        30000,
    )
    assert (settings.compression.enabled, settings.compression.level) == (True, "default")
    assert settings.jobs_dir == "./jobs"
    assert settings.services.extractor.auth.api_key_header == "x-api-key"
    assert settings.pipeline.max_ndjson_line_size_mb == 100


def test_zero_selects_the_built_in_default_where_the_spec_says_so() -> None:
    assert ExtractorSettings(download_stall_timeout="PT0S").download_stall_timeout == timedelta(minutes=1)
    assert FlatteningSettings(batch_size_mb=0).batch_size_mb == 500
    pipeline = PipelineSettings(enabled_steps=["local_import"], max_ndjson_line_size_mb=0)
    assert pipeline.max_ndjson_line_size_bytes == 100 * 1024 * 1024


def test_auth_reports_which_scheme_it_uses() -> None:
    basic = AuthSettings(username="u", password="p")
    oauth = AuthSettings(oauth_issuer_uri="https://issuer", oauth_client_id="c", oauth_client_secret="s")
    assert (basic.uses_basic, basic.uses_oauth) == (True, False)
    assert (oauth.uses_basic, oauth.uses_oauth) == (False, True)
    assert oauth.oauth_client_secret is not None and oauth.oauth_client_secret.get_secret_value() == "s"


def test_secrets_are_masked_in_reprs() -> None:
    auth = AuthSettings(username="u", password="hunter2", api_key="key-123")
    assert "hunter2" not in repr(auth) and "key-123" not in repr(auth)


def test_direct_construction_applies_the_same_rules() -> None:
    with pytest.raises(ValidationError, match="keep only one"):
        AuthSettings(
            username="u", password="p", oauth_issuer_uri="https://i", oauth_client_id="c", oauth_client_secret="s"
        )
    with pytest.raises(ValidationError, match="import step"):
        PipelineSettings(enabled_steps=["pseudonymizer"])


def test_settings_without_steps_is_rejected() -> None:
    with pytest.raises(ValidationError, match="enabled_steps"):
        Settings()


def test_lists_accept_comma_separated_and_flow_text() -> None:
    assert PipelineSettings(enabled_steps="local_import, wait").enabled_steps == ["local_import", "wait"]
    assert PipelineSettings(enabled_steps="[local_import, wait]").enabled_steps == ["local_import", "wait"]
