"""Issue 51, item 16: a credential in a URL's query under any name that says secret (``?apikey=``, ``?password=``,
``?client_secret=``, not only ``access_token``) meets the same rule at every door: a URL the job stores (its input,
``continue --attach``, a ``--set`` override) is refused, a configured service URL shows it masked in ``config
check`` and has it redacted where a service quotes the URL back. Harmless names pass every door.

Issue 63, item 5: one name rule (``is_secret_query_name``, a table of 40 names) for the refusal
and the redaction; a URL an older record holds (its input, its extraction's status URL) shows
redacted in ``status``, ``list`` and the job-record artifact (``tests/test_job_cli.py``).
"""

from __future__ import annotations

import re
import uuid

import pytest

from config.errors import ConfigError
from config.loader import HIDDEN, load_settings, refuse_secret_overrides
from flows.jobs import prepare_job
from flows.run import EXIT_OK, EXIT_USAGE, main
from tasks.core.redaction import hide_secret_parameters, is_secret_query_name, redact
from tasks.core.url_credentials import CredentialsInUrlError
from tasks.core.url_credentials import refuse_credentials_in_url
from tasks.job.record import JobRecord, changing_record
from tests.support.jobs import put_flow_run

SECRET = "Sekr3t-in-query-6d1f"
SECRET_NAMES = ["apikey", "api_key", "key", "client_secret", "password", "auth", "apiKey", "Subscription-Key"]
HARMLESS_QUERY = "_format=json&page=2&count=10&_count=5"
SAYS_SECRET = [
    *("access_token", "Access-Token", "accessToken", "accesstoken", "bearer", "Bearer_Token"),
    *("X-Amz-Signature", "X-Amz-Security-Token", "x-goog-credential", "sig", "sessionId"),
    *("JSESSIONID", "PHPSESSID", "apiKey", "api_key", "privatekey", "Subscription-Key"),
    *("client_secret", "clientSecret", "password", "passwort", "pwd", "auth", "credentials"),
]
HARMLESS = [  # FHIR's search parameters, words that hold a secret word, page cursors
    *("_sort", "sort", "code", "_count", "page", "patient", "subject", "_lastUpdated"),
    *("identifier", "_include", "keyword", "monkey", "author", "page_token", "pageToken"),
    "nextPageToken",
]
NAMES = [(name, True) for name in SAYS_SECRET] + [(name, False) for name in HARMLESS]
TABLE_VALUE = "table-value-0b9c"


@pytest.mark.parametrize(("name", "secret"), NAMES)
def test_a_name_says_secret_by_its_words_in_any_case_and_with_any_separator(name, secret):
    spellings = [name, name.upper(), name.replace("_", "%5F")]
    spellings += [re.sub("[-_]", ".", name), re.sub("[-_]", "", name)]
    assert [is_secret_query_name(spelling) for spelling in spellings] == [secret] * len(spellings)


@pytest.mark.parametrize(("name", "secret"), NAMES)
def test_a_secret_named_parameter_is_refused_in_a_stored_url_and_hidden_where_shown(name, secret):
    """A harmless name (a FHIR search parameter, a page cursor) passes both; the others stay."""
    url = f"https://files.example/Patient.ndjson?_count=5&{name}={TABLE_VALUE}#top"
    try:
        refuse_credentials_in_url(url, door="the job input (INPUT)", fix="fix", tokens=True)
    except CredentialsInUrlError as refused:
        assert secret and f"a secret in its query ({name})" in str(refused)
        assert TABLE_VALUE not in str(refused)
    else:
        assert not secret
    said = redact(f"GET '{url}' failed")
    assert said == f"GET '{url.replace(TABLE_VALUE, '***' if secret else TABLE_VALUE)}' failed"
    assert hide_secret_parameters(url, HIDDEN) == url.replace(TABLE_VALUE, "********" if secret else TABLE_VALUE)


def test_a_secret_in_a_fragment_or_a_path_parameter_counts_as_one_in_the_query():
    """``#access_token=`` (an OAuth implicit grant's answer) is stored with the URL, as a query."""
    with pytest.raises(CredentialsInUrlError, match=r"a secret in its query \(access_token\)"):
        url = f"https://h.example/a#access_token={SECRET}"
        refuse_credentials_in_url(url, door="d", fix="f", tokens=True)
    # a Java servlet's session in a status URL was stored in job.json
    with pytest.raises(CredentialsInUrlError, match=r"a secret in its query \(jsessionid\)"):
        url = f"https://h.example/fhir/__status/job-1;jsessionid={SECRET}"
        refuse_credentials_in_url(url, door="d", fix="f", tokens=True)
    refuse_credentials_in_url("https://h.example/fhir/a;version=2/b", door="d", fix="f", tokens=True)
    said = redact(f"at https://h.example/a;jsessionid={SECRET}/b and https://h/b#bearer={SECRET}")
    assert said == "at https://h.example/a;jsessionid=*** and https://h/b#bearer=***"  # to a space


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


def test_status_and_list_hide_the_secrets_of_old_records_urls(tmp_path, capsys, empty_prefect_api):
    """A record written before ``?bearer=`` was refused keeps its input and its extraction's status
    URL (the job's only handle to it): ``status`` and ``list`` show both with the user info and
    every secret value hidden."""
    job_id, jobs_dir = str(uuid.uuid4()), tmp_path / "jobs"
    job_input = f"https://files.example/P.ndjson?_count=5&bearer={SECRET}"
    status_url = f"https://t:{SECRET}@torch.example/fhir/__status/0b6b?code=x&access_token={SECRET}"
    record = JobRecord(job_id=job_id, job_input=job_input)
    with changing_record(jobs_dir / job_id, new=record) as job:
        job.facts = {"extraction_status_url": status_url}
    put_flow_run(empty_prefect_api, jobs_dir / job_id, "COMPLETED", "Completed")

    assert main(["status", job_id, "--jobs-dir", str(jobs_dir)]) == EXIT_OK
    assert main(["list", "--jobs-dir", str(jobs_dir)]) == EXIT_OK

    out = capsys.readouterr().out
    assert SECRET not in out
    assert "  input:     https://files.example/P.ndjson?_count=5&bearer=***\n" in out
    shown_url = "https://***@torch.example/fhir/__status/0b6b?code=x&access_token=***"
    assert f"  extraction_status_url: {shown_url}\n" in out
    assert out.endswith("  https://files.example/P.ndjson?_count=5&bearer=***\n")
