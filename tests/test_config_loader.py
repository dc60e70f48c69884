"""Loading: file, ${VAR}, APP_* environment, flags, precedence, sources, legacy shapes, enrichment files."""

from __future__ import annotations

import itertools
import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from config.errors import ConfigError
from config.keys import env_var_index, leaf_paths
from config.loader import effective_config_rows, load_settings
from tasks.core.redaction import redact

EXAMPLE = Path(__file__).resolve().parents[1] / "config" / "example.yaml"
DIAGNOSE = "https://www.medizininformatik-initiative.de/fhir/core/modul-diagnose/StructureDefinition/Diagnose"
LOCAL_ONLY = "pipeline:\n  enabled_steps: [local_import]\n"


@pytest.fixture
def write_yaml_text(tmp_path: Path):
    """Writes raw YAML text: these tests are about parsing the file as written (not the ``write_config`` fixture)."""

    def write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


# --- precedence and sources -----------------------------------------------------------------------------


@pytest.mark.parametrize(("in_file", "in_env", "in_flag"), list(itertools.product([False, True], repeat=3)))
def test_precedence_flag_over_env_over_file_over_default(
    write_yaml_text, in_file: bool, in_env: bool, in_flag: bool
) -> None:
    path = write_yaml_text(LOCAL_ONLY + ("retry:\n  max_attempts: 3\n" if in_file else ""))
    env = {"APP_RETRY_MAX_ATTEMPTS": "4"} if in_env else {}
    overrides = {"retry.max_attempts": "6"} if in_flag else {}
    loaded = load_settings(path, env=env, overrides=overrides)
    expected = (
        (6, "flag --set retry.max_attempts")
        if in_flag
        else ((4, "env APP_RETRY_MAX_ATTEMPTS") if in_env else ((3, "file") if in_file else (5, "default")))
    )
    assert (loaded.settings.retry.max_attempts, loaded.sources["retry.max_attempts"]) == expected


def test_override_labels_name_the_real_flag() -> None:
    loaded = load_settings(
        None,
        env={"APP_PIPELINE_ENABLED_STEPS": "local_import"},
        overrides={"services.local_import.dir": "/data/in", "services.pseudonymizer.anonymization_config": "a.yaml"},
        override_labels={
            "services.local_import.dir": "--dir",
            "services.pseudonymizer.anonymization_config": "--anonymization-config",
        },
    )
    assert loaded.settings.services.local_import.dir == "/data/in"
    assert loaded.sources["services.local_import.dir"] == "flag --dir"
    assert loaded.sources["services.pseudonymizer.anonymization_config"] == "flag --anonymization-config"
    assert loaded.sources["pipeline.enabled_steps"] == "env APP_PIPELINE_ENABLED_STEPS"


def test_no_file_means_defaults_env_and_overrides_only() -> None:
    loaded = load_settings(None, env={}, overrides={"pipeline.enabled_steps": "[local_import, wait]"})
    assert loaded.settings.pipeline.enabled_steps == ["local_import", "wait"]
    assert loaded.settings.jobs_dir == "./jobs" and loaded.sources["jobs_dir"] == "default"
    assert set(loaded.sources) == set(leaf_paths())


# --- environment overrides ------------------------------------------------------------------------------


def test_env_overrides_keys_absent_from_the_file(write_yaml_text) -> None:
    env = {
        "APP_SERVICES_EXTRACTOR_BASE_URL": "https://torch.example.org",
        "APP_SERVICES_EXTRACTOR_AUTH_OAUTH_ISSUER_URI": "https://auth.example.org",
        "APP_SERVICES_EXTRACTOR_AUTH_OAUTH_CLIENT_ID": "dupflow",
        "APP_SERVICES_EXTRACTOR_AUTH_OAUTH_CLIENT_SECRET": "s3cr3t",
        "APP_SERVICES_EXTRACTOR_POLLING_INTERVAL": "PT2S",
        "APP_SERVICES_EXTRACTOR_MAX_POLLING_INTERVAL": "1m",
        "APP_RETRY_MAX_ATTEMPTS": "7",
        "APP_SERVICES_SEND_S3_USE_PATH_STYLE": "true",
        "APP_SERVICES_FLATTENING_FORMATS": "csv",
        "APP_PIPELINE_ENABLED_STEPS": "extractor,wait",
    }
    settings = load_settings(write_yaml_text("jobs_dir: /var/jobs\n"), env=env).settings
    extractor = settings.services.extractor
    assert extractor.base_url == "https://torch.example.org"
    assert extractor.auth.uses_oauth and extractor.auth.oauth_client_secret.get_secret_value() == "s3cr3t"
    assert (extractor.polling_interval, extractor.max_polling_interval) == (timedelta(seconds=2), timedelta(minutes=1))
    assert settings.retry.max_attempts == 7
    assert settings.services.send.s3.use_path_style is True
    assert settings.services.flattening.formats == ["csv"]
    assert settings.pipeline.enabled_steps == ["extractor", "wait"]


