"""Issue 22, hardening round two, the extraction side: URLs with credentials from every door, a manifest too large
to be sensible, files that need a token on another origin, one request per poll, and two ``continue`` at once.

Against the fake extraction server (tests/fakes/extraction_server.py) and scripted servers on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from config.errors import ConfigError
from config.loader import load_settings
from config.services import AuthSettings
from config.settings import TlsSettings
from flows.jobs import prepare_job
from flows.run import EXIT_OK, EXIT_USAGE, main
from tasks.clients.downloads import download_ndjson, wait_until_available
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_documents import ExtractionError, manifest_request, progress_values, requires_access_token
from tasks.clients.extraction_documents import result_urls
from tasks.clients.extraction_jobs import ExtractionJob, cohort_patient_ids
from tasks.clients.extraction_server import MAX_MANIFEST_BYTES
from tasks.clients.http import ServiceEndpoint, build_client
from tasks.job.record import read_facts
from tasks.core.url_credentials import CredentialsInUrlError, refuse_credentials_in_url, shown_url
from tests.conftest import REPO_ROOT, TESTDATA, extraction_tree, run_cli, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.extraction_server import start_extraction_server
from tests.fakes.extraction_state import ManualClock
from tests.support.extraction import CRTDL, FAST_RETRY, LONG_JOB, SimulatedTime, client_for
from tests.support.jobs import job_file

CRTDL_PATH = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
PASSWORD = "pw-Sekr3t"
API_KEY = "key-secret"


@pytest.fixture
def sim() -> SimulatedTime:
    return SimulatedTime()


def extractor_config(write_config, base_url: str, **extractor) -> Path:
    """An extraction-only configuration (jobs in tmp_path/jobs) with second-long polling intervals."""
    return write_config(extraction_tree(base_url, **extractor))


def new_job_dir(write_config, base_url: str) -> Path:
    """A prepared extraction job (its CRTDL in place) that has not run yet."""
    config = extractor_config(write_config, base_url)
    return prepare_job(None, str(config), str(CRTDL_PATH), {}, overrides_source="--set").paths.job_dir


def texts_of_job(job_dir: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in job_dir.rglob("*") if path.is_file())


# --- item 2: one rule for URLs with credentials, at every door ------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"https://alice:{PASSWORD}@torch.example:8443/fhir/x?token={PASSWORD}#f", "https://torch.example:8443/fhir/x"),
        (f"http://torch.example/files/a.ndjson;jsessionid={PASSWORD}", "http://torch.example/files/a.ndjson"),
        ("http://torch.example/a%0Ab c", "http://torch.example/a%0Ab%20c"),
    ],
    ids=["user-info-query-fragment", "path-parameters", "escapes-kept"],
)
def test_a_url_is_shown_one_way_without_anything_that_may_hold_a_secret(url, shown):
    assert shown_url(url) == shown


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")  # the code before the fix ran the job
def test_continue_attach_with_a_password_is_refused_naming_the_option_and_stores_nothing(write_config):
    job_dir = new_job_dir(write_config, "http://127.0.0.1:9")
    attach = f"http://alice:{PASSWORD}@127.0.0.1:9/fhir/__status/0b6bd3a4-5c8e-4f8e-9a43-2f1f3b5d1a7e"

    refused = run_cli("continue", str(job_dir), "--attach", attach, "--no-progress")

    assert refused.returncode == EXIT_USAGE
    assert "--attach" in refused.stderr and "user name or password" in refused.stderr
    assert "services.extractor.auth" in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout
    assert "extraction_status_url" not in read_facts(job_dir)
    assert PASSWORD not in texts_of_job(job_dir)
    assert job_file(job_dir)["flow_run_ids"] == []


@pytest.mark.parametrize("parameter", ["access_token", "token", "bearer", "sig", "Access_Token"])
def test_continue_attach_with_a_token_in_its_query_is_refused_like_a_password(tmp_path, capsys, parameter):
    attach = f"https://torch.example/fhir/__status/0b6b?page=2&{parameter}={PASSWORD}"

    exit_code = main(["continue", str(tmp_path / "no-such-job"), "--attach", attach])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and error.count("\n") == 1
    assert "--attach" in error and f"a secret in its query ({parameter})" in error
    assert "https://torch.example/fhir/__status/0b6b" in error and PASSWORD not in error


def test_a_query_without_a_token_is_no_credential():
    refuse_credentials_in_url("https://torch.example/fhir/x?page=2&_count=10&token=", door="d", fix="f", tokens=True)
    with pytest.raises(CredentialsInUrlError, match=r"a secret in its query \(Token\)"):
        refuse_credentials_in_url(f"https://torch.example/fhir/x?Token={PASSWORD}", door="d", fix="f", tokens=True)


def test_the_job_input_and_the_configuration_follow_the_same_rule(tmp_path, write_config):
    config = extractor_config(write_config, "http://127.0.0.1:9")
    with pytest.raises(CredentialsInUrlError) as by_input:
        prepare_job(
            None, str(config), f"https://bob:{PASSWORD}@example.org/fhir/__status/1", {}, overrides_source="--set"
        )
    with pytest.raises(ConfigError) as by_key:
        load_settings(str(config), overrides={"services.extractor.base_url": f"https://bob:{PASSWORD}@torch.org"})

    assert "the job input (INPUT)" in str(by_input.value) and "https://example.org/fhir/__status/1" in str(
        by_input.value
    )
    assert "services.extractor.base_url" in str(by_key.value) and "auth block" in str(by_key.value)
    for message in (str(by_input.value), str(by_key.value)):
        assert PASSWORD not in message and "bob" not in message and "user name or password" in message
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_a_content_location_with_credentials_is_refused_not_followed(sim):
    with start_extraction_server(clock=sim, url_userinfo=f"torch:{PASSWORD}") as server:
        with client_for(server.base_url, sim) as client, pytest.raises(CredentialsInUrlError) as caught:
            client.submit(CRTDL)
        assert server.state.polls == {}
    assert "Content-Location" in str(caught.value) and PASSWORD not in str(caught.value)


def test_manifest_urls_with_credentials_are_refused_before_any_file_is_touched(sim):
    with start_extraction_server(clock=sim, durations=dict(LONG_JOB)) as server:
        with client_for(server.base_url, sim) as client:
            handle = client.submit(CRTDL)
            server.state.url_userinfo = f"files:{PASSWORD}"  # the manifest's request and output URLs
            with pytest.raises(CredentialsInUrlError) as caught:
                client.poll_until_complete(handle)
        assert not server.state.file_requests
    message = str(caught.value)
    assert "manifest" in message and "services.extractor.auth" in message and PASSWORD not in message


def test_a_file_url_with_credentials_is_refused_by_the_same_rule(sim):
    with start_extraction_server(clock=sim, durations=dict(LONG_JOB)) as server:
        with client_for(server.base_url, sim) as client:
            handle = client.submit(CRTDL)
            server.state.files_base_url = f"http://u:{PASSWORD}@127.0.0.1:{server.port}/files"
            with pytest.raises(CredentialsInUrlError, match="a result file URL of the manifest") as caught:
                client.poll_until_complete(handle)
    assert PASSWORD not in str(caught.value)


def test_a_redirect_to_a_url_with_credentials_is_refused(tmp_path):
    with LoopbackServer(EchoHandler, EchoState()) as target, LoopbackServer(EchoHandler, EchoState()) as service:
        moved = f"http://mallory:{PASSWORD}@127.0.0.1:{target.port}/file"
        service.state.replies.append(Reply(302, {"Location": moved}))
        with build_client(ServiceEndpoint("extractor", service.base_url, AuthSettings()), TlsSettings()) as client:
            with pytest.raises(ServiceError, match="Location header") as caught:
                client.get("/result/core.ndjson")
        assert target.state.requests == []
    assert PASSWORD not in str(caught.value)


# --- item 13: a manifest too large is refused early and cheaply -----------------------------------------------


def test_an_error_file_url_with_a_password_is_named_without_it():
    manifest = {"output": [], "error": [{"url": "https://svc:pw-in-url@torch.example/output/err.ndjson"}]}
    with pytest.raises(ExtractionError) as refused:
        result_urls(manifest, 100)
    assert "error file https://torch.example/output/err.ndjson" in str(refused.value)
    assert "pw-in-url" not in str(refused.value)


SHAPES = [5, "s", True, {"a": 1}, [1], [[1]], [{"url": [1]}], [{"name": [1], "part": 5}], [{"extension": 5}]]


@pytest.mark.parametrize("key", ["output", "error", "extension", "parameter", "entry", "priority", "meta"])
@pytest.mark.parametrize("value", SHAPES, ids=repr)
def test_a_server_document_of_another_shape_is_read_as_meaning_nothing_or_refused_never_a_type_error(key, value):
    """Iterating a number failed the step with a bare TypeError, and a string was read character by character."""
    manifest = {"output": [{"url": "http://h/a.ndjson"}], key: value}
    parameters = {
        "resourceType": "Parameters",
        "parameter": [{"name": "output", "part": [{"name": "url"}]}],
        key: value,
    }
    for document in (manifest, parameters):
        with contextlib.suppress(ExtractionError):  # an answer without its list of files is refused, naming it
            result_urls(document, 100)
        manifest_request(document), requires_access_token(document)
    task = {"resourceType": "Task", "id": "t", "status": "in-progress", key: value}
    assert ExtractionJob.from_task(task).priority == "NORMAL" and progress_values(task) == {}
    assert cohort_patient_ids({"resourceType": "List", key: value}) == ()


def test_a_manifest_with_more_entries_than_allowed_is_refused_naming_count_and_limit(sim):
    with start_extraction_server(clock=sim, durations=dict(LONG_JOB), extra_output_entries=200) as server:
        with client_for(server.base_url, sim, max_result_files=50) as client:
            with pytest.raises(ExtractionError) as caught:
                client.poll_until_complete(client.submit(CRTDL))
    message = str(caught.value)
    assert "204 entries" in message and "max_result_files (50)" in message


HUGE_MANIFEST_CHILD = """
import sys, time
from tasks.clients.extraction_documents import ExtractionError, ExtractionHandle
from tests.support.extraction import client_for, SimulatedTime
from tasks.clients.extraction_server import ExtractionError, ExtractionHandle
started = time.monotonic()
with client_for(sys.argv[1], SimulatedTime(), max_result_files=2_000_000) as client:
    try:
        client.poll_until_complete(ExtractionHandle.from_status_url(sys.argv[2]))
        print("accepted")
    except ExtractionError as exc:
        print("refused:", exc)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"peak_kb={hwm} seconds={time.monotonic() - started:.1f}")
