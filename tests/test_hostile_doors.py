"""Hostile input at the doors the first checks do not guard: a settings file named again at ``continue``, a
service's answer nested deeper than the exact parser follows, ... Each is driven through the command line or the
step against the fakes."""

from __future__ import annotations

import pytest
import zstandard

from flows.run import EXIT_FAILED, EXIT_OK, main
from tasks.local_import import local_import
from tasks.streams.ndjson import NdjsonError
from tests.steps import step_input
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


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_file_compressed_with_a_window_over_128_mb_is_named_as_such_not_as_damaged(tmp_path):
    """``zstd --long=30`` (a 1 GiB window, for large exports) makes a frame that zstd itself decodes only when told
    ``--long=30``; the import, which keeps the decoder's memory at 128 MB, called the file damaged."""
    source = tmp_path / "in"
    source.mkdir()
    window = zstandard.ZstdCompressionParameters(window_log=30, compression_level=3, write_content_size=False)
    writer = zstandard.ZstdCompressor(compression_params=window).compressobj()
    data = b'{"resourceType":"Patient","id":"p1"}\n' * 1000
    (source / "big.ndjson.zst").write_bytes(writer.compress(data) + writer.flush())
    step = step_input(tmp_path / "job", "local_import", job_input=str(source))

    with pytest.raises(NdjsonError) as caught:
        local_import.fn(step)

    said = str(caught.value)
    assert str(source / "big.ndjson.zst") in said and "damaged" not in said
    assert "1024 MB window" in said and "128 MB" in said and "--long" in said
