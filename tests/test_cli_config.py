"""`config check` and the flags shared with `start`, through the command line's entry point; `start`'s help."""

from __future__ import annotations

import os
import shlex

import pytest

from flows.jobs import check_new_job
from flows.run import CLI, EXIT_OK, EXIT_USAGE, START_EXAMPLES, build_parser, cmd_start, main
from tests.conftest import run_cli


def test_config_check_shows_every_value_with_its_source_and_masks_secrets(write_config, monkeypatch, capsys):
    config = write_config(
        {
            "services": {"extractor": {"base_url": "http://torch", "auth": {"username": "u", "password": "${PW}"}}},
            "pipeline": {"enabled_steps": ["local_import"]},
        },
        jobs_dir=None,
    )
    monkeypatch.setenv("PW", "hunter2-secret")
    monkeypatch.setenv("APP_RETRY_MAX_ATTEMPTS", "3")
    code = main(["config", "check", str(config), "--dir", "/data", "--set", "compression.level=best"])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "hunter2-secret" not in out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "********" in lines["services.extractor.auth.password"]
    assert lines["retry.max_attempts"].endswith("3  (env APP_RETRY_MAX_ATTEMPTS)")
    assert lines["services.local_import.dir"].endswith("/data  (flag --dir)")
    assert lines["compression.level"].endswith("best  (flag --set compression.level)")
    assert lines["services.extractor.base_url"].endswith("(file)")
    assert lines["jobs_dir"].endswith("(default)")


def test_config_check_masks_a_token_in_a_service_url_s_query(write_config, monkeypatch, capsys):
    """A service URL may carry its token in the query (?access_token=${TOKEN}): a secret, masked like the others."""
    url = "https://validator.example/api?profile=mii&access_token=${VALIDATOR_TOKEN}#part"
    config = write_config(
        {"services": {"validation": {"url": url}}, "pipeline": {"enabled_steps": ["local_import", "validation"]}}
    )
    monkeypatch.setenv("VALIDATOR_TOKEN", "validator-token-5f0c1e")
    monkeypatch.setenv("APP_SERVICES_FLATTENING_SERVICE_URL", "http://flattener.example/?Token=flattener-token-9a7d")
    assert main(["config", "check", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "validator-token-5f0c1e" not in out and "flattener-token-9a7d" not in out
    lines = {line.split()[0]: line for line in out.splitlines()}
    shown = "https://validator.example/api?profile=mii&access_token=********#part  (file)"
    assert lines["services.validation.url"].endswith(shown)
    assert "http://flattener.example/?Token=********  (env" in lines["services.flattening.service_url"]


def test_config_check_exits_2_and_reports_every_problem_together(write_config, capsys):
    config = write_config(
        {
            "services": {"extractor": {"polling_interval": "PT0.5S"}},
            "retry": {"max_attempts": 11},
            "pipeline": {"enabled_steps": ["wait", "local_import"]},
        }
    )
    assert main(["config", "check", str(config)]) == EXIT_USAGE
    err = capsys.readouterr().err
    for key in ("services.extractor.polling_interval", "retry.max_attempts", "pipeline.enabled_steps"):
        assert key in err


def test_a_malformed_set_flag_is_a_usage_error(write_config, capsys):
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    assert main(["config", "check", str(config), "--set", "retry.max_attempts"]) == EXIT_USAGE
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["config", "check", str(config), "--set", "retry.nope=1"]) == EXIT_USAGE
    assert "retry.nope" in capsys.readouterr().err


def test_the_start_examples_of_the_help_parse_as_typed():
    commands = [line.strip() for line in START_EXAMPLES.splitlines() if line.strip().startswith(CLI)]
    assert len(commands) == 5
    for command in commands:
        assert build_parser().parse_args(shlex.split(command.removeprefix(CLI))).command is cmd_start, command


@pytest.mark.slow  # a subprocess: Python's last-resort log handler printed each warning once more, bare
def test_config_check_prints_each_warning_once(write_config):
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["extractor"]},
            "services": {"extractor": {"base_url": "http://torch.example", "username": "u", "password": "pw"}},
        }
    )
    checked = run_cli("config", "check", str(config))
    assert checked.returncode == EXIT_OK, checked.stderr
    assert checked.stderr.count("flat auth keys username, password are deprecated") == 1, checked.stderr
    assert checked.stderr.count("too short to be redacted safely") == 1, checked.stderr