@pytest.mark.parametrize(
    "text", ["local_import,wait", " local_import , wait ", "[local_import, wait]", '["local_import", "wait"]']
)
def test_env_lists_accept_comma_separated_and_flow_lists(text: str) -> None:
    loaded = load_settings(None, env={"APP_PIPELINE_ENABLED_STEPS": text})
    assert loaded.settings.pipeline.enabled_steps == ["local_import", "wait"]


def test_env_replaces_a_file_value_and_unset_or_empty_variables_leave_it(write_yaml_text) -> None:
    path = write_yaml_text(LOCAL_ONLY + "services:\n  local_import:\n    dir: /from/file\n    recursive: true\n")
    loaded = load_settings(
        path, env={"APP_SERVICES_LOCAL_IMPORT_DIR": "/from/env", "APP_SERVICES_LOCAL_IMPORT_RECURSIVE": ""}
    )
    assert loaded.settings.services.local_import.dir == "/from/env"
    assert loaded.settings.services.local_import.recursive is True
    assert loaded.sources["services.local_import.recursive"] == "file"


def test_app_variables_matching_no_key_are_ignored() -> None:
    env = {"APP_PIPELINE_ENABLED_STEPS": "local_import", "APP_VERSION": "1.2", "APP_SERVICES_OTHER_TOOL_URL": "x"}
    assert load_settings(None, env=env).settings.pipeline.enabled_steps == ["local_import"]


def test_every_leaf_key_has_an_env_variable() -> None:
    index = env_var_index()
    assert index["APP_SERVICES_EXTRACTOR_BASE_URL"] == "services.extractor.base_url"
    assert index["APP_SERVICES_SEND_S3_USE_PATH_STYLE"] == "services.send.s3.use_path_style"
    assert set(leaf_paths()) <= set(index.values())


# --- ${VAR} substitution --------------------------------------------------------------------------------


def test_variables_are_substituted_in_nested_strings_and_list_items(write_yaml_text) -> None:
    path = write_yaml_text(
        "pipeline:\n  enabled_steps: ['${IMPORT_STEP}', wait]\n"
        "services:\n  extractor:\n    base_url: https://${HOST}:${PORT}\n"
        "    auth: {username: dupflow, password: '${EXTRACTOR_PASSWORD}'}\n"
        "retry:\n  max_attempts: '${ATTEMPTS}'\n"
        "jobs_dir: /data/$${JOB_ID}/jobs\n"
    )
    env = {"IMPORT_STEP": "local_import", "HOST": "torch", "PORT": "8080", "EXTRACTOR_PASSWORD": "pw", "ATTEMPTS": "2"}
    settings = load_settings(path, env=env).settings
    assert settings.pipeline.enabled_steps == ["local_import", "wait"]
    assert settings.services.extractor.base_url == "https://torch:8080"
    assert settings.services.extractor.auth.password.get_secret_value() == "pw"
    assert settings.retry.max_attempts == 2
    assert settings.jobs_dir == "/data/${JOB_ID}/jobs"


def test_unset_variable_is_an_error_naming_variable_and_key_path(write_yaml_text) -> None:
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  send:\n    auth:\n      username: u\n      password: ${SEND_PASSWORD}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert error.value.problems == [
        "services.send.auth.password: environment variable SEND_PASSWORD (referenced as ${SEND_PASSWORD}) "
        "is not set; set SEND_PASSWORD or change the value"
    ]


