"""Issue 51, item 22 (its URL part): a URL with a character that does not show as itself (Unicode Cc, Cf, Zl, Zp: a
line separator that forges a line, a right-to-left override that shows another address) is refused where it
enters, named by its U+ code and never printed: a configured URL by ``config check`` (the keys themselves in
tests/test_config_errors.py), a job input and a status URL to attach to before the job stores them."""

from __future__ import annotations

import pytest

from flows.jobs import prepare_job
from flows.pipeline import checked_attach
from flows.run import EXIT_USAGE, main
from tasks.core.errors import JobError

INVISIBLE = [("\u2028", "line or paragraph separator U+2028"), ("\u2029", "line or paragraph separator U+2029")]
INVISIBLE += [("\u202e", "bidirectional text control character U+202E"), ("\u2066", "bidirectional text control")]
INVISIBLE += [("\u200b", "invisible format character U+200B"), ("\x85", "control character U+0085")]
IDS = ["line-separator", "paragraph-separator", "right-to-left-override", "left-to-right-isolate", "zero-width", "NEL"]


def shown_raw(text: str) -> bool:
    return any(char in text for char, _ in INVISIBLE)


@pytest.mark.parametrize(("char", "said"), INVISIBLE, ids=IDS)
def test_a_job_input_url_with_an_invisible_character_is_refused_before_the_job_exists(
    tmp_path, write_config, char, said
):
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})
    url = f"https://files.example/Patient{char}.ndjson?page=2"

    with pytest.raises(JobError) as refused:
        prepare_job(None, str(config), url, {}, overrides_source="--set")

    message = str(refused.value)
    assert message.startswith(f"the job input (INPUT) contains the {said}") and "retype the URL" in message
    assert not shown_raw(message) and "files.example" not in message
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize(("char", "said"), INVISIBLE, ids=IDS)
def test_start_refuses_a_job_input_url_with_an_invisible_character_in_one_line(
    tmp_path, write_config, capsys, char, said
):
    config = write_config({"pipeline": {"enabled_steps": ["http_import"]}})

    exit_code = main(["start", str(config), f"https://files{char}.example/Patient.ndjson"])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and error.count("\n") == 1 and said in error and not shown_raw(error)


@pytest.mark.parametrize(("char", "said"), INVISIBLE, ids=IDS)
def test_continue_attach_with_an_invisible_character_is_refused(tmp_path, capsys, char, said):
    exit_code = main(["continue", str(tmp_path / "no-such-job"), "--attach", f"https://torch.example/__status/{char}1"])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and error.count("\n") == 1
    assert f"--attach contains the {said}" in error and not shown_raw(error)


def test_a_deployment_run_s_attach_with_a_line_separator_is_refused():
    with pytest.raises(JobError, match="attach contains the line or paragraph separator U\\+2028") as refused:
        checked_attach("https://torch.example/__status/1\u2028INFO resumed")
    assert not shown_raw(str(refused.value))


def test_config_check_refuses_a_service_url_with_a_right_to_left_override_naming_key_and_code(
    write_config, monkeypatch, capsys
):
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "validation"]}})
    monkeypatch.setenv("APP_SERVICES_VALIDATION_URL", "https://validator.example/\u202eexe.api")

    assert main(["config", "check", str(config)]) == EXIT_USAGE

    captured = capsys.readouterr()
    assert "services.validation.url" in captured.err and "U+202E" in captured.err
    assert not shown_raw(captured.err + captured.out) and "validator.example" not in captured.err + captured.out
