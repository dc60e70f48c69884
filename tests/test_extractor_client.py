"""The extraction server client and the shared downloader, against the fake TORCH and scripted servers.

Simulated time: the fake server and the client share one manual clock and the client's ``sleep`` advances
it, so polling through a whole extraction takes no real waiting.
"""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import zstandard

from config.services import AuthSettings, ExtractorSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.downloads import (
    DownloadError,
    download_ndjson,
    is_available,
    safe_file_name,
    target_names,
    wait_until_available,
)
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceEndpoint, build_client
from tasks.clients.extraction_jobs import ExtractionJob, ExtractionTaskClient
from tasks.clients.extraction_documents import (
    DeadHandleError,
    ExtractionCancelledError,
    ExtractionHandle,
    ExtractionTimeoutError,
    InvalidCrtdlError,
    ExtractionError,
    StatusUrlMismatchError,
    parse_crtdl,
    resolve_file_url,
)
from tasks.clients.extraction_jobs import cohort_patient_ids
from tasks.clients.extraction_server import PollProgress
from tasks.core.url_credentials import CredentialsInUrlError
from tasks.streams import processes
from tests.support.processes import worker_pids
from tasks.streams.ndjson import NdjsonError
from tasks.streams.ndjson_writer import CHECK_IN_PROCESS_MIN_BYTES
from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.fakes.extraction_crtdl import parse_crtdl as parse_fake_crtdl
from tests.fakes.extraction_server import ExtractionServer, JobStatus, start_extraction_server
from tests.support.extraction import CRTDL, FAST_RETRY, LONG_JOB, SimulatedTime, client_for


@pytest.fixture
def sim() -> SimulatedTime:
    return SimulatedTime()


@pytest.fixture
def torch(sim):
    with start_extraction_server(clock=sim, durations=dict(LONG_JOB)) as server:
        yield server


def run_extraction(server: ExtractionServer, sim: SimulatedTime, **overrides) -> list[str]:
    with client_for(server.base_url, sim, **overrides) as client:
        return client.poll_until_complete(client.submit(CRTDL))


# --- submission ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kickoff_status", [202, 200])
def test_submission_posts_the_crtdl_base64_in_parameters_once(sim, kickoff_status):
    with start_extraction_server(clock=sim, kickoff_status=kickoff_status) as server:
        with client_for(server.base_url, sim) as client:
            handle = client.submit(CRTDL)
        (submission,) = server.state.submissions
    body = json.loads(submission.body)
    assert body["resourceType"] == "Parameters"
    assert base64.b64decode(body["parameter"][0]["valueBase64Binary"]) == CRTDL
    assert submission.headers["content-type"] == "application/fhir+json"
    assert submission.headers["accept"] == "application/fhir+json"
    assert handle.status_url == f"{server.base_url}/fhir/__status/{submission.job_id}"
    assert handle.job_id == submission.job_id


def test_kickoff_error_reports_the_servers_diagnostics_and_is_not_retried(sim):
    invalid = (TESTDATA / "crtdl" / "invalid-no-patient-group.json").read_bytes()
    with start_extraction_server(clock=sim) as server, client_for(server.base_url, sim) as client:
        with pytest.raises(ServiceError) as caught:
            client.submit(invalid)
        assert len(server.state.submissions) == 1
    assert caught.value.status_code == 400 and "No Patient Attribute Group" in str(caught.value)


def test_kickoff_500_is_attempted_exactly_once():
    state = EchoState(
        replies=[
            Reply(
                500,
                {"Content-Type": "application/fhir+json"},
                json.dumps(
                    {
                        "resourceType": "OperationOutcome",
                        "issue": [{"severity": "fatal", "code": "exception", "diagnostics": "db down"}],
                    }
                ).encode(),
            )
        ]
    )
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as client:
        with pytest.raises(ServiceError, match="db down"):
            client.submit(CRTDL)
    assert len(state.requests) == 1


def test_a_kickoff_too_large_for_the_server_or_its_proxy_names_the_limit_to_raise():
    """A front's 413 is an HTML page naming nothing: the message said only "HTTP 413 Request Entity Too Large"."""
    page = b"<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body></html>"
    state = EchoState(replies=[Reply(413, {"Content-Type": "text/html"}, page)])
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as client:
        with pytest.raises(ServiceError) as caught:
            client.submit(CRTDL)

    assert (caught.value.status_code, caught.value.transient) == (413, False)
    assert "the CRTDL is larger than the extraction server accepts: raise the body limit of the server" in str(
        caught.value
    )
    assert "nginx's client_max_body_size" in str(caught.value) and len(state.requests) == 1


def test_missing_content_location_is_an_error(sim):
    with start_extraction_server(clock=sim, omit_content_location=True) as server:
        with client_for(server.base_url, sim) as client, pytest.raises(ExtractionError, match="Content-Location"):
            client.submit(CRTDL)


def test_relative_content_location_is_made_absolute():
    state = EchoState(replies=[Reply(202, {"Content-Location": "/fhir/__status/abc-1"}, b"")])
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as client:
        handle = client.submit(CRTDL)
    assert handle == ExtractionHandle(f"{server.base_url}/fhir/__status/abc-1", "abc-1")