def test_unset_variable_in_a_value_replaced_by_env_is_not_an_error(write_yaml_text) -> None:
    path = write_yaml_text(LOCAL_ONLY + "services:\n  local_import:\n    dir: ${IMPORT_DIR}\n")
    loaded = load_settings(path, env={"APP_SERVICES_LOCAL_IMPORT_DIR": "/from/env"})
    assert loaded.settings.services.local_import.dir == "/from/env"


@pytest.mark.parametrize(
    "replacing",
    [
        {"env": {"APP_PIPELINE_ENABLED_STEPS": "local_import"}},
        {"overrides": {"pipeline.enabled_steps": "local_import"}},
    ],
    ids=["env", "set"],
)
def test_unset_variable_in_a_list_item_replaced_whole_is_not_an_error(write_yaml_text, replacing) -> None:
    path = write_yaml_text("pipeline:\n  enabled_steps: [local_import, '${STEP2}']\n")
    loaded = load_settings(path, **{"env": {}, **replacing})
    assert loaded.settings.pipeline.enabled_steps == ["local_import"]


def test_a_secret_block_in_a_key_that_is_no_secret_is_an_error_naming_key_and_fix(write_yaml_text) -> None:
    """Checked before any Prefect API is asked (tests/test_secret_blocks.py reads real blocks)."""
    path = write_yaml_text(LOCAL_ONLY + "services:\n  local_import:\n    dir: ${prefect-secret:import-dir}\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert error.value.problems == [
        "services.local_import.dir: is not a secret key, so it cannot name a Prefect Secret block "
        "(${prefect-secret:import-dir}); only passwords, client secrets, API keys and S3 keys can: "
        "write the value itself or use ${VAR}"
    ]


def test_a_secret_block_reference_needs_a_prefect_block_name(write_yaml_text) -> None:
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  send:\n    auth:\n      username: u\n      password: ${prefect-secret:My_Block}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert error.value.problems == [
        "services.send.auth.password: '${prefect-secret:My_Block}' does not name a Prefect block "
        "(lowercase letters, digits and -); write ${prefect-secret:my-block-name}"
    ]


def test_an_escaped_secret_block_reference_stays_text(write_yaml_text) -> None:
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  send:\n    auth:\n      username: u\n      password: $${prefect-secret:pw}\n"
    )
    settings = load_settings(path, env={}).settings
    assert settings.services.send.auth.password.get_secret_value() == "${prefect-secret:pw}"


# --- legacy shapes --------------------------------------------------------------------------------------


def test_flat_extractor_auth_keys_move_into_auth_with_a_logged_warning(
    write_yaml_text, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_yaml_text(LOCAL_ONLY + "services:\n  extractor:\n    username: u\n    password: flat-secret\n")
    with caplog.at_level(logging.WARNING, logger="dupflow.config"):
        loaded = load_settings(path, env={})
    auth = loaded.settings.services.extractor.auth
    assert auth.uses_basic and auth.password.get_secret_value() == "flat-secret"
    assert len(loaded.warnings) == 1 and "move them into services.extractor.auth" in loaded.warnings[0]
    assert [r.getMessage() for r in caplog.records if r.name == "dupflow.config"] == loaded.warnings
    assert "flat-secret" not in loaded.warnings[0]
    assert loaded.sources["services.extractor.auth.password"] == "file (deprecated key services.extractor.password)"


def test_flat_extractor_auth_keys_are_accepted_from_env() -> None:
    env = {
        "APP_PIPELINE_ENABLED_STEPS": "local_import",
        "APP_SERVICES_EXTRACTOR_USERNAME": "u",
        "APP_SERVICES_EXTRACTOR_PASSWORD": "p",
    }
    loaded = load_settings(None, env=env)
    assert loaded.settings.services.extractor.auth.username == "u"
    assert loaded.sources["services.extractor.auth.password"] == "env APP_SERVICES_EXTRACTOR_PASSWORD"
    assert any("deprecated" in w for w in loaded.warnings)


def test_legacy_integer_timing_keys_become_durations_with_warnings(write_yaml_text) -> None:
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  extractor:\n    extraction_timeout_minutes: 45\n"
        "    polling_interval_seconds: 2\n    max_polling_interval_seconds: 20\n"
    )
    loaded = load_settings(path, env={})
    extractor = loaded.settings.services.extractor
    assert extractor.extraction_timeout == timedelta(minutes=45)
    assert (extractor.polling_interval, extractor.max_polling_interval) == (timedelta(seconds=2), timedelta(seconds=20))
    assert len(loaded.warnings) == 3
    assert "replace it with services.extractor.extraction_timeout: PT45M" in loaded.warnings[0]


