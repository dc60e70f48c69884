"""The ``pseudonymizer`` step: whole files through the fake service, in order, resumable, end to end via the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from config.errors import ConfigError
from config.loader import load_settings
from config.settings import Settings
from flows.run import EXIT_FAILED, EXIT_OK, main
from tasks.clients.pseudonymizer import MB
from tasks.pseudonymizer import (
    FileCounts,
    StepError,
    anonymization_config,
    pseudonymize_path,
    pseudonymize_with_service,
    read_anonymization_config,
)
from tests.support.ndjson import read_output, write_lines
from tests.conftest import run_cli, wait_until
from tests.fakes._server import LoopbackServer
from tests.support.ports import free_port
from tests.support.jobs import job_file, only_job_dir, read_report_artifact, start_cli_process, wait_for
from tests.support.pseudonymization import (
    OVERRIDE_CONFIG,
    OVERRIDE_DIR,
    ConcurrencyProbe,
    observation_bundle,
    open_service,
    patient,
    pseudonymizer_job,
    server_side,
)

_opens: list[str] | None = None
_opens_lock = threading.Lock()


def _record_open(event: str, args: tuple) -> None:
    """An audit hook: every file this process opens while a test records (``opened_paths``)."""
    if event == "open" and _opens is not None and isinstance(args[0], str | bytes | os.PathLike):
        with _opens_lock:
            if _opens is not None:
                _opens.append(os.fsdecode(args[0]))


@pytest.fixture(scope="session")
def open_audit_hook() -> None:
    """Installed once per process: an audit hook cannot be removed, and records nothing outside a test."""
    sys.addaudithook(_record_open)


@pytest.fixture
def opened_paths(open_audit_hook) -> Iterator[list[str]]:
    """The path of every file opened, in any thread, while the test runs (counted by the interpreter's audit
    hook: nothing of ours is replaced)."""
    global _opens
    opened: list[str] = []
    _opens = opened
    yield opened
    _opens = None


def run_file(
    pseudonymizer_fake: LoopbackServer, source: Path, dest: Path, concurrency: int = 4, **options: Any
) -> FileCounts:
    with open_service(pseudonymizer_fake, **options) as service:
        written = {"level": "fastest", "max_line_bytes": 100 * MB}
        return pseudonymize_path(source, dest, service, **written, concurrency=concurrency)


# --- one file ----------------------------------------------------------------------------------------------------


def test_output_keeps_the_input_order_when_answers_come_back_out_of_order_with_8_in_flight(
    pseudonymizer_fake, tmp_path
):
    probe = ConcurrencyProbe(pseudonymizer_fake, hold_seconds=0.02, jitter=True, fill=8)
    pseudonymizer_fake.state.reset(status_hook=probe)
    patients = [patient(i) for i in range(160)]
    source = write_lines(tmp_path / "Patient.ndjson", patients)

    counts = run_file(pseudonymizer_fake, source, tmp_path / "out.ndjson.zst", concurrency=8)

    assert probe.finished != sorted(probe.finished), "answers should have completed out of order"
    assert probe.most_in_flight == 8
    assert read_output(tmp_path / "out.ndjson.zst") == [server_side(p, pseudonymizer_fake) for p in patients]
    assert (counts.resources_in, counts.resources_out, counts.requests) == (160, 160, 160)


def test_more_than_100_requests_in_flight_each_get_a_connection(pseudonymizer_fake, tmp_path):
    """httpx pools 100 connections by default: the rest waited for one within their own deadline and failed."""
    probe = ConcurrencyProbe(pseudonymizer_fake, hold_seconds=0, fill=150, fill_timeout=60)
    pseudonymizer_fake.state.reset(status_hook=probe)
    source = write_lines(tmp_path / "Patient.ndjson", [patient(i) for i in range(300)])
    service = {"url": pseudonymizer_fake.base_url, "max_concurrent_requests": 150}
    settings = Settings.model_validate(
        {"pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]}, "services": {"pseudonymizer": service}}
    )

    counts = pseudonymize_with_service(settings, source, tmp_path / "out.ndjson", None, None)

    assert probe.most_in_flight == 150 and counts.resources_out == 300


def test_a_slow_answer_holds_back_at_most_twice_max_concurrent_requests_resources(pseudonymizer_fake, tmp_path):
    release = threading.Event()
    head = patient(0, note="the only resource of this size")
    pseudonymizer_fake.state.reset(
        status_hook=lambda r: release.wait(10) and None if r.size == len(orjson.dumps(head)) else None
    )
    source = write_lines(tmp_path / "Patient.ndjson", [head] + [patient(i) for i in range(1, 100)])
    worker = threading.Thread(target=run_file, args=(pseudonymizer_fake, source, tmp_path / "out.ndjson.zst", 3))
    worker.start()
    try:
        # Once the five others are answered, only the held one is pending: the client must not read further.
        answered = lambda: sum(r.status == 200 for r in pseudonymizer_fake.state.requests)  # noqa: E731
        wait_until(lambda: answered() >= 2 * 3 - 1)
        assert len(pseudonymizer_fake.state.requests) == 2 * 3
    finally:
        release.set()
        worker.join(10)
    assert len(read_output(tmp_path / "out.ndjson.zst")) == 100


def test_a_file_with_a_large_bundle_counts_requests_and_split_bundles_and_loses_no_entry(pseudonymizer_fake, tmp_path):
    bundle = observation_bundle(count=30, pad=100_000)
    resources = [patient(0), bundle, patient(1)]
    source = write_lines(tmp_path / "core.ndjson", resources)

    counts = run_file(pseudonymizer_fake, source, tmp_path / "core.ndjson.zst", split_threshold_mb=1)

    out = read_output(tmp_path / "core.ndjson.zst")
    assert [r["resourceType"] for r in out] == ["Patient", "Bundle", "Patient"]
    assert [e["resource"]["valueInteger"] for e in out[1]["entry"]] == list(range(30))
    assert counts.bundles_split == 1 and counts.requests == len(pseudonymizer_fake.state.requests) >= 5
    assert counts.resources_in == counts.resources_out == 3


def test_a_rejected_resource_fails_naming_file_line_and_the_services_text_and_leaves_no_output(
    pseudonymizer_fake, tmp_path
):
    broken = {"resourceType": "Parameters", "id": "q1", "parameter": []}
    source = write_lines(tmp_path / "a.ndjson", [patient(1), patient(2), broken, patient(3)])

    with pytest.raises(StepError) as caught:
        run_file(pseudonymizer_fake, source, tmp_path / "a.ndjson.zst")

    message = str(caught.value)
    assert f"{source}: line 3 (Parameters/q1)" in message
    assert "HTTP 400" in message and "Parameters has no 'resource' part" in message
    assert list(tmp_path.iterdir()) == [source]


def test_an_oversized_entry_fails_naming_file_line_resource_size_threshold_and_remedies(pseudonymizer_fake, tmp_path):
    bundle = observation_bundle(count=2, pad=10)
    bundle["entry"][0]["resource"]["note"][0]["text"] = "y" * (2 * MB)
    source = write_lines(tmp_path / "b.ndjson", [patient(1), bundle])

    with pytest.raises(StepError) as caught:
        run_file(pseudonymizer_fake, source, tmp_path / "b.ndjson.zst", split_threshold_mb=1)

    message = str(caught.value)
    assert f"{source}: line 2 (Bundle/b1)" in message and "(Observation/o0) is 2.0 MB" in message
    assert "threshold of 1 MB" in message and "bundle_split_threshold_mb (up to 100)" in message


def test_a_413_fails_with_the_hint_to_lower_the_threshold_or_raise_the_server_limit(pseudonymizer_fake, tmp_path):
    pseudonymizer_fake.state.reset(max_body_bytes=500)
    source = write_lines(tmp_path / "c.ndjson", [observation_bundle(count=3, pad=400)])

    with pytest.raises(StepError) as caught:
        run_file(pseudonymizer_fake, source, tmp_path / "c.ndjson.zst", split_threshold_mb=1)

    assert "HTTP 413" in str(caught.value) and "lower services.pseudonymizer.bundle_split_threshold_mb" in str(
        caught.value
    )
    assert [r.status for r in pseudonymizer_fake.state.requests] == [413]


def test_an_unreadable_anonymization_config_names_the_key_and_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(StepError) as caught:
        read_anonymization_config(str(missing))
    assert "services.pseudonymizer.anonymization_config" in str(caught.value) and str(missing) in str(caught.value)


def test_max_concurrent_requests_defaults_to_4_and_must_be_between_1_and_1000():
    steps = {"pipeline.enabled_steps": "[local_import]"}
    assert load_settings(None, env={}, overrides=steps).settings.services.pseudonymizer.max_concurrent_requests == 4
    with pytest.raises(ConfigError, match="max_concurrent_requests .*must be between 1 and 1000"):
        load_settings(None, env={}, overrides={**steps, "services.pseudonymizer.max_concurrent_requests": "0"})


# --- end to end through the CLI ----------------------------------------------------------------------------------


def override_patients_dir(tmp_path: Path) -> Path:
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(OVERRIDE_DIR / "Patient.ndjson", source / "Patient.ndjson")
    return source


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_start_with_anonymization_config_sends_parameters_and_the_request_rules_apply(
    pseudonymizer_fake, tmp_path, write_config
):
    source = override_patients_dir(tmp_path)
    config = write_config(pseudonymizer_job(pseudonymizer_fake))

    code = main(["start", str(config), str(source), "--anonymization-config", str(OVERRIDE_CONFIG), "--no-progress"])

    assert code == EXIT_OK
    assert all(
        r.body_kind == "parameters" and r.parameter_names == ["config", "resource"]
        for r in pseudonymizer_fake.state.requests
    )
    assert len(pseudonymizer_fake.state.requests) == 2 and pseudonymizer_fake.state.config_parses == 1
    job_dir = only_job_dir(tmp_path / "jobs")
    out = read_output(job_dir / "pseudonymizer" / "Patient.ndjson.zst")
    assert [p["name"] for p in out] == [[{"family": "Doe", "given": ["John"]}], [{"family": "Roe", "given": ["Jane"]}]]
    assert [p["id"] for p in out] == ["anon-patient-1", "anon-patient-2"] and all("gender" not in p for p in out)
    report = read_report_artifact(f"job-{job_dir.name}-02-pseudonymizer-report")
    assert report == [
        {
            "file": "Patient.ndjson.zst",
            "lines in": 2,
            "lines out": 2,
            "bundles split": 0,
            "requests": 2,
            "duration (s)": report[0]["duration (s)"],
        }
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_the_anonymization_config_is_read_once_per_run_however_many_files(
    pseudonymizer_fake, tmp_path, write_config, opened_paths
):
    source = tmp_path / "in"
    source.mkdir()
    for name in ("a", "b", "c"):
        shutil.copy(OVERRIDE_DIR / "Patient.ndjson", source / f"{name}.ndjson")
    config = write_config(pseudonymizer_job(pseudonymizer_fake))

    code = main(["start", str(config), str(source), "--anonymization-config", str(OVERRIDE_CONFIG), "--no-progress"])

    assert code == EXIT_OK
    assert len(pseudonymizer_fake.state.requests) == 6
    assert all(r.parameter_names == ["config", "resource"] for r in pseudonymizer_fake.state.requests)
    # the job freezes paths resolved (symlinks followed): count opens of the same file, however it was named
    assert [os.path.realpath(path) for path in opened_paths].count(os.path.realpath(OVERRIDE_CONFIG)) == 1


def test_a_file_task_in_a_process_that_has_not_seen_the_config_refuses_a_changed_file(tmp_path):
    path = tmp_path / "anonymization.yaml"
    path.write_bytes(b"rules: []\n")
    digest_the_step_read = hashlib.sha256(b"rules: [old]\n").hexdigest()

    with pytest.raises(StepError, match="changed while the step ran") as caught:
        anonymization_config(str(path), digest_the_step_read)

    assert "services.pseudonymizer.anonymization_config" in str(caught.value) and str(path) in str(caught.value)


def test_a_file_task_in_a_process_that_has_not_seen_the_config_reads_the_unchanged_file(tmp_path):
    path = tmp_path / "anonymization.yaml"
    path.write_bytes(b"rules: [fresh]\n")

    config = anonymization_config(str(path), hashlib.sha256(b"rules: [fresh]\n").hexdigest())

    assert config is not None and config.data == b"rules: [fresh]\n"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_start_without_anonymization_config_sends_bare_resources_and_the_servers_rules_apply(
    pseudonymizer_fake, tmp_path, write_config
):
    source = override_patients_dir(tmp_path)
    config = write_config(pseudonymizer_job(pseudonymizer_fake))

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_OK

    assert [r.body_kind for r in pseudonymizer_fake.state.requests] == ["resource", "resource"]
    job_dir = only_job_dir(tmp_path / "jobs")
    originals = [json.loads(line) for line in (source / "Patient.ndjson").read_text().splitlines()]
    assert read_output(job_dir / "pseudonymizer" / "Patient.ndjson.zst") == [
        server_side(p, pseudonymizer_fake) for p in originals
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_an_anonymization_config_gone_by_the_time_the_step_runs_fails_it_before_any_request(
    pseudonymizer_fake, tmp_path, write_config, capsys
):
    """A missing file is refused at start (tests/test_cli_config.py); one removed while the job waited at a gate
    fails the step, naming the key, before any request."""
    source = override_patients_dir(tmp_path)
    tree = pseudonymizer_job(pseudonymizer_fake)
    tree["pipeline"]["enabled_steps"] = ["local_import", "wait", "pseudonymizer"]
    config = write_config(tree)
    missing = tmp_path / "missing.yaml"
    missing.write_text("fhirPathRules: []\n")

    assert main(["start", str(config), str(source), "--anonymization-config", str(missing), "--no-progress"]) == 0
    missing.unlink()
    code = main(
        ["continue", only_job_dir(tmp_path / "jobs").name, "--jobs-dir", str(tmp_path / "jobs"), "--no-progress"]
    )

    assert code == EXIT_FAILED

    err = capsys.readouterr().err
    assert "services.pseudonymizer.anonymization_config" in err and str(missing) in err
    assert pseudonymizer_fake.state.requests == []
    assert job_file(only_job_dir(tmp_path / "jobs"))["state"] == "Failed"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_pseudonymizer_where_nothing_answers_fails_naming_the_key_and_the_set_that_fixes_it(
    pseudonymizer_fake, tmp_path, write_config, capsys
):
    source = override_patients_dir(tmp_path)
    tree = pseudonymizer_job(pseudonymizer_fake)
    dead = f"http://127.0.0.1:{free_port()}"
    tree["services"]["pseudonymizer"]["url"] = dead
    config = write_config(tree)

    assert main(["start", str(config), str(source), "--no-progress"]) == EXIT_FAILED

    err = capsys.readouterr().err
    job_dir = only_job_dir(tmp_path / "jobs")
    assert f"nothing answers at {dead}: is the service running there, and is services.pseudonymizer.url right?" in err
    assert f"continue {job_dir} --set services.pseudonymizer.url=VALUE" in err, err
    fixed = ["--set", f"services.pseudonymizer.url={pseudonymizer_fake.base_url}"]
    assert main(["continue", str(job_dir), *fixed, "--no-progress"]) == EXIT_OK
    assert job_file(job_dir)["state"] == "Completed"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_killed_mid_file_continue_redoes_only_the_unfinished_file_without_losing_or_duplicating(
    pseudonymizer_fake, tmp_path, write_config
):
    pseudonymizer_fake.state.reset(latency_seconds=0.02)
    source = tmp_path / "in"
    source.mkdir()
    first = [patient(i) for i in range(20)]
    second = [patient(i) for i in range(100, 700)]
    write_lines(source / "a.ndjson", first)
    write_lines(source / "b.ndjson", second)
    jobs = tmp_path / "jobs"
    job = pseudonymizer_job(pseudonymizer_fake, concurrency=2)
    config = write_config({**job, "pipeline": {**job["pipeline"], "file_batches": {"max_files": 1}}})  # a run a file

    process = start_cli_process("start", str(config), str(source), "--no-progress")
    probe = lambda: next(jobs.glob("*/pseudonymizer/.b.ndjson.zst.part"), None)  # noqa: E731
    partial = wait_for(probe, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    folder = partial.parent
    finished_mtime = (folder / "a.ndjson.zst").stat().st_mtime_ns
    assert not (folder / "b.ndjson.zst").exists()

    pseudonymizer_fake.state.reset()
    result = run_cli("continue", str(folder.parent), "--no-progress")

    assert result.returncode == EXIT_OK, result.stderr
    assert (folder / "a.ndjson.zst").stat().st_mtime_ns == finished_mtime
    assert read_output(folder / "a.ndjson.zst") == [server_side(p, pseudonymizer_fake) for p in first]
    assert read_output(folder / "b.ndjson.zst") == [server_side(p, pseudonymizer_fake) for p in second]
    assert len(pseudonymizer_fake.state.requests) == len(second)  # only the unfinished file was sent again
    assert not list(folder.glob(".*.part"))