@pytest.mark.parametrize(
    ("escaped", "problem"),
    [
        ("x%0A%20%20state:%20COMPLETED", "a control character U+000A"),
        ("x%1B[2K", "a control character U+001B"),
        ("x%E2%80%AEexe.fdp", "a bidirectional text control character U+202E"),
    ],
    ids=["newline", "escape", "bidi"],
)
def test_a_job_id_that_would_not_show_as_it_is_is_refused_at_the_kick_off(escaped, problem):
    """The job ID (the status URL's last segment, decoded) is stored, logged and printed by ``status``: a newline
    there forged a line of its own."""
    state = EchoState(replies=[Reply(202, {"Content-Location": f"/fhir/__status/{escaped}"}, b"")])
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as client:
        with pytest.raises(ExtractionError) as refused:
            client.submit(CRTDL)
    message = str(refused.value)
    assert f"which contains {problem}" in message and "Content-Location" in message
    assert message.isprintable(), message


def test_the_job_id_of_an_attached_status_url_follows_the_same_rule():
    assert ExtractionHandle.from_status_url("https://torch.example/fhir/__status/0b6b?page=1").job_id == "0b6b"
    with pytest.raises(ExtractionError, match="is empty"):
        ExtractionHandle.from_status_url("https://torch.example/")
    with pytest.raises(ExtractionError, match=r"U\+2066"):
        ExtractionHandle.from_status_url("https://torch.example/fhir/__status/%E2%81%A6abc")


def test_a_crtdl_that_is_not_json_is_rejected_naming_the_file():
    with pytest.raises(InvalidCrtdlError, match="invalid CRTDL /x/c.json: not valid JSON"):
        parse_crtdl(b"{nope", "/x/c.json")
    with pytest.raises(InvalidCrtdlError, match="expected a JSON object"):
        parse_crtdl(b"[1]", "/x/c.json")


# --- the poll table ------------------------------------------------------------------------------------------


def test_in_progress_polls_back_off_doubling_to_the_cap_and_report_progress(torch, sim):
    seen: list[PollProgress] = []
    with client_for(torch.base_url, sim, max_polling_interval="PT2S") as client:
        urls = client.poll_until_complete(client.submit(CRTDL), seen.append)
    assert sim.sleeps[:5] == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert len(urls) == 4 and urls[-1].endswith("/core.ndjson")
    texts = [p.text for p in seen]
    assert texts[0] == "Pending" and "Getting cohort" in texts
    batches = [p for p in seen if p.text and p.text.startswith("Processing batches")]
    assert batches and all(p.percent is not None for p in batches)  # progress from the status answer itself


def test_each_poll_is_one_get_of_the_status_url_and_nothing_else(sim):
    """pipeline-tool.md procedure step 4: each iteration is a single GET, also while batches run for long."""
    durations = dict(LONG_JOB, RUNNING_PROCESS_BATCH=600.0)
    with start_extraction_server(clock=sim, durations=durations) as server:
        with client_for(server.base_url, sim, max_polling_interval="PT30S", extraction_timeout="PT1H") as client:
            client.poll_until_complete(client.submit(CRTDL), lambda progress: None)
        polls = sum(server.state.polls.values())
        requests = [(r.method, r.path) for r in server.state.requests if "$extract-data" not in r.path]
    assert polls > 20
    assert requests == [("GET", requests[0][1])] * polls and requests[0][1].startswith("/fhir/__status/")


def test_102_interim_answers_count_as_in_progress(sim):
    with start_extraction_server(clock=sim, durations=dict(LONG_JOB), status_102="interim") as server:
        assert len(run_extraction(server, sim)) == 4


def test_404_on_poll_raises_dead_handle(torch, sim):
    with client_for(torch.base_url, sim) as client:
        handle = client.submit(CRTDL)
        torch.state.forget_jobs()
        with pytest.raises(DeadHandleError) as caught:
            client.poll_until_complete(handle)
    assert caught.value.status_code == 404 and caught.value.handle == handle


def test_410_for_a_job_cancelled_on_the_server_is_a_cancel_not_a_lost_job(torch, sim):
    """TORCH answers a cancelled job's status with 410, like a deleted one's: a person's cancel was taken for a lost
    handle, and the step submitted the extraction again."""
    with client_for(torch.base_url, sim) as client:
        handle = client.submit(CRTDL)
        torch.state.force_status(handle.job_id, JobStatus.CANCELLED)
        with pytest.raises(ExtractionCancelledError) as caught:
            client.poll_until_complete(handle)
    assert not isinstance(caught.value, DeadHandleError) and caught.value.status_code == 410
    assert f"extraction job {handle.job_id} was cancelled on the extraction server" in str(caught.value)
    assert "--resubmit" in str(caught.value) and len(torch.state.submissions) == 1