@pytest.mark.parametrize(
    ("key", "amount"),
    [
        ("extraction_timeout_minutes", 99_999_999_999_999),  # timedelta() overflowed: a traceback, exit code 1
        ("polling_interval_seconds", 400_000_000),  # 12 years: past the 10-year bound every duration key has
        ("max_polling_interval_seconds", 10**90),
    ],
)
@pytest.mark.parametrize("door", ["file", "APP_"])
def test_a_legacy_timing_key_longer_than_ten_years_is_refused_naming_it(
    write_yaml_text, key: str, amount: int, door: str
) -> None:
    variable = f"APP_SERVICES_EXTRACTOR_{key.upper()}"
    in_file = f"services:\n  extractor:\n    {key}: {amount}\n" if door == "file" else ""
    env = {variable: str(amount)} if door == "APP_" else {}
    with pytest.raises(ConfigError) as error:
        load_settings(write_yaml_text(LOCAL_ONLY + in_file), env=env)
    (problem,) = error.value.problems
    assert problem.startswith(f"services.extractor.{key}")
    assert "longer than the maximum of P3650D" in problem and "replace it with" in problem
    assert (variable in problem) == (door == "APP_")


@pytest.mark.parametrize(
    ("file_key", "env", "expected", "source"),
    [
        pytest.param(
            "polling_interval_seconds: 10",
            {"APP_SERVICES_EXTRACTOR_POLLING_INTERVAL": "PT20S"},
            timedelta(seconds=20),
            "env APP_SERVICES_EXTRACTOR_POLLING_INTERVAL",
            id="current-variable-over-legacy-file-key",
        ),
        pytest.param(
            "polling_interval: PT10S",
            {"APP_SERVICES_EXTRACTOR_POLLING_INTERVAL_SECONDS": "20"},
            timedelta(seconds=20),
            "env APP_SERVICES_EXTRACTOR_POLLING_INTERVAL_SECONDS",
            id="legacy-variable-over-current-file-key",
        ),
    ],
)
def test_a_variable_overrides_a_timing_key_the_file_writes_in_the_other_shape(
    write_yaml_text, file_key: str, env: dict[str, str], expected: timedelta, source: str
) -> None:
    """Precedence holds across the two shapes of a timing key: the variable wins, the file's key is overridden."""
    path = write_yaml_text(LOCAL_ONLY + f"services:\n  extractor:\n    {file_key}\n")
    flag = {"services.extractor.polling_interval": "PT30S"}  # and a flag over both
    for overrides, wanted in (({}, (expected, source)), (flag, (timedelta(seconds=30), f"flag --set {[*flag][0]}"))):
        loaded = load_settings(path, env=env, overrides=overrides)
        got = loaded.settings.services.extractor.polling_interval
        assert (got, loaded.sources["services.extractor.polling_interval"]) == wanted


