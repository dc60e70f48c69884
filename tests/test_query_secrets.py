"""Issue 51, item 16: a credential in a URL's query under any name that says secret (``?apikey=``, ``?password=``,
``?client_secret=``, not only ``access_token``) meets the same rule at every door: a URL the job stores (its input,
``continue --attach``, a ``--set`` override) is refused, a configured service URL shows it masked in ``config
check`` and has it redacted where a service quotes the URL back. Harmless names pass every door.
"""

from __future__ import annotations

import pytest

from config.errors import ConfigError
from config.loader import load_settings, refuse_secret_overrides
from flows.jobs import prepare_job
from flows.run import EXIT_OK, EXIT_USAGE, main
from tasks.core.redaction import redact
from tasks.core.url_credentials import CredentialsInUrlError, is_secret_query_name

SECRET = "Sekr3t-in-query-6d1f"
SECRET_NAMES = ["apikey", "api_key", "key", "client_secret", "password", "auth", "apiKey", "Subscription-Key"]
MORE_SECRET_NAMES = ["passwd", "pwd", "sessionid", "refresh_token", "X-Amz-Security-Token", "authorization"]
HARMLESS_NAMES = ["_format", "page", "count", "_count", "profile", "_since", "author", "keyword"]
HARMLESS_QUERY = "_format=json&page=2&count=10&_count=5"


@pytest.mark.parametrize("name", SECRET_NAMES + MORE_SECRET_NAMES + ["access_token", "sig", "x-goog-date", "a.pwd"])
def test_a_name_that_says_secret_is_one_in_any_spelling(name):
    assert is_secret_query_name(name)
    assert is_secret_query_name(name.upper()) and is_secret_query_name(name.replace("_", "%5F"))


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_a_harmless_name_is_no_secret(name):
    assert not is_secret_query_name(name)


@pytest.mark.parametrize("name", SECRET_NAMES + ["sig", "X-Amz-Signature", "x-goog-signature", "access_token"])
def test_a_job_input_with_a_secret_in_its_query_is_refused_before_the_job_exists(tmp_path, write_config, name):
    """The job's record and its flow run's parameters keep the input URL whole (``continue`` follows it), so a
    secret in its query (a key, a signed URL's signature) would be stored and shown: refused, with the way to import
    such a file."""
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})
    url = f"https://files.example/Patient.ndjson?page=2&{name}={SECRET}"

    with pytest.raises(CredentialsInUrlError) as refused:
        prepare_job(None, str(config), url, {}, overrides_source="--set")

    message = str(refused.value)
    assert "the job input (INPUT)" in message and f"a secret in its query ({name})" in message
    assert "https://files.example/Patient.ndjson" in message and "local_import" in message
    assert SECRET not in message
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_a_job_input_with_harmless_query_names_is_taken(tmp_path, write_config):
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})
    job = prepare_job(
        None, str(config), f"https://files.example/P.ndjson?{HARMLESS_QUERY}", {}, overrides_source="--set"
    )
    assert job.record.job_input == f"https://files.example/P.ndjson?{HARMLESS_QUERY}"


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_continue_attach_with_a_secret_in_its_query_is_refused(tmp_path, capsys, name):
    attach = f"https://torch.example/fhir/__status/0b6b?{HARMLESS_QUERY}&{name}={SECRET}"

    exit_code = main(["continue", str(tmp_path / "no-such-job"), "--attach", attach])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and "--attach: the URL https://torch.example/fhir/__status/0b6b carries" in error
    assert f"a secret in its query ({name})" in error and SECRET not in error


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_set_override_with_a_secret_in_a_url_s_query_is_refused_naming_the_key(name):
    url = f"https://fhir.example/fhir?{HARMLESS_QUERY}&{name}={SECRET}"
    with pytest.raises(ConfigError) as error:
        refuse_secret_overrides({"services.send.url": url}, "--set")
    (problem,) = error.value.problems
    assert problem.startswith("services.send.url (in --set): the URL https://fhir.example/fhir carries a secret")
    assert f"({name})" in problem and "APP_SERVICES_SEND_URL" in problem and SECRET not in str(error.value)
    refuse_secret_overrides({"services.send.url": f"https://fhir.example/fhir?{HARMLESS_QUERY}"}, "--set")


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_config_check_masks_a_secret_in_a_configured_url_s_query(write_config, monkeypatch, capsys, name):
    url = f"https://validator.example/api?{HARMLESS_QUERY}&{name}=${{VKEY}}"
    config = write_config(
        {"services": {"validation": {"url": url}}, "pipeline": {"enabled_steps": ["local_import", "validation"]}}
    )
    secret = f"{SECRET}-shown-{name}"  # its own: the redaction's registry is the process's
    monkeypatch.setenv("VKEY", secret)

    assert main(["config", "check", str(config)]) == EXIT_OK

    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert secret not in out
    assert f"https://validator.example/api?{HARMLESS_QUERY}&{name}=********  (file)" in lines["services.validation.url"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_in_a_configured_url_s_query_is_redacted_where_a_service_quotes_the_url(name):
    secret = f"{SECRET}-quoted-{name}"  # its own: the redaction's registry is the process's
    env = {"APP_SERVICES_PSEUDONYMIZER_URL": f"https://dimp.example/base?page=2&{name}={secret}"}
    loaded = load_settings(None, env=env | {"APP_PIPELINE_ENABLED_STEPS": "local_import"})

    said = redact(f"Client error '404 Not Found' for url '{loaded.settings.services.pseudonymizer.url}/fhir'")

    assert secret not in said and f"https://dimp.example/base?page=2&{name}=" in said