def test_404_for_a_job_deleted_on_the_server_is_a_delete_not_a_lost_job(sim):
    """TORCH answers a deleted job's status with 404, like a lost one's, and shows its Task DELETED until the files
    are removed: a person's delete (dupflow extraction delete) was taken for a lost handle and submitted again."""
    with (
        start_extraction_server(clock=sim, durations=dict(LONG_JOB), delete_files_after=3600) as torch,
        client_for(torch.base_url, sim) as client,
    ):
        handle = client.submit(CRTDL)
        assert httpx.delete(f"{torch.base_url}/fhir/Task/{handle.job_id}").status_code == 204
        with pytest.raises(ExtractionCancelledError) as caught:
            client.poll_until_complete(handle)
    assert not isinstance(caught.value, DeadHandleError) and caught.value.status_code == 404
    assert f"extraction job {handle.job_id} was deleted on the extraction server" in str(caught.value)
    assert "its Task says DELETED" in str(caught.value) and "--resubmit" in str(caught.value)
    assert len(torch.state.submissions) == 1


def test_404_from_a_status_url_while_the_jobs_task_is_alive_is_no_lost_job(sim):
    """A status URL that does not lead to the job (the server's base URL without a proxy's path prefix) answered
    404 for every job: each was taken for lost and submitted again, up to retry.max_attempts fresh extractions."""
    with (
        start_extraction_server(clock=sim, durations=dict(LONG_JOB)) as torch,
        client_for(torch.base_url, sim) as client,
    ):
        job_id = client.submit(CRTDL).job_id
        astray = ExtractionHandle.from_status_url(f"{torch.base_url}/lost-prefix/fhir/__status/{job_id}")
        with pytest.raises(StatusUrlMismatchError) as caught:
            client.poll_until_complete(astray)
    assert not isinstance(caught.value, DeadHandleError) and caught.value.status_code == 404
    message = str(caught.value)
    assert f"extraction job {job_id}: its status URL {astray.status_url} answered HTTP 404" in message
    assert "the server's Task API shows the job" in message and "it is not submitted again" in message
    assert "--attach" in message and "--resubmit" in message
    assert len(torch.state.submissions) == 1


def test_a_status_url_on_another_origin_that_wants_credentials_is_explained(torch, sim):
    """A server whose own base URL is set wrong (another host, scheme or port than base_url) names status URLs there;
    dupflow rightly sends them no credentials, and the 401 must say why, not only "Authentication required"."""
    torch.state.auth_check = lambda headers: headers.get("authorization") == "Basic dTpw"  # u:p
    job_id = torch.state.submit(parse_fake_crtdl(CRTDL), []).id
    kickoff = Reply(202, {"Content-Location": f"{torch.base_url}/fhir/__status/{job_id}"})
    front, _ = scripted_status_server(kickoff)
    with front, client_for(front.base_url, sim, auth=AuthSettings(username="u", password="p")) as client:
        handle = client.submit(CRTDL)
        with pytest.raises(ServiceError) as caught:
            client.poll_until_complete(handle)
    assert caught.value.status_code == 401 and not caught.value.transient
    message = str(caught.value)
    assert f"the status URL {handle.status_url} answered HTTP 401" in message
    assert f"it is on {torch.base_url}, not on the origin of services.extractor.base_url ({front.base_url})" in message
    assert "dupflow sends the credentials only there" in message and "torch.base.url" in message
    assert torch.state.requests_to("/fhir/__status/")[-1].header("authorization") is None


def test_410_for_a_job_whose_task_is_gone_or_unreadable_is_a_lost_handle(sim):
    huge = Reply(200, body=b" " * (33 * 1024 * 1024))  # over the bound of any status answer
    server, state = scripted_status_server(
        Reply(410), Reply(404), Reply(410), Reply(200, body=b"<html>"), Reply(410), huge
    )
    with server, client_for(server.base_url, sim) as client:
        for _ in range(3):
            with pytest.raises(DeadHandleError):
                client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert [r.path for r in state.requests] == ["/fhir/__status/j", "/fhir/Task/j"] * 3