def test_a_legacy_timing_variable_below_the_minimum_is_named_in_the_error(write_yaml_text) -> None:
    """Its value moves to the current key, whose check named no variable: the file's polling_interval seemed to be
    at fault, and setting it as the error said changed nothing."""
    env = {"APP_SERVICES_EXTRACTOR_POLLING_INTERVAL_SECONDS": "0"}
    path = write_yaml_text(LOCAL_ONLY + "services:\n  extractor:\n    polling_interval: PT5S\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env=env)
    (problem,) = error.value.problems
    variable = "(from APP_SERVICES_EXTRACTOR_POLLING_INTERVAL_SECONDS)"
    assert problem.startswith(f"services.extractor.polling_interval {variable}: is PT0S, below the minimum")


def test_both_shapes_of_a_timing_key_from_one_source_stay_an_error(write_yaml_text) -> None:
    env = {"APP_SERVICES_EXTRACTOR_POLLING_INTERVAL": "PT5S", "APP_SERVICES_EXTRACTOR_POLLING_INTERVAL_SECONDS": "5"}
    with pytest.raises(ConfigError, match="polling_interval_seconds.*delete the deprecated"):
        load_settings(write_yaml_text(LOCAL_ONLY), env=env)


@pytest.mark.parametrize(
    ("block", "key", "url"),
    [
        ("pseudonymizer", "url", "https://dimp/fhir"),
        ("send", "url", "https://fhir/fhir/"),
        ("extractor", "base_url", "https://torch/fhir"),  # it went to /fhir/fhir/$extract-data
        ("flattening", "service_url", "https://flattener/FHIR/"),
    ],
)
def test_url_ending_in_fhir_is_trimmed_with_a_warning(write_yaml_text, block: str, key: str, url: str) -> None:
    loaded = load_settings(write_yaml_text(LOCAL_ONLY + f"services:\n  {block}:\n    {key}: {url}\n"), env={})
    assert getattr(getattr(loaded.settings.services, block), key) == url.rstrip("/")[: -len("/fhir")]
    assert loaded.warnings == [
        f"services.{block}.{key}: ends with /fhir, which the client appends itself; the "
        f"suffix was dropped. Remove /fhir from services.{block}.{key}."
    ]


def test_max_ndjson_line_size_exposes_bytes(write_yaml_text) -> None:
    loaded = load_settings(write_yaml_text(LOCAL_ONLY + "  max_ndjson_line_size_mb: 2\n"), env={})
    assert loaded.settings.pipeline.max_ndjson_line_size_bytes == 2 * 1024 * 1024


# --- enrichment rules -----------------------------------------------------------------------------------


def _enrichment_file(tmp_path: Path, rules: Any) -> Path:
    path = tmp_path / "enrichments.json"
    path.write_text(json.dumps(rules), encoding="utf-8")
    return path


def test_enrichment_file_is_parsed_into_rules(tmp_path: Path, write_yaml_text, monkeypatch) -> None:
    _enrichment_file(
        tmp_path,
        [
            {
                "groupReference": "https://example.org/StructureDefinition/Patient",
                "createIfNotExists": {"groupName": "Patients"},
                "attributesToAdd": [
                    {
                        "attributeRef": "Patient.identifier",
                        "mustHave": True,
                        "linkedGroups": ["https://example.org/StructureDefinition/Encounter"],
                    }
                ],
            },
            {
                "groupReference": DIAGNOSE,
                "addGroupIfNotExists": True,
                "attributesToAdd": [{"attributeRef": "Condition.code"}],
            },
        ],
    )
    monkeypatch.chdir(tmp_path)
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  crtdl_preprocessing:\n    enabled: true\n    enrichments_path: enrichments.json\n"
    )
    loaded = load_settings(path, env={})
    preprocessing = loaded.settings.services.crtdl_preprocessing
    first, second = preprocessing.rules
    assert first.create_if_not_exists.group_name == "Patients"
    assert first.attributes_to_add[0].must_have is True
    assert first.attributes_to_add[0].linked_groups == ["https://example.org/StructureDefinition/Encounter"]
    assert second.create_if_not_exists.group_name == "Diagnose"
    assert second.attributes_to_add[0].must_have is False
    assert preprocessing.enrichments_path == str(tmp_path / "enrichments.json") and preprocessing.enrichments is None
    assert loaded.sources["services.crtdl_preprocessing.enrichments"] == f"enrichment file {tmp_path}/enrichments.json"


def test_inline_enrichments_use_snake_case_and_are_the_rules(write_yaml_text) -> None:
    path = write_yaml_text(
        LOCAL_ONLY + "services:\n  crtdl_preprocessing:\n    enrichments:\n"
        f"      - group_reference: {DIAGNOSE}\n"
        "        attributes_to_add: [{attribute_ref: Condition.code, must_have: true}]\n"
    )
    rules = load_settings(path, env={}).settings.services.crtdl_preprocessing.rules
    assert [(r.group_reference, r.attributes_to_add[0].must_have) for r in rules] == [(DIAGNOSE, True)]