def test_a_missing_anonymization_config_is_refused_before_the_job_exists(write_config, tmp_path, capsys):
    """A typo in --anonymization-config was found only when the pseudonymizer step ran: after the import (an
    extraction of hours), the job Failed. It is refused by config check and by start, like a missing lookup file."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "Patient.ndjson").write_text('{"resourceType": "Patient", "id": "p1"}\n')
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
            "services": {"local_import": {"dir": str(data)}, "pseudonymizer": {"url": "http://127.0.0.1:9"}},
        }
    )
    missing = tmp_path / "anonymisation.yml"
    for command in (["config", "check"], ["start"]):
        assert main([*command, str(config), "--anonymization-config", str(missing)]) == EXIT_USAGE
        error = capsys.readouterr().err
        assert f"services.pseudonymizer.anonymization_config: cannot read {missing}: No such file" in error, error
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize(
    ("flag", "step"), [("--anonymization-config", "pseudonymizer"), ("--dir", "local_import")], ids=["anon", "dir"]
)
def test_a_flag_for_a_step_the_pipeline_does_not_run_is_refused_naming_the_step(
    write_config, tmp_path, capsys, flag, step
):
    """The flag was dropped without a word: a job given --anonymization-config, on a pipeline with no
    pseudonymizer step, sent its data on unpseudonymized. start and config check refuse it before a job exists."""
    anonymization = tmp_path / "anonymization.yml"
    anonymization.write_text("fhirPathRules: []\n")
    steps, job_input = (
        (["http_import"], "https://files.example/Patient.ndjson")
        if flag == "--dir"
        else (["local_import"], str(tmp_path))
    )
    config = write_config({"pipeline": {"enabled_steps": steps}})
    for command in (["config", "check", str(config)], ["start", str(config), job_input]):
        assert main([*command, flag, str(anonymization if flag != "--dir" else tmp_path)]) == EXIT_USAGE
        error = capsys.readouterr().err
        assert f"pipeline.enabled_steps has no {step} step" in error and f"leave {flag} out" in error, error
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_files_named_from_the_home_directory_pass_the_check_the_job_would_pass(
    write_config, tmp_path, monkeypatch, capsys
):
    """``~/anonymization.yml`` (and a CA bundle so named) works in a job, whose paths are frozen with ``~``
    expanded; config check and start refused it as missing ('cannot read ~/anonymization.yml')."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "anonymization.yml").write_text("fhirPathRules: []\n")
    (home / "ca.pem").write_text("not looked into by the check\n")
    monkeypatch.setenv("HOME", str(home))
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
            "services": {"pseudonymizer": {"url": "http://127.0.0.1:9", "anonymization_config": "~/anonymization.yml"}},
            "tls": {"ca_cert_path": "~/ca.pem"},
        }
    )
    assert main(["config", "check", str(config)]) == EXIT_OK, capsys.readouterr().err
    check_new_job(str(config), str(tmp_path), {})  # start's checks: no JobError


@pytest.mark.parametrize(("given", "kept"), [(None, "2"), ("8", "8")], ids=["unset", "the-callers"])
def test_a_command_keeps_its_processes_to_two_malloc_arenas_unless_the_caller_chose(
    write_config, monkeypatch, capsys, given, kept
):
    """glibc's default of eight heaps per core left a zstd job's flow process 7 MB larger with what its import
    threads had freed; the processes a command starts (workers, servers, runs) get the variable from it."""
    monkeypatch.setenv("MALLOC_ARENA_MAX", given or "unset below, put back after the test")
    if given is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX")
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})

    assert main(["config", "check", str(config)]) == EXIT_OK

    assert os.environ["MALLOC_ARENA_MAX"] == kept
