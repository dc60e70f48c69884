"""What a job does when the ground moves: a kill during the extraction submission, an unreadable import directory,
a second process on a running job. Each case ends in a clear message, and nothing is done twice."""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from flows.run import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from tasks.job.layout import JobPaths
from tasks.job.record import read_facts
from tests.conftest import TESTDATA, extraction_tree, run_cli
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.extraction_server import start_extraction_server
from tests.support.filesystem import walk_as_nobody
from tests.support.jobs import job_file, only_job_dir, source_dir, start_cli_process, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
NO_RETRY = {"retry": {"max_attempts": 1, "initial_backoff_ms": 1, "max_backoff_ms": 5}}


@pytest.fixture
def extractor_config(write_config):
    """``extractor_config(base_url)``: an extraction job against the server at ``base_url``, retrying briefly."""

    def write(base_url: str) -> Path:
        tree = extraction_tree(base_url)
        return write_config({**tree, "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 50}})

    return write


@pytest.mark.slow
def test_a_kill_during_the_submission_never_submits_again_by_itself(tmp_path, extractor_config):
    # The server takes the POST and stalls before answering: the process dies with the submission in flight.
    stalled = EchoState(replies=[Reply(202, {"Content-Location": "/fhir/__status/lost"}, b"", delay=60)])
    with LoopbackServer(EchoHandler, stalled) as server:
        process = start_cli_process("start", str(extractor_config(server.base_url)), str(CRTDL))
        wait_for(lambda: [r for r in stalled.requests if r.method == "POST"] or None, process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        job_dir = only_job_dir(tmp_path / "jobs")
        assert "extraction_submission" in read_facts(job_dir)

        refused = run_cli("continue", str(job_dir), "--no-progress")
        assert refused.returncode == EXIT_FAILED
        posts = [r for r in stalled.requests if r.method == "POST"]
    assert len(posts) == 1
    message = refused.stderr
    assert "may or may not have that job" in message and "extraction list" in message
    assert f"continue {job_dir} --attach" in message and f"continue {job_dir} --resubmit" in message
    assert "Traceback" not in message

    # The operator decides: submit anew (here to a server that answers).
    with start_extraction_server() as torch:
        resubmitted = run_cli(
            "continue",
            str(job_dir),
            "--resubmit",
            "--set",
            f"services.extractor.base_url={torch.base_url}",
            "--no-progress",
        )
        assert resubmitted.returncode == EXIT_OK, resubmitted.stderr
        assert len(torch.state.submissions) == 1
    assert "extraction_submission" not in read_facts(job_dir)
    assert job_file(job_dir)["state"] == "Completed"


def test_attach_follows_a_given_extraction_without_submitting(tmp_path, extractor_config):
    with start_extraction_server() as torch:
        config = extractor_config(torch.base_url)
        # A job whose submission is in doubt: an earlier run recorded the attempt but not the answer.
        started = run_cli("start", str(config), str(CRTDL), "--set", "services.extractor.base_url=http://127.0.0.1:9")
        assert started.returncode == EXIT_FAILED
        job_dir = only_job_dir(tmp_path / "jobs")
        from tasks.job.record import record_facts

        record_facts(job_dir, extraction_submission={"generation": 0, "started_at": "2026-11-22T10:00:00+00:00"})
        import httpx

        from tests.support.extraction import submit

        with httpx.Client() as client:
            status_url = submit(client, torch)  # the job the operator found with `extraction list`
        attached = run_cli(
            "continue",
            str(job_dir),
            "--attach",
            status_url,
            "--set",
            f"services.extractor.base_url={torch.base_url}",
            "--no-progress",
        )
        assert attached.returncode == EXIT_OK, attached.stderr
        assert len(torch.state.submissions) == 1  # the test's own
    facts = read_facts(job_dir)
    assert facts["extraction_status_url"] == status_url and "extraction_submission" not in facts


def test_an_unreadable_subdirectory_fails_the_recursive_import_naming_it():
    # Tests run as root, who reads everything: the scan runs in a child that has dropped to nobody.
    top = Path(tempfile.mkdtemp(prefix="dupflow-unreadable-"))
    try:
        top.chmod(0o755)
        (top / "a.ndjson").write_text('{"resourceType":"Patient"}\n')
        hidden = top / "hidden"
        hidden.mkdir()
        (hidden / "b.ndjson").write_text('{"resourceType":"Patient"}\n')
        hidden.chmod(0o000)
        queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(target=walk_as_nobody, args=(str(top), queue))
        child.start()
        message = queue.get(timeout=60)
        child.join(60)
    finally:
        hidden.chmod(0o755)
        shutil.rmtree(top)
    assert f"cannot read directory {hidden}" in message


def test_a_second_continue_on_a_running_job_is_refused_with_exit_2_and_records_nothing(tmp_path, write_config):
    source = source_dir(tmp_path, {"a.ndjson": 2})
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"]}})
    assert run_cli("start", str(config), str(source), "--no-progress").returncode == EXIT_OK
    job_dir = only_job_dir(tmp_path / "jobs")
    before = job_file(job_dir)

    from flows.job_state import job_lock

    with job_lock(JobPaths(job_dir)):  # another process is working on the job
        second = run_cli("continue", str(job_dir), "--no-progress")
    assert second.returncode == EXIT_USAGE
    assert "is being worked on by another process" in second.stderr
    after = job_file(job_dir)
    assert after["state"] == before["state"] and after["flow_run_ids"] == before["flow_run_ids"]