@pytest.mark.parametrize(
    ("rules", "fragment"),
    [
        (
            [
                {"groupReference": DIAGNOSE},
                {"groupReference": DIAGNOSE, "attributesToAdd": [{"attributeRef": "a", "mustHav": True}]},
            ],
            "rule [1]: unknown field attributesToAdd[0].mustHav; remove it",
        ),
        ([{"groupReference": DIAGNOSE, "group_name": "x"}], "rule [0]: unknown field group_name; remove it"),
        (
            [{"groupReference": DIAGNOSE, "addGroupIfNotExists": True, "createIfNotExists": {"groupName": "D"}}],
            "rule [0]: addGroupIfNotExists and createIfNotExists are mutually exclusive; keep one",
        ),
        ({"groupReference": DIAGNOSE}, "must contain a JSON list"),
    ],
)
def test_enrichment_file_errors_name_rule_and_field(tmp_path: Path, write_yaml_text, rules: Any, fragment: str) -> None:
    enrichments = _enrichment_file(tmp_path, rules)
    path = write_yaml_text(LOCAL_ONLY + f"services:\n  crtdl_preprocessing:\n    enrichments_path: {enrichments}\n")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert any(
        p.startswith("services.crtdl_preprocessing.enrichments_path:") and fragment in p for p in error.value.problems
    ), error.value.problems


def test_missing_enrichment_file_is_an_error(tmp_path: Path, write_yaml_text) -> None:
    path = write_yaml_text(LOCAL_ONLY + "services:\n  crtdl_preprocessing:\n    enrichments_path: absent.json\n")
    with pytest.raises(ConfigError, match=f"enrichments_path: cannot read {tmp_path}/absent.json"):
        load_settings(path, env={})


# --- effective configuration and the example ------------------------------------------------------------


def test_effective_rows_cover_every_leaf_and_mask_secrets() -> None:
    env = {
        "APP_PIPELINE_ENABLED_STEPS": "local_import",
        "APP_SERVICES_SEND_AUTH_USERNAME": "u",
        "APP_SERVICES_SEND_AUTH_PASSWORD": "row-secret",
        "APP_SERVICES_EXTRACTOR_POLLING_INTERVAL": "1500ms",
    }
    loaded = load_settings(None, env=env)
    rows = {key: (value, source) for key, value, source in effective_config_rows(loaded)}
    assert list(rows) == list(leaf_paths())
    assert rows["services.send.auth.password"] == ("********", "env APP_SERVICES_SEND_AUTH_PASSWORD")
    assert rows["services.send.auth.oauth_client_secret"] == ("-", "default")
    assert rows["services.extractor.polling_interval"] == ("PT1.5S", "env APP_SERVICES_EXTRACTOR_POLLING_INTERVAL")
    assert rows["pipeline.enabled_steps"] == ("[local_import]", "env APP_PIPELINE_ENABLED_STEPS")
    assert rows["compression.enabled"] == ("true", "default")
    assert "row-secret" not in repr(effective_config_rows(loaded)) and "row-secret" not in repr(loaded)


def test_a_token_in_a_service_url_s_query_is_redacted_like_a_secret() -> None:
    """A service that quotes the URL it was called with (httpx's "Client error '404 Not Found' for url '…'") in an
    error never gets the token of its query into a message, log line or job record."""
    token = "pseudonymizer-token-31c9b7"
    env = {"APP_SERVICES_PSEUDONYMIZER_URL": f"https://dimp.example/base?token={token}"}
    loaded = load_settings(None, env=env | {"APP_PIPELINE_ENABLED_STEPS": "local_import"})
    said = redact(f"Client error '404 Not Found' for url '{loaded.settings.services.pseudonymizer.url}/fhir'")
    assert token not in said and "https://dimp.example/base?token=" in said


def test_example_file_validates_without_warnings_and_mentions_every_key() -> None:
    loaded = load_settings(EXAMPLE, env={})
    assert loaded.settings.pipeline.enabled_steps == ["local_import"] and loaded.warnings == []
    text = EXAMPLE.read_text(encoding="utf-8")
    missing = [
        path
        for path in leaf_paths()
        if not re.search(rf"^\s*(#\s*)?(- )?{re.escape(path.rsplit('.', 1)[-1])}:", text, re.MULTILINE)
    ]
    assert missing == []
