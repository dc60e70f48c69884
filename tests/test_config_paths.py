"""Where relative paths point, empty keys, and the other configuration rules of issue 8."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from config.errors import ConfigError
from config.loader import PATH_KEYS, absolute_path_overrides, load_settings
from config.runtime import job_on_command_line
from flows.job_state import find_job_dir
from tasks.core.errors import JobError
from tests.conftest import REPO_ROOT

LOCAL_ONLY = "pipeline:\n  enabled_steps: [local_import]\n"


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory that is not the configuration file's directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(LOCAL_ONLY + text, encoding="utf-8")
    return path


def test_relative_paths_in_the_file_resolve_against_its_directory(tmp_path: Path, elsewhere: Path) -> None:
    folder = tmp_path / "conf"
    (folder / "rules.json").parent.mkdir(parents=True)
    (folder / "rules.json").write_text("[]", encoding="utf-8")
    path = write(
        folder,
        "jobs_dir: jobs\nservices:\n  local_import: {dir: ../data}\n"
        "  pseudonymizer: {anonymization_config: anon.yaml}\n"
        "  crtdl_preprocessing: {enrichments_path: rules.json}\n  flattening: {lookup_path: ./lookup.json}\n"
        "tls: {ca_cert_path: certs/ca.pem}\n",
    )
    overrides = absolute_path_overrides(load_settings(path, env={}).settings)
    assert overrides == {
        "jobs_dir": str(folder / "jobs"),
        "services.local_import.dir": str(tmp_path / "data"),
        "services.pseudonymizer.anonymization_config": str(folder / "anon.yaml"),
        "services.crtdl_preprocessing.enrichments_path": str(folder / "rules.json"),
        "services.flattening.lookup_path": str(folder / "lookup.json"),
        "tls.ca_cert_path": str(folder / "certs" / "ca.pem"),
    }
    assert set(overrides) == set(PATH_KEYS)


def test_relative_paths_from_flags_and_variables_resolve_against_the_current_directory(
    tmp_path: Path, elsewhere: Path
) -> None:
    path = write(tmp_path / "conf", "services:\n  local_import: {dir: in-file}\n")
    loaded = load_settings(
        path,
        env={"APP_JOBS_DIR": "env-jobs"},
        overrides={"services.local_import.dir": "flag-dir", "services.flattening.lookup_path": "~/lookup.json"},
    )
    overrides = absolute_path_overrides(loaded.settings)
    assert overrides["jobs_dir"] == str(elsewhere / "env-jobs")
    assert overrides["services.local_import.dir"] == str(elsewhere / "flag-dir")
    assert overrides["services.flattening.lookup_path"] == str(Path.home() / "lookup.json")


def test_the_default_jobs_dir_and_absolute_paths_are_kept(tmp_path: Path, elsewhere: Path) -> None:
    path = write(tmp_path / "conf", f"services:\n  local_import: {{dir: {tmp_path}/abs}}\n")
    overrides = absolute_path_overrides(load_settings(path, env={}).settings)
    assert overrides == {"jobs_dir": str(elsewhere / "jobs"), "services.local_import.dir": str(tmp_path / "abs")}


def test_the_embedded_default_configuration_keeps_jobs_under_the_current_directory(elsewhere: Path) -> None:
    loaded = load_settings(REPO_ROOT / "config" / "default.yaml", env={})
    assert absolute_path_overrides(loaded.settings)["jobs_dir"] == str(elsewhere / "jobs")


def test_a_key_present_but_empty_is_the_same_as_absent(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "services:\n  extractor:\n    base_url: https://torch\n    auth:\n      # username: u\n      # password: p\n"
        "  send:\n  pseudonymizer:\n    url:\n    auth:\ntls:\n",
    )
    settings = load_settings(path, env={}).settings
    assert settings.services.extractor.auth.api_key_header == "x-api-key"
    assert not settings.services.extractor.auth.uses_basic and settings.services.pseudonymizer.url is None


def test_an_empty_pipeline_block_still_asks_for_the_steps(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("pipeline:\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert any(p.startswith("pipeline.enabled_steps: is empty") for p in error.value.problems)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("retry.max_backoff_ms", "99999999999999999999", "must be between 0 and 3600000"),
        ("services.extractor.file_ready_retries", "10000000", "must be at most 10000; lower it"),
        ("services.extractor.polling_interval", "P99999999999D", "longer than the maximum of P3650D"),
    ],
)
def test_absurd_numbers_are_refused_before_they_overflow_a_sleep(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(None, env={"APP_PIPELINE_ENABLED_STEPS": "local_import"}, overrides={key: value})
    (problem,) = error.value.problems
    assert problem.startswith(f"{key} (from --set {key}):") and fragment in problem


def test_a_job_is_named_by_its_id_in_the_default_jobs_directory_else_by_its_directory(tmp_path, monkeypatch):
    """A printed ``continue ID`` failed as typed when the configuration's jobs_dir was not the default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APP_JOBS_DIR", raising=False)
    assert job_on_command_line(tmp_path / "jobs" / "0b6f8e3c") == "0b6f8e3c"
    assert job_on_command_line(Path("jobs/0b6f8e3c")) == "0b6f8e3c"
    assert job_on_command_line(tmp_path / "site" / "0b6f8e3c") == str(tmp_path / "site" / "0b6f8e3c")
    monkeypatch.setenv("APP_JOBS_DIR", str(tmp_path / "site"))
    assert job_on_command_line(tmp_path / "site" / "0b6f8e3c") == "0b6f8e3c"


def test_a_job_named_by_a_directory_with_a_space_is_quoted_for_the_shell(tmp_path, monkeypatch):
    """The printed ``continue`` (and the submission-in-doubt advice) failed as pasted: ``unrecognized arguments``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APP_JOBS_DIR", raising=False)
    job_dir = tmp_path / "jobs dir \u00fc" / "0b6f8e3c"
    assert shlex.split(f"continue {job_on_command_line(job_dir)} --no-progress") == [
        "continue",
        str(job_dir),
        "--no-progress",
    ]


def test_a_job_directory_whose_start_was_killed_before_its_record_says_so(tmp_path):
    """A kill the moment the directory was made: continue said "no job" of the directory it was given."""
    started = tmp_path / "jobs" / "ed8317ea-5f0c-4b1e-9a7e-3c2d1b0a9f8e"
    started.mkdir(parents=True)
    (started / ".job.json.lock").write_text("")
    for named in (str(started), started.name):
        with pytest.raises(JobError) as refused:
            find_job_dir(named, tmp_path / "jobs")
        assert str(refused.value) == (
            f"{started} holds no job.json: its start was stopped before the job was recorded, and nothing ran; start "
            "the job again, and remove that directory"
        )
    with pytest.raises(JobError, match="^no job nothing-here in "):
        find_job_dir("nothing-here", tmp_path / "jobs")
