"""A Retry of a job's flow run (the UI's, a worker's, a hand-over's) goes on as a plain continue: the flags a
continue or a form gave apply once, and a wait step stopped unanswered is reached again. A module of its own, so that
``--dist loadscope`` runs it beside the other slow modules."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from flows.job_state import newest_run
from flows.run import EXIT_FAILED
from tasks.job.layout import JobPaths
from tasks.job.record import read_facts
from tests.conftest import TESTDATA, extraction_tree, wait_until
from tests.fakes.extraction_server import ExtractionServer, start_extraction_server
from tests.fakes.fhir_server import FhirFakeState, start_fhir_fake
from tests.support.controls import finished, home_command, press, released_note, server_state
from tests.support.deployments import api
from tests.support.extraction import submit
from tests.support.jobs import only_job_dir
from tests.support.prefect_servers import stop_runner_of
from tests.support.sending import generated, write_ndjson

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
NO_RETRY = {"retry": {"max_attempts": 1, "initial_backoff_ms": 1, "max_backoff_ms": 5}}


@pytest.fixture
def home(prefect_api):
    """The local Prefect server's home; the runner its commands start stops with the test (later tests share it)."""
    home = Path(prefect_api["database"]).parent
    yield home
    stop_runner_of(home)


def in_doubt(config: Path, torch: ExtractionServer, home: Path) -> Path:
    """A job started on the home's server whose kick-off got no Content-Location: its submission in doubt."""
    torch.state.omit_content_location = True
    code, said = finished(home_command("start", str(config), str(CRTDL), "--no-progress", home=home))
    job = only_job_dir(config.parent / "jobs")
    assert code == EXIT_FAILED and "extraction_submission" in read_facts(job), said
    torch.state.omit_content_location = False
    return job


def retried_in_the_ui(api_url: str, job: Path) -> dict:
    """The job's run after a Retry pressed in the UI, once the home's runner has run it to its end."""
    run = newest_run(JobPaths(job))
    press(api_url, run["id"], {"type": "SCHEDULED", "name": "AwaitingRetry"})
    ended = ("Completed", "Failed")
    wait_until(lambda: server_state(api_url, run["id"]) in ended, "the retried run's end", timeout=120, every=0.5)
    return api(api_url, "GET", f"/flow_runs/{run['id']}")["state"]


@pytest.mark.parametrize("then", ["a download stalls", "the new kick-off is in doubt too"])
def test_a_retry_in_the_ui_after_continue_resubmit_never_submits_again(write_config, prefect_api, home, then):
    """The finding: the run kept resubmit among its parameters on the server, so a Retry pressed after a later
    failure dropped the resubmitted extraction and submitted a third: a whole extraction repeated. A Retry goes on
    as a plain continue: it follows the new extraction, or stops on its kick-off in doubt as continue does."""
    with start_extraction_server() as torch:
        config = write_config(extraction_tree(torch.base_url, download_stall_timeout="PT1S") | NO_RETRY)
        job = in_doubt(config, torch, home)
        stalls = then == "a download stalls"
        torch.state.omit_content_location = not stalls
        torch.state.stall_downloads, torch.state.stall_seconds = 1000 if stalls else 0, 3.0
        code, said = finished(home_command("continue", str(job), "--resubmit", "--no-progress", home=home))
        assert code == EXIT_FAILED and len(torch.state.submissions) == 2, said
        torch.state.omit_content_location, torch.state.stall_downloads = False, 0  # the causes gone

        ended = retried_in_the_ui(prefect_api["api_url"], job)

        assert len(torch.state.submissions) == 2
        resubmitted = torch.state.submissions[1].job_id
    if stalls:
        assert ended["name"] == "Completed", ended["message"]
        assert read_facts(job)["extraction_job_id"] == resubmitted
    else:
        assert ended["name"] == "Failed" and "may or may not have that job" in ended["message"], ended["message"]