"""


@pytest.mark.slow
def test_a_manifest_of_one_and_a_half_million_entries_is_refused_within_seconds_and_flat_memory(sim):
    """Even with max_result_files raised above the count, the wire cap stops reading at MAX_MANIFEST_BYTES."""
    with start_extraction_server(clock=sim, extra_output_entries=1_500_000) as server:
        with client_for(server.base_url, sim) as client:
            handle = client.submit(CRTDL)
        sim.now += 3600  # the job is complete
        child = subprocess.run(
            [sys.executable, "-c", HUGE_MANIFEST_CHILD, server.base_url, handle.status_url],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert child.returncode == 0, child.stderr
    refused, measured = child.stdout.strip().splitlines()[-2:]
    assert refused.startswith("refused:") and f"over the limit of {MAX_MANIFEST_BYTES:,} bytes" in refused
    peak_mb = int(measured.split()[0].removeprefix("peak_kb=")) / 1024
    seconds = float(measured.split()[1].removeprefix("seconds="))
    assert peak_mb < 250, f"peak RSS {peak_mb:.0f} MB"  # the interpreter and imports take ~80 MB, the cap 32 MiB
    assert seconds < 60


# --- item 14: requiresAccessToken ---------------------------------------------------------------------------


def needs_api_key(headers: dict[str, str]) -> bool:
    return headers.get("x-api-key") == API_KEY


def file_server_job(sim: SimulatedTime, requires_token: bool):
    return start_extraction_server(
        clock=sim,
        durations=dict(LONG_JOB),
        file_origin=True,
        requires_access_token=requires_token,
        auth_check=needs_api_key,
    )


def test_files_that_need_a_token_on_an_approved_origin_get_it(sim, tmp_path):
    with file_server_job(sim, requires_token=True) as server:
        files_origin = server.file_server.base_url
        with client_for(server.base_url, sim, auth=AuthSettings(api_key=API_KEY), file_origins=[files_origin]) as c:
            urls = c.poll_until_complete(c.submit(CRTDL))
            assert all(url.startswith(files_origin) for url in urls)
            wait_until_available(c.http, urls[0], checks=2, interval=timedelta(0))
            stats = download_ndjson(
                c.http,
                urls[0],
                tmp_path / "first.ndjson",
                level=None,
                max_line_bytes=1 << 20,
                stall_timeout=timedelta(seconds=30),
                retry=FAST_RETRY,
            )
        file_requests = server.state.requests_to("/files", "files")
    assert stats.resources > 0
    assert file_requests and all(r.headers.get("x-api-key") == API_KEY for r in file_requests)


def test_files_that_need_a_token_on_an_unapproved_origin_are_an_error_naming_origin_and_key(sim):
    with file_server_job(sim, requires_token=True) as server:
        with client_for(server.base_url, sim, auth=AuthSettings(api_key=API_KEY)) as client:
            with pytest.raises(ExtractionError) as caught:
                client.poll_until_complete(client.submit(CRTDL))
        assert server.state.requests_to("/files", "files") == []
    message = str(caught.value)
    assert f"http://127.0.0.1:{server.file_server.port}" in message
    assert "services.extractor.file_origins" in message and API_KEY not in message


def test_without_requires_access_token_a_listed_origin_still_gets_no_credentials(sim):
    with file_server_job(sim, requires_token=False) as server:
        files_origin = server.file_server.base_url
        with client_for(server.base_url, sim, auth=AuthSettings(api_key=API_KEY), file_origins=[files_origin]) as c:
            urls = c.poll_until_complete(c.submit(CRTDL))
            wait_until_available(c.http, urls[0], checks=2, interval=timedelta(0))
        file_requests = server.state.requests_to("/files", "files")
    assert file_requests and all("x-api-key" not in r.headers for r in file_requests)


@pytest.mark.parametrize("origin", ["https://files.example.org/path", "files.example.org", "ftp://files.example.org"])
def test_file_origins_must_be_origins(write_config, origin):
    config = extractor_config(write_config, "https://torch.example.org", file_origins=[origin])
    with pytest.raises(ConfigError, match="services.extractor.file_origins.*not an origin"):
        load_settings(str(config))


# --- item 16: one request per poll (tests/test_extractor_client.py: each poll is one GET, no Task read) -----------


# --- item 12: two continue at once --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_of_two_continue_at_once_the_second_exits_2_and_makes_no_flow_run(tmp_path, write_config):
    clock = ManualClock()  # the extraction stays PENDING until the test moves the clock
    with start_extraction_server(clock=clock) as torch:
        job_dir = new_job_dir(write_config, torch.base_url)
        outcomes: dict[str, subprocess.CompletedProcess] = {}
        first_done = threading.Event()

        def run(name: str) -> None:
            outcomes[name] = run_cli("continue", str(job_dir), "--no-progress", timeout=300)
            first_done.set()

        threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        assert first_done.wait(240), "neither continue ended"
        wait_until(lambda: torch.state.polls, "the winner polls its extraction")
        clock.tick(3600)  # now the winner's extraction completes
        for thread in threads:
            thread.join(240)

    (loser,) = [o for o in outcomes.values() if o.returncode != EXIT_OK]
    (winner,) = [o for o in outcomes.values() if o.returncode == EXIT_OK]
    assert loser.returncode == EXIT_USAGE, loser.stderr
    assert "is being worked on by another process" in loser.stderr and "Traceback" not in loser.stderr
    assert "Completed" in winner.stdout
    assert len(job_file(job_dir)["flow_run_ids"]) == 1
    assert len(torch.state.submissions) == 1