def test_an_identity_provider_outage_while_the_token_is_renewed_is_polled_through(sim):
    """A 503 of the token endpoint while polling is a transient failure of that poll, like a reset: it ended the
    step."""
    oauth = OAuthState()

    def bearer(headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme == "Bearer" and oauth.is_valid(token)

    auth = {"oauth_issuer_uri": "", "oauth_client_id": oauth.client_id, "oauth_client_secret": oauth.client_secret}
    with (
        LoopbackServer(OAuthHandler, oauth) as idp,
        start_extraction_server(clock=sim, durations=dict(LONG_JOB), auth_check=bearer) as server,
    ):
        auth["oauth_issuer_uri"] = idp.base_url + REALM_PATH
        with client_for(server.base_url, sim, auth=auth) as client:
            handle = client.submit(CRTDL)
            oauth.revoke_all()  # the next poll is refused: the token is renewed, and the provider is out
            oauth.unavailable_next = 2
            urls = client.poll_until_complete(handle)
    assert len(urls) == 4 and oauth.unavailable_next == 0


@pytest.mark.parametrize("retry_after", ["0", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_a_503_storm_asking_to_retry_at_once_is_still_polled_with_backoff(sim, retry_after):
    server, _ = scripted_status_server(*[Reply(503, {"Retry-After": retry_after})] * 4, manifest_reply())
    with server, client_for(server.base_url, sim) as client:
        client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert sim.sleeps == [1.0, 2.0, 4.0, 8.0]


def test_a_status_answer_dripping_its_body_ends_at_the_poll_deadline_and_the_window_decides(sim):
    """One byte every 0.3 s, within every read timeout: the poll stayed in one GET, the liveness window unseen."""
    dripping = Reply(202, {"Content-Type": "application/json"}, b" " * 1000, drip=0.3)
    server, state = scripted_status_server(dripping, dripping, dripping)
    started = time.monotonic()
    with server, client_for(server.base_url, sim, extraction_timeout="PT1S") as client:
        with pytest.raises(ExtractionTimeoutError):
            client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert len(state.requests) == 2 and time.monotonic() - started < 30


@pytest.mark.parametrize("name", ["access_token", "apikey", "api_key", "password", "client_secret", "sessionId"])
def test_a_status_url_with_a_secret_in_its_query_is_refused_at_the_kick_off(sim, name):
    kicked = Reply(202, {"Content-Location": f"/fhir/__status/j?_format=json&{name}=SEKRET-123"}, b"")
    server, _ = scripted_status_server(kicked)
    with server, client_for(server.base_url, sim) as client:
        with pytest.raises(CredentialsInUrlError) as caught:
            client.submit(CRTDL)
    assert f"carries a secret in its query ({name})" in str(caught.value)
    assert "SEKRET-123" not in str(caught.value)


def test_500_is_a_terminal_failure_with_the_servers_diagnostics(sim):
    with start_extraction_server(
        clock=sim, durations=dict(LONG_JOB), fail_jobs=True, failure_diagnostics="Cohort query failed: Blaze said 500"
    ) as server:
        with pytest.raises(ExtractionError, match="Cohort query failed: Blaze said 500"):
            run_extraction(server, sim)
        assert len(server.state.submissions) == 1


def test_503_storm_is_transient_and_polling_continues(torch, sim):
    torch.state.status_unavailable_polls = 4
    assert len(run_extraction(torch, sim)) == 4
    assert sum(torch.state.polls.values()) > 4


def scripted_status_server(*replies: Reply) -> tuple[LoopbackServer, EchoState]:
    state = EchoState(replies=list(replies))
    return LoopbackServer(EchoHandler, state), state


def manifest_reply(base_url_path: str = "/files/j/core.ndjson") -> Reply:
    body = {"output": [{"type": "NDJSON Bundle", "url": base_url_path}], "error": []}
    return Reply(200, {"Content-Type": "application/json"}, json.dumps(body).encode())


def test_408_429_and_other_5xx_are_retried_after_backing_off(sim):
    server, state = scripted_status_server(
        Reply(408), Reply(429, {"Retry-After": "3"}), Reply(502), Reply(504), manifest_reply()
    )
    with server, client_for(server.base_url, sim) as client:
        urls = client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert urls == [f"{server.base_url}/files/j/core.ndjson"]
    assert sim.sleeps == [1.0, 3.0, 4.0, 8.0]  # Retry-After replaces one wait
    assert [r.headers["accept"] for r in state.requests] == ["application/json"] * 5


def test_network_failures_on_a_poll_are_swallowed(sim):
    server, state = scripted_status_server(Reply(reset=True), Reply(reset=True), manifest_reply())
    with server, client_for(server.base_url, sim) as client:
        urls = client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert len(urls) == 1 and len(state.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 409])
def test_other_4xx_on_a_poll_is_terminal(sim, status):
    server, state = scripted_status_server(Reply(status))
    with server, client_for(server.base_url, sim) as client, pytest.raises(ServiceError) as caught:
        client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert caught.value.status_code == status and not caught.value.transient and len(state.requests) == 1


def test_silence_longer_than_the_liveness_window_is_a_timeout_naming_the_setting(sim):
    server, state = scripted_status_server(*[Reply(503)] * 50)
    with server, client_for(server.base_url, sim, extraction_timeout="PT20S") as client:
        with pytest.raises(ExtractionTimeoutError, match="services.extractor.extraction_timeout"):
            client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert sum(sim.sleeps) == pytest.approx(20.0)


def test_each_202_resets_the_liveness_window(sim):
    in_progress = Reply(202, {"X-Progress": "Pending"}, b"{}")
    # 15 s of 503s, a 202, 16 s of 503s, then done: 31 s in all, never 20 s of silence.
    server, _ = scripted_status_server(
        Reply(503), Reply(503), Reply(503), Reply(503), in_progress, Reply(503), Reply(503), manifest_reply()
    )
    with server, client_for(server.base_url, sim, extraction_timeout="PT20S") as client:
        urls = client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
    assert len(urls) == 1 and sum(sim.sleeps) > 20


# --- the result ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["manifest", "parameters"])
@pytest.mark.parametrize("style", ["absolute", "relative", "host_prefixed"])
def test_both_result_shapes_and_all_url_forms_give_absolute_file_urls(sim, shape, style):
    with start_extraction_server(clock=sim, result_shape=shape, file_url_style=style) as server:
        urls = run_extraction(server, sim)
        job_id = server.state.submissions[0].job_id
    assert len(urls) == 4
    assert all(u.startswith(f"{server.base_url}/files/{job_id}/") for u in urls)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("https://files.example.org/x/a.ndjson", "https://files.example.org/x/a.ndjson"),
        ("/files/j/a.ndjson", "https://torch.example.org/files/j/a.ndjson"),
        ("files/j/a.ndjson", "https://torch.example.org/base/files/j/a.ndjson"),
        ("files.example.org:8080/j/a.ndjson", "https://files.example.org:8080/j/a.ndjson"),
        ("localhost:81/j/a.ndjson", "https://localhost:81/j/a.ndjson"),
        ("[::1]:8080/j/a.ndjson", "https://[::1]:8080/j/a.ndjson"),
        ("./a.ndjson", "https://torch.example.org/base/a.ndjson"),
        ("./j/a.ndjson", "https://torch.example.org/base/j/a.ndjson"),
        ("../files/a.ndjson", "https://torch.example.org/files/a.ndjson"),
        ("files.v2/a.ndjson", "https://files.v2/a.ndjson"),
    ],
)
def test_file_urls_resolve_against_base_url(url, expected):
    assert resolve_file_url("https://torch.example.org/base", url) == expected


