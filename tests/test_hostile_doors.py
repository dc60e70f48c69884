"""Hostile input at the doors the first checks do not guard: a settings file named again at ``continue``, a
service's answer nested deeper than the exact parser follows, ... Each is driven through the command line or the
step against the fakes."""

from __future__ import annotations

import pytest

from flows.run import EXIT_FAILED, EXIT_OK, main
from tests.support.jobs import only_job_dir
from tests.support.ndjson import write_lines
from tests.support.pseudonymization import OVERRIDE_CONFIG, patient, pseudonymizer_job

MB = 1024 * 1024


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_continue_naming_an_anonymization_config_over_the_bound_fails_naming_the_key_before_any_request(
    pseudonymizer_fake, tmp_path, write_config, capsys
):
    """``start`` refuses a config file over 16 MB, but one named at ``continue`` (``--set``, the configuration file
    edited, the file grown since) reached the step, which read all of it (``/dev/zero``: without end) and sent it
    with every request."""
    source = tmp_path / "in"
    source.mkdir()
    write_lines(source / "a.ndjson", [patient(1)])
    config = write_config({**pseudonymizer_job(pseudonymizer_fake), "retry": {"max_attempts": 1}})
    pseudonymizer_fake.state.fail_next, pseudonymizer_fake.state.fail_status = 1, 400
    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED
    job_dir = only_job_dir(tmp_path / "jobs")
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(OVERRIDE_CONFIG.read_bytes() + b"#" * (16 * MB) + b"\n")
    pseudonymizer_fake.state.reset()
    capsys.readouterr()

    key = "services.pseudonymizer.anonymization_config"
    assert main(["continue", str(job_dir), "--set", f"{key}={huge}", "--no-progress"]) != EXIT_OK

    assert pseudonymizer_fake.state.requests == []
    said = capsys.readouterr().err
    assert key in said and str(huge) in said and "16 MB" in said