def test_a_retry_of_a_deployment_run_given_resubmit_never_submits_again(write_config, prefect_api, home):
    """A deployment's form gives resubmit to the run it makes (here the job's own, its first run deleted): the
    run's first execution applies it, a Retry of that run (a worker's, the UI's) goes on as a plain continue."""
    api_url = prefect_api["api_url"]
    with start_extraction_server() as torch:
        config = write_config(extraction_tree(torch.base_url, download_stall_timeout="PT1S") | NO_RETRY)
        job = in_doubt(config, torch, home)
        first = newest_run(JobPaths(job))
        api(api_url, "DELETE", f"/flow_runs/{first['id']}")
        torch.state.stall_downloads, torch.state.stall_seconds = 1000, 3.0
        form = {"parameters": {"job_id": job.name, "config_path": str(config), "resubmit": True}}
        made = api(api_url, "POST", f"/deployments/{first['deployment_id']}/create_flow_run", json=form)
        wait_until(lambda: server_state(api_url, made["id"]) == "Failed", "its failure", timeout=120, every=0.5)
        assert len(torch.state.submissions) == 2
        torch.state.stall_downloads = 0

        ended = retried_in_the_ui(api_url, job)

        assert len(torch.state.submissions) == 2
    assert ended["name"] == "Completed", ended["message"]


def test_a_retry_in_the_ui_after_continue_attach_goes_on_from_the_extraction(write_config, prefect_api, home):
    """The finding: the run kept attach among its parameters on the server; once the extraction had finished, every
    Retry failed ("has finished its extraction: attach and resubmit apply to a submission in doubt")."""
    fhir = start_fhir_fake(FhirFakeState(unavailable=1000))
    try:
        with start_extraction_server() as torch:
            tree = extraction_tree(torch.base_url)
            auth = {"username": "dupflow", "password": "not-a-secret-here"}
            send = {"send_as": "direct_resource_load", "url": fhir.base_url, "auth": auth}
            tree["pipeline"]["enabled_steps"].append("send")
            tree["services"]["send"] = send
            job = in_doubt(write_config(tree | NO_RETRY), torch, home)
            with httpx.Client() as client:
                status_url = submit(client, torch)  # the job the operator found with `extraction list`
            attach = home_command("continue", str(job), "--attach", status_url, "--no-progress", home=home)
            code, said = finished(attach)
            assert code == EXIT_FAILED and "step 1 extractor" in said and "(HTTP 503)" in said, said  # server down
            fhir.state.unavailable = 0

            ended = retried_in_the_ui(prefect_api["api_url"], job)

            assert len(torch.state.submissions) == 2  # the one in doubt, the test's own
    finally:
        fhir.stop()
    assert ended["name"] == "Completed", ended["message"]
    assert fhir.state.applied


def test_a_retry_in_the_ui_of_a_job_past_its_wait_timeout_brings_it_back_to_its_wait(
    tmp_path, write_config, prefect_api
):
    """The finding: the suspension that ended unanswered (past pipeline.wait_timeout, or cancelled) had fired its
    pause key for good; each Retry suspended under it again, was refused, and failed on a form never filled in
    (only continue on a terminal went on)."""
    api_url, home = prefect_api["api_url"], Path(prefect_api["database"]).parent
    source = tmp_path / "in"
    write_ndjson(source / "data.ndjson", generated(3, "p"))
    config = write_config({"pipeline": {"enabled_steps": ["local_import", "wait"], "wait_timeout": "PT2S"}})
    code, said = finished(home_command("start", str(config), str(source), "--no-progress", home=home))
    assert code == 0 and "awaiting inspection" in said, said
    job = only_job_dir(tmp_path / "jobs")
    run = newest_run(JobPaths(job))
    assert run is not None
    wait_until(lambda: server_state(api_url, run["id"]) == "Failed", "the pause past its time", timeout=120, every=0.5)

    press(api_url, run["id"], {"type": "SCHEDULED", "name": "AwaitingRetry"})
    wait_until(lambda: server_state(api_url, run["id"]) == "Suspended", "Suspended again", timeout=90, every=0.5)
    answer = {"run_input": {"confirmed": True, "note": "dates checked"}}
    api(api_url, "POST", f"/flow_runs/{run['id']}/resume", json=answer)

    wait_until(lambda: server_state(api_url, run["id"]) == "Completed", "Completed", timeout=90, every=0.5)
    assert released_note(job) == "dates checked"