@pytest.mark.parametrize("shape", ["manifest", "parameters"])
def test_empty_output_reports_the_servers_issues(sim, shape):
    with start_extraction_server(clock=sim, empty_output="with_issues", result_shape=shape) as server:
        with pytest.raises(ExtractionError, match="no consenting patients"):
            run_extraction(server, sim)


@pytest.mark.parametrize("shape", ["manifest", "parameters"])
def test_empty_output_without_issues_is_the_no_matching_data_message(sim, shape):
    with start_extraction_server(clock=sim, empty_output="without_issues", result_shape=shape) as server:
        with pytest.raises(ExtractionError, match="no data matched the CRTDL.*time period"):
            run_extraction(server, sim)


# --- downloads -----------------------------------------------------------------------------------------------


def completed_job_urls(server: ExtractionServer, sim: SimulatedTime) -> list[str]:
    urls = run_extraction(server, sim)
    server.state.requests.clear()
    return urls


def download(client: httpx.Client, url: str, dest: Path, **overrides) -> object:
    options = dict(level="fastest", max_line_bytes=1 << 20, stall_timeout=timedelta(seconds=5), retry=FAST_RETRY)
    return download_ndjson(client, url, dest, **(options | overrides))


def file_key(url: str) -> str:
    return "/".join(url.split("/")[-2:])


def test_download_writes_compressed_ndjson_and_counts_resources(torch, sim, tmp_path):
    urls = completed_job_urls(torch, sim)
    with client_for(torch.base_url, sim) as client:
        stats = download(client.http, urls[0], tmp_path / "a.ndjson.zst")
    data = zstandard.ZstdDecompressor().decompressobj().decompress((tmp_path / "a.ndjson.zst").read_bytes())
    assert stats.resources == 2 == len(data.splitlines())
    assert stats.size == (tmp_path / "a.ndjson.zst").stat().st_size
    (request,) = torch.state.requests_to("/files/")
    assert request.header("accept") == "application/fhir+ndjson"


def test_availability_check_falls_back_from_head_to_a_range_get(torch, sim):
    torch.state.head_status = 405
    (url, *_) = completed_job_urls(torch, sim)
    with client_for(torch.base_url, sim) as client:
        wait_until_available(client.http, url, checks=3, interval=timedelta(seconds=1), sleep=sim.sleep)
    assert torch.state.file_heads[file_key(url)] == 1 and torch.state.range_probes[file_key(url)] == 1


def test_a_file_not_yet_visible_is_checked_again_until_it_appears(torch, sim):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.file_not_ready_probes = 3  # HEAD 404, Range 404, HEAD 404, then visible
    sim.sleeps.clear()
    with client_for(torch.base_url, sim) as client:
        wait_until_available(client.http, url, checks=3, interval=timedelta(seconds=2), sleep=sim.sleep)
    assert sim.sleeps == [2.0]
    assert torch.state.range_probes[file_key(url)] == 2


def test_a_file_that_never_appears_fails_after_the_configured_checks(torch, sim):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.file_not_ready_probes = 100
    sim.sleeps.clear()
    with client_for(torch.base_url, sim) as client, pytest.raises(DownloadError, match="file_ready_retries"):
        wait_until_available(client.http, url, checks=4, interval=timedelta(seconds=1), sleep=sim.sleep)
    assert sim.sleeps == [1.0] * 3


def test_a_check_of_a_server_that_does_not_answer_ends_at_its_deadline(monkeypatch):
    """Only each read was bounded (30 s): a server dripping its headers held the check for days."""
    monkeypatch.setattr("tasks.clients.downloads.PROBE_DEADLINE", timedelta(seconds=1))
    state = EchoState(replies=[Reply(delay=20), Reply(delay=20)])
    with LoopbackServer(EchoHandler, state) as server:
        with build_client(ServiceEndpoint("svc", server.base_url), TlsSettings()) as client:
            started = time.monotonic()
            assert not is_available(client, f"{server.base_url}/files/a.ndjson")
    assert time.monotonic() - started < 10


def test_a_check_answered_compressed_is_refused_as_every_answer_is():
    """Only the deadline's passing is "not ready yet": a refusal of the answer stays one."""
    state = EchoState(replies=[Reply(200, {"Content-Encoding": "gzip"}, b"")])
    with LoopbackServer(EchoHandler, state) as server:
        with build_client(ServiceEndpoint("svc", server.base_url), TlsSettings()) as client:
            with pytest.raises(ServiceError, match="came compressed"):
                is_available(client, f"{server.base_url}/files/a.ndjson")


def test_zero_checks_disable_the_availability_check(torch, sim):
    (url, *_) = completed_job_urls(torch, sim)
    with client_for(torch.base_url, sim) as client:
        wait_until_available(client.http, url, checks=0, interval=timedelta(seconds=1))
    assert torch.state.requests_to("/files/") == []


def test_a_stalled_download_is_cancelled_after_the_stall_timeout_and_not_retried(torch, sim, tmp_path):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.stall_downloads, torch.state.stall_after_bytes, torch.state.stall_seconds = 1, 100, 60.0
    with client_for(torch.base_url, sim) as client, pytest.raises(DownloadError, match="no data arrived for 0.3 s"):
        download(client.http, url, tmp_path / "a.ndjson", stall_timeout=timedelta(seconds=0.3))
    assert torch.state.file_gets[file_key(url)] == 1
    assert list(tmp_path.iterdir()) == []


def test_a_server_silent_before_the_headers_is_a_stall_too_and_not_retried(torch, sim, tmp_path):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.response_delay = 60.0
    with client_for(torch.base_url, sim) as client, pytest.raises(DownloadError, match="no data arrived for 0.3 s"):
        download(client.http, url, tmp_path / "a.ndjson", stall_timeout=timedelta(seconds=0.3))
    assert len(torch.state.requests_to("/files/")) == 1  # counted on arrival, before the silence
    assert list(tmp_path.iterdir()) == []


def test_a_slow_but_flowing_download_is_not_a_stall(torch, sim, tmp_path):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.stall_downloads, torch.state.stall_after_bytes, torch.state.stall_seconds = 1, 100, 0.3
    with client_for(torch.base_url, sim) as client:
        stats = download(client.http, url, tmp_path / "a.ndjson", stall_timeout=timedelta(seconds=2))
    assert stats.resources == 2


def test_a_connection_reset_mid_body_is_resumed_where_it_broke(torch, sim, tmp_path):
    (url, *_) = completed_job_urls(torch, sim)
    torch.state.reset_downloads, torch.state.reset_after_bytes = 1, 100
    with client_for(torch.base_url, sim) as client:
        stats = download(client.http, url, tmp_path / "a.ndjson")
    assert stats.resources == 2  # more cases in test_hostile_streams.py (issue 22, item 15)
    assert torch.state.file_gets[file_key(url)] == 2 and torch.state.range_probes[file_key(url)] == 1


def test_a_transient_status_is_retried_and_the_file_then_downloaded(tmp_path):
    body = b'{"resourceType":"Bundle"}\n{"resourceType":"Bundle"}\n'
    state = EchoState(
        replies=[Reply(503), Reply(reset=True), Reply(200, {"Content-Type": "application/fhir+ndjson"}, body)]
    )
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as client:
        stats = download(client.http, f"{server.base_url}/f/a.ndjson", tmp_path / "a.ndjson", level=None)
    assert stats.resources == 2 and (tmp_path / "a.ndjson").read_bytes() == body
    assert len(state.requests) == 3


def large_ndjson(last_line: bytes) -> bytes:
    """A plain body of the size that a local import checks in worker processes, ending with ``last_line``."""
    line = b'{"resourceType":"Patient","id":"p%06d","text":"' + b"x" * 1000 + b'"}\n'
    lines = [line.replace(b"%06d", b"%06d" % number) for number in range(CHECK_IN_PROCESS_MIN_BYTES // len(line) + 1)]
    return b"".join(lines) + last_line


def serve_once_each(*bodies: bytes) -> EchoState:
    return EchoState(replies=[Reply(200, {"Content-Type": "application/fhir+ndjson"}, body) for body in bodies])


@pytest.fixture
def open_worker_pool():
    """A step's worker pool, open around the download: a download must still start none of its workers."""
    with processes.worker_pool():
        yield
        assert not worker_pids()


def test_a_large_plain_download_is_checked_as_it_arrives_in_no_worker_process(tmp_path, open_worker_pool):
    body = large_ndjson(b"")
    with (
        LoopbackServer(EchoHandler, serve_once_each(body)) as server,
        client_for(server.base_url, SimulatedTime()) as c,
    ):
        stats = download(c.http, f"{server.base_url}/f/a.ndjson", tmp_path / "a.ndjson", level=None)
    assert stats.resources == body.count(b"\n") and (tmp_path / "a.ndjson").read_bytes() == body
    assert not worker_pids()


def test_a_bad_line_in_a_large_file_is_the_same_error_as_in_a_small_one(tmp_path, open_worker_pool):
    body = large_ndjson(b'{"id":"no type"}\n')
    line = body.count(b"\n")
    with (
        LoopbackServer(EchoHandler, serve_once_each(body)) as server,
        client_for(server.base_url, SimulatedTime()) as c,
    ):
        expected = f"{server.base_url}/f/a.ndjson: line {line} is a JSON object without a resourceType"
        with pytest.raises(NdjsonError, match=re.escape(expected)):
            download(c.http, f"{server.base_url}/f/a.ndjson", tmp_path / "a.ndjson", level=None)
    assert list(tmp_path.iterdir()) == []


def test_a_large_file_whose_last_line_is_cut_off_is_retried_as_incomplete(tmp_path, open_worker_pool):
    cut, whole = large_ndjson(b'{"resourceType":"Pat'), large_ndjson(b"")
    state = serve_once_each(cut, whole)
    with LoopbackServer(EchoHandler, state) as server, client_for(server.base_url, SimulatedTime()) as c:
        stats = download(c.http, f"{server.base_url}/f/a.ndjson", tmp_path / "a.ndjson", level=None)
    assert len(state.requests) == 2
    assert stats.resources == whole.count(b"\n") and (tmp_path / "a.ndjson").read_bytes() == whole


def test_credentials_go_only_to_the_configured_origin_not_to_a_file_server_elsewhere(sim, tmp_path):
    auth = AuthSettings(username="u", password="p")
    with start_extraction_server(clock=sim, file_origin=True) as server:
        with client_for(server.base_url, sim, auth=auth) as client:
            urls = client.poll_until_complete(client.submit(CRTDL))
            download(client.http, urls[0], tmp_path / "a.ndjson")
        api = server.state.requests_to("/fhir/", "api")
        files = server.state.requests_to("/files/", "files")
    assert api and all(
        r.header(
            "authorization",
        ).startswith("Basic ")
        for r in api
    )
    assert files and all(r.header("authorization") is None for r in files)


@pytest.mark.parametrize(
    "url",
    ["http://h/files/..", "http://h/files/", "http://h/files/.hidden", "http://h/files/a%2F..%2Fb", "http://h/a%5Cb"],
)
def test_file_names_that_could_escape_import_are_refused(url):
    with pytest.raises(DownloadError):
        safe_file_name(url, compress=False)


def test_file_names_are_forced_to_ndjson_and_duplicates_are_an_error():
    assert safe_file_name("http://h/j/batch-1", compress=True) == "batch-1.ndjson.zst"
    assert safe_file_name("http://h/j/core.ndjson?x=1", compress=False) == "core.ndjson"
    assert safe_file_name("http://h/j/core.ndjson;jsessionid=8F3A0718", compress=False) == "core.ndjson"
    with pytest.raises(DownloadError, match="would both be saved as core.ndjson"):
        target_names(["http://h/j1/core.ndjson", "http://h/j2/core.ndjson"], compress=False)
    with pytest.raises(DownloadError, match="would both be saved as Core.ndjson .*ignores case"):
        target_names(["http://h/j1/core.ndjson", "http://h/j2/Core.ndjson"], compress=False)


# --- Task API and cohort preview ---------------------------------------------------------------------------------

TASK_EXAMPLES = TESTDATA / "extraction" / "task-examples"


def task_client(base_url: str) -> ExtractionTaskClient:
    return ExtractionTaskClient(ExtractorSettings(base_url=base_url), TlsSettings(), FAST_RETRY)


def json_reply(status: int, document: dict) -> Reply:
    return Reply(status, {"Content-Type": "application/fhir+json"}, json.dumps(document).encode())


def example(name: str) -> dict:
    return json.loads((TASK_EXAMPLES / name).read_text())


def test_the_servers_documented_tasks_read_as_jobs():
    running = ExtractionJob.from_task(example("task-running.json"))
    assert (running.id, running.status, running.priority, running.version) == (
        "550e8400-e29b-41d4-a716-446655440000",
        "RUNNING_PROCESS_BATCH",
        "NORMAL",
        "3",
    )
    assert running.cohort_size is None and running.active_batches == ()
    assert ExtractionJob.from_task(example("task-put-priority-response.json")).priority == "HIGH"
    assert ExtractionJob.from_task(example("task-paused.json")).status == "PAUSED"
    audit = ExtractionJob.from_task(example("task-completed-consent-output.json"))
    assert audit.status == "completed"  # no businessStatus in that example: Task.status stands in
    assert audit.consent_audit_files == (example("task-completed-consent-output.json")["output"][0]["valueUrl"],)
    [searched] = [e["resource"] for e in example("task-search-bundle.json")["entry"]]
    assert ExtractionJob.from_task(searched) == running


def test_progress_extension_with_active_batches_reads_from_either_url(sim):
    for style in ("torch", "extractor"):
        with start_extraction_server(clock=sim, cohort_size=6, batch_size=2, extension_style=style) as server:
            job_id = server.state.submit(parse_fake_crtdl(CRTDL), []).id
            sim.now += 0.11
            with task_client(server.base_url) as client:
                job = client.job(job_id)
        assert (job.cohort_size, job.batch_size, job.batches_total, job.batches_completed) == (6, 2, 3, 0)
        assert len(job.active_batches) == 3 and all(stage for _, stage in job.active_batches)


def test_the_real_servers_412_for_a_stale_version_is_read_again_like_the_specs_409():
    server, state = scripted_status_server(
        json_reply(200, example("task-running.json")),
        json_reply(412, example("outcome-put-version-conflict.json")),
        json_reply(200, example("task-running.json") | {"meta": {"versionId": "4"}}),
        json_reply(200, example("task-put-priority-response.json")),
    )
    with server, task_client(server.base_url) as client:
        result = client.set_priority("550e8400-e29b-41d4-a716-446655440000", "high")
    assert result.changed and result.job.priority == "HIGH"
    puts = [r for r in state.requests if r.method == "PUT"]
    assert [r.headers["if-match"] for r in puts] == ['W/"3"', 'W/"4"']
    assert json.loads(puts[-1].body) == example("task-put-priority-request.json")


def test_a_428_is_reported_as_a_bug_in_dupflow_not_retried():
    server, state = scripted_status_server(
        json_reply(200, example("task-running.json")), json_reply(428, example("outcome-put-missing-if-match.json"))
    )
    with server, task_client(server.base_url) as client, pytest.raises(ServiceError) as caught:
        client.set_priority("550e8400-e29b-41d4-a716-446655440000", "high")
    assert caught.value.status_code == 428 and "bug in dupflow" in str(caught.value)
    assert len(state.requests) == 2


def test_a_successful_put_without_a_task_body_reads_the_task_again():
    server, state = scripted_status_server(
        json_reply(200, example("task-running.json")),
        Reply(200, {}, b""),
        json_reply(200, example("task-put-priority-response.json")),
    )
    with server, task_client(server.base_url) as client:
        assert client.set_priority("550e8400-e29b-41d4-a716-446655440000", "high").job.priority == "HIGH"
    assert [r.method for r in state.requests] == ["GET", "PUT", "GET"]


def test_task_reads_are_retried_on_5xx_and_deletes_are_attempted_once():
    server, state = scripted_status_server(Reply(503), json_reply(200, example("task-running.json")))
    with server, task_client(server.base_url) as client:
        assert client.job("550e8400-e29b-41d4-a716-446655440000").status == "RUNNING_PROCESS_BATCH"
    server, state = scripted_status_server(json_reply(500, example("outcome-delete-io-error.json")))
    with server, task_client(server.base_url) as client, pytest.raises(ServiceError) as caught:
        client.delete("550e8400-e29b-41d4-a716-446655440000")
    assert "could not remove the result files" in str(caught.value) and len(state.requests) == 1


def test_a_task_read_dripping_its_answer_ends_at_the_task_apis_deadline():
    """One byte every 0.3 s, within every read timeout: the read ends at 10 s, not after 300 s."""
    dripping = Reply(200, {"Content-Type": "application/fhir+json"}, b" " * 1000, drip=0.3)
    server, state = scripted_status_server(dripping)
    one_attempt = RetrySettings(max_attempts=1)
    started = time.monotonic()
    with (
        server,
        ExtractionTaskClient(ExtractorSettings(base_url=server.base_url), TlsSettings(), one_attempt) as client,
    ):
        with pytest.raises(ServiceError) as caught:
            client.job("550e8400-e29b-41d4-a716-446655440000")
    assert "within 10 s, the deadline of one request (the Task API's deadline, 10 s)" in str(caught.value)
    assert len(state.requests) == 1 and time.monotonic() - started < 30


def test_cohort_preview_reads_the_patients_of_the_list_and_404_means_unsupported():
    cohort = {"resourceType": "List", "entry": [{"item": {"reference": "Patient/a"}}, {"item": {"reference": "b"}}]}
    server, state = scripted_status_server(
        json_reply(200, cohort), json_reply(404, {"resourceType": "OperationOutcome"})
    )
    with server, task_client(server.base_url) as client:
        assert client.evaluate_cohort(CRTDL) == ("a", "b")
        with pytest.raises(ServiceError):
            client.evaluate_cohort(CRTDL)
    assert state.requests[0].body == CRTDL and state.requests[0].headers["content-type"] == "application/json"


def test_a_cohort_preview_too_large_for_the_server_or_its_proxy_names_the_limit_to_raise():
    page = b"<html><head><title>413 Request Entity Too Large</title></head><body>nginx</body></html>"
    server, state = scripted_status_server(Reply(413, {"Content-Type": "text/html"}, page))
    with server, task_client(server.base_url) as client, pytest.raises(ServiceError) as caught:
        client.evaluate_cohort(CRTDL)

    assert (caught.value.status_code, caught.value.transient) == (413, False) and len(state.requests) == 1
    assert "the CRTDL is larger than the extraction server accepts" in str(caught.value)
    assert "nginx's client_max_body_size" in str(caught.value)


def test_a_cohort_preview_that_is_no_list_is_an_error():
    with pytest.raises(ExtractionError, match="not a FHIR List"):
        cohort_patient_ids({"resourceType": "Bundle"})
