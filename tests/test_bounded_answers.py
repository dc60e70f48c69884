"""Every answer the service clients do not need whole is left unread or read bounded, and an OAuth client secret
goes only to a token endpoint as safe as its issuer.

The servers here send a huge body (declared, or until the client hangs up) and count the bytes they got out: a
client that reads only what it needs stops them early, whatever the declared size. Memory is judged by those
counts, never by timing.
"""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import pytest
import trustme
import zstandard

from config.services import AuthSettings, ExtractorSettings
from config.settings import RetrySettings, Settings, TlsSettings
from tasks.clients.auth import TokenSource
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_jobs import ExtractionTaskClient
from tasks.clients.extraction_documents import ExtractionError, ExtractionHandle
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client, trusted_context
from tasks.http_import import fetch_ndjson
from tests.conftest import wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.support.deadlines import A_MINUTE

MB = 1024 * 1024
HUGE = 160 * MB
"""The size of a huge body: a client that read it whole would have the server send all of it."""
PIECE = 64 * 1024
UNREAD_LIMIT = 16 * MB
"""At most this much of an answer left unread leaves the server: socket buffers, nothing read by the client."""
READ_LIMIT = 96 * MB
"""At most this much of an endless answer read up to a 32 MB bound leaves the server (the bound and the buffers)."""
TLS = TlsSettings()
NO_RETRY = RetrySettings(max_attempts=1)
SECRET = "bounded-answers-secret-5d21"
FILL = b"x" * PIECE


@dataclass(frozen=True)
class Reply:
    """One answer: ``body``, then ``filler`` bytes sent until the client hangs up. ``declared``: the whole size is
    sent as Content-Length; else the body ends where the connection does."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    filler: int = 0
    declared: bool = True


def endless(status: int, declared: bool = False, **headers: str) -> Reply:
    return Reply(status, headers, filler=HUGE, declared=declared)


def json_reply(status: int, document: dict, **headers: str) -> Reply:
    return Reply(status, {"Content-Type": "application/json", **headers}, json.dumps(document).encode())


@dataclass
class Script:
    """Replies per path, taken in turn (the last one repeats); what each request sent and each path's body bytes
    sent; ``open``: requests still being answered."""

    replies: dict[str, list[Reply]]
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    accepted_encodings: list[str | None] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    open: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str, path: str, body: bytes) -> Reply:
        with self.lock:
            self.requests.append((method, path, body))
            self.open += 1
            turns = self.replies.get(path) or [Reply(404)]
            return turns.pop(0) if len(turns) > 1 else turns[0]

    def done(self, path: str, sent: int) -> None:
        with self.lock:
            self.sent[path] = self.sent.get(path, 0) + sent
            self.open -= 1

    def settled(self) -> dict[str, int]:
        """The bytes sent per path, once every answer has ended (the client hung up or it was sent whole)."""
        wait_until(lambda: self.open == 0, "every answer ended")
        return self.sent


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        script: Script = self.server.state
        path = self.path.split("?")[0]
        script.accepted_encodings.append(self.headers.get("Accept-Encoding"))
        reply = script.take(self.command, path, self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIECE)  # little waits in buffers
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.declared:
            self.send_header("Content-Length", str(len(reply.body) + reply.filler))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        script.done(path, self.send_body(reply))

    do_POST = do_PUT = do_GET

    def send_body(self, reply: Reply) -> int:
        sent = 0
        try:
            self.wfile.write(reply.body)
            sent = len(reply.body)
            while sent < len(reply.body) + reply.filler:
                self.wfile.write(FILL)
                sent += len(FILL)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent


@pytest.fixture
def script() -> Script:
    return Script({})


@pytest.fixture
def server(script: Script):
    with LoopbackServer(ScriptedHandler, script) as running:
        yield running


# --- 1a: the body of an answer that is not used (a redirect, a 401 before a fresh token) is never read -----------


def redirect_to_final(script: Script) -> None:
    script.replies.update({"/start": [endless(302, Location="/final")], "/final": [Reply(200, body=b"final")]})


def test_a_redirects_huge_body_is_not_read_on_a_streamed_call(script, server):
    redirect_to_final(script)
    with build_client(ServiceEndpoint("svc", server.base_url), TLS) as client:
        with client.stream("GET", "/start") as response:
            assert response.read() == b"final"
    assert script.settled()["/start"] < UNREAD_LIMIT


def test_a_redirects_huge_declared_body_is_not_read_on_a_plain_request(script, server):
    script.replies.update({"/start": [endless(307, declared=True, Location="/final")]})
    script.replies["/final"] = [Reply(200, body=b"final")]
    with ServiceClient(ServiceEndpoint("svc", server.base_url), TLS, NO_RETRY) as client:
        assert client.request("GET", "/start", deadline=A_MINUTE, operation="read").content == b"final"
    assert script.settled()["/start"] < UNREAD_LIMIT


def test_a_401s_huge_body_is_not_read_before_the_request_goes_again_with_a_fresh_token(script, server):
    oauth = OAuthState()
    script.replies["/data"] = [endless(401), Reply(200, body=b"data")]
    with LoopbackServer(OAuthHandler, oauth) as issuer:
        auth = AuthSettings(
            oauth_issuer_uri=issuer.base_url + REALM_PATH,
            oauth_client_id=oauth.client_id,
            oauth_client_secret=oauth.client_secret,
        )
        with build_client(ServiceEndpoint("svc", server.base_url, auth), TLS) as client:
            with client.stream("GET", "/data") as response:
                assert response.read() == b"data"
    assert len(oauth.token_requests) == 2
    assert script.settled()["/data"] < UNREAD_LIMIT


# --- 1b: every answer is asked for as sent, and one that comes compressed anyway is refused unread --------------


def zstd_bomb(decoded: int = 1024 * MB) -> bytes:
    """A zstd body of a few KB that would decode to ``decoded`` bytes (frames of 64 MB of newlines, repeated)."""
    frame = zstandard.ZstdCompressor(level=1).compress(b"\n" * (64 * MB))
    return frame * (decoded // (64 * MB))


def bomb_reply(encoding: str) -> Reply:
    body = zstd_bomb() if encoding == "zstd" else gzip.compress(b"\n" * (64 * MB), compresslevel=1)
    return Reply(200, {"Content-Type": "application/fhir+ndjson", "Content-Encoding": encoding}, body)


def streamed(server: LoopbackServer) -> bytes:
    with build_client(ServiceEndpoint("svc", server.base_url), TLS) as client:
        with client.stream("GET", "/data") as response:
            return response.read()


def requested(server: LoopbackServer) -> bytes:
    with ServiceClient(ServiceEndpoint("svc", server.base_url), TLS, NO_RETRY) as client:
        return client.request("GET", "/data", deadline=A_MINUTE, operation="read").content


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
@pytest.mark.parametrize("call", [streamed, requested])
def test_a_compressed_answer_is_refused_before_it_is_decoded(script, server, call, encoding):
    script.replies["/data"] = [bomb_reply(encoding)]
    with pytest.raises(
        ServiceError, match=f"svc: .* came compressed \\(Content-Encoding '{encoding}'\\).*not to compress"
    ):
        call(server)
    assert script.accepted_encodings == ["identity"]


def test_a_download_answered_compressed_fails_terminally_and_leaves_no_file(script, server, tmp_path):
    script.replies["/Patient.ndjson"] = [bomb_reply("zstd")]
    settings = Settings.model_validate(
        {"pipeline": {"enabled_steps": ["http_import"]}, "retry": {"initial_backoff_ms": 1, "max_backoff_ms": 1}}
    )
    with pytest.raises(ServiceError, match="came compressed") as failed:
        fetch_ndjson(f"{server.base_url}/Patient.ndjson", tmp_path / "Patient.ndjson", settings)
    assert not failed.value.transient and len(script.requests) == 1
    assert list(tmp_path.iterdir()) == []


# --- 1c: the extraction kick-off's body is never needed ---------------------------------------------------------


def extraction_client(server: LoopbackServer) -> ExtractionServerClient:
    return ExtractionServerClient(ExtractorSettings(base_url=server.base_url), TLS)


def test_the_kick_offs_huge_body_is_not_read(script, server):
    script.replies["/fhir/$extract-data"] = [endless(202, **{"Content-Location": "/fhir/__status/job-1"})]
    with extraction_client(server) as client:
        handle = client.submit(b'{"cohortDefinition": {}}')
    assert handle.status_url == f"{server.base_url}/fhir/__status/job-1"
    assert script.settled()["/fhir/$extract-data"] < UNREAD_LIMIT


def test_a_refused_kick_off_is_reported_with_its_diagnostics(script, server):
    outcome = {"resourceType": "OperationOutcome", "issue": [{"severity": "error", "diagnostics": "bad CRTDL"}]}
    script.replies["/fhir/$extract-data"] = [json_reply(400, outcome)]
    with extraction_client(server) as client, pytest.raises(ServiceError, match="HTTP 400 .*: bad CRTDL"):
        client.submit(b"{}")


def test_a_failed_kick_off_with_an_endless_body_is_reported_from_its_first_mib(script, server):
    script.replies["/fhir/$extract-data"] = [endless(500)]
    with extraction_client(server) as client, pytest.raises(ServiceError) as failed:
        client.submit(b"{}")
    assert failed.value.status_code == 500 and "HTTP 500 Internal Server Error" in failed.value.message
    assert script.settled()["/fhir/$extract-data"] < UNREAD_LIMIT


# --- 1d: the operator's Task API reads its answers bounded and says so when one is not JSON ----------------------


def task_client(server: LoopbackServer) -> ExtractionTaskClient:
    return ExtractionTaskClient(ExtractorSettings(base_url=server.base_url), TLS, NO_RETRY)


def test_a_task_search_answer_declared_too_large_is_refused_unread(script, server):
    script.replies["/fhir/Task"] = [endless(200, declared=True)]
    with task_client(server) as client, pytest.raises(ServiceError) as refused:
        client.search()
    message = str(refused.value)
    assert "search extraction jobs failed" in message and f"{server.base_url}/fhir/Task" in message
    assert "160.0 MB, more than the 32.0 MB read" in message and not refused.value.transient
    assert script.settled()["/fhir/Task"] < UNREAD_LIMIT


def test_an_endless_task_search_answer_is_cut_off_at_its_bound(script, server):
    script.replies["/fhir/Task"] = [endless(200)]
    with task_client(server) as client, pytest.raises(ServiceError, match="over 32.0 MB, more than the 32.0 MB"):
        client.search()
    assert script.settled()["/fhir/Task"] < READ_LIMIT


def test_an_endless_cohort_preview_is_cut_off_at_its_bound(script, server):
    script.replies["/fhir/$evaluate-cohort"] = [endless(200)]
    with task_client(server) as client, pytest.raises(ServiceError, match="preview cohort failed .* over 64.0 MB"):
        client.evaluate_cohort(b"{}")
    assert script.settled()["/fhir/$evaluate-cohort"] < READ_LIMIT + 32 * MB


@pytest.mark.parametrize(
    ("path", "call"),
    [
        ("/fhir/Task", lambda client: client.search()),
        ("/fhir/Task/job-1", lambda client: client.read_task("job-1")),
        ("/fhir/$evaluate-cohort", lambda client: client.evaluate_cohort(b"{}")),
    ],
    ids=["search", "read", "cohort"],
)
def test_a_task_api_answer_that_is_not_json_is_a_service_error(script, server, path, call):
    script.replies[path] = [Reply(200, {"Content-Type": "text/html"}, b"<html>please sign in</html>")]
    with task_client(server) as client, pytest.raises(ServiceError) as failed:
        call(client)
    assert f"{server.base_url}{path} answered HTTP 200 with a body that is not JSON" in failed.value.message
    assert "services.extractor.base_url" in failed.value.message and "sign in" not in failed.value.message


def test_a_task_answer_that_is_json_but_no_resource_is_a_service_error(script, server):
    script.replies["/fhir/Task/job-1"] = [Reply(200, body=b"[1, 2]")]
    with task_client(server) as client, pytest.raises(ServiceError, match="not a JSON object"):
        client.job("job-1")


def test_a_manifest_nested_deeper_than_json_is_written_is_an_extraction_error(script, server):
    """orjson reads 1,024 levels of JSON but writes 254: an error entry of such a manifest, copied into the error,
    raised a bare RecursionError."""
    deep = b'{"a":' * 999 + b"1" + b"}" * 999
    request = f"{server.base_url}/fhir/$extract-data".encode()
    manifest = b'{"transactionTime":"x","request":"%s","output":[],"error":[%s]}' % (request, deep)
    script.replies["/fhir/__status/j1"] = [Reply(200, {"Content-Type": "application/json"}, manifest)]
    handle = ExtractionHandle.from_status_url(f"{server.base_url}/fhir/__status/j1")
    with ExtractionServerClient(ExtractorSettings(base_url=server.base_url), TLS) as client:
        with pytest.raises(ExtractionError, match=r"answer is not JSON \(or nested deeper than JSON's sane"):
            client.poll_until_complete(handle)


# --- the OAuth answers (discovery, token) are read bounded -------------------------------------------------------


def token_source(issuer: str, verify: ssl.SSLContext | bool = False) -> TokenSource:
    return TokenSource(issuer, "dupflow", SECRET, verify)


def test_an_endless_discovery_document_is_cut_off(script, server):
    script.replies["/realm/.well-known/openid-configuration"] = [endless(200)]
    with pytest.raises(ServiceError, match="fetch OAuth token failed .* more than the 1.0 MB"):
        token_source(server.base_url + "/realm").access_token()
    assert script.settled()["/realm/.well-known/openid-configuration"] < UNREAD_LIMIT


def test_an_endless_token_answer_is_cut_off(script, server):
    script.replies["/realm/.well-known/openid-configuration"] = [Reply(404)]
    script.replies["/realm/protocol/openid-connect/token"] = [endless(200)]
    with pytest.raises(ServiceError, match="fetch OAuth token failed .* more than the 1.0 MB"):
        token_source(server.base_url + "/realm").access_token()
    assert script.settled()["/realm/protocol/openid-connect/token"] < UNREAD_LIMIT


def test_a_compressed_token_answer_is_refused(script, server):
    script.replies["/realm/.well-known/openid-configuration"] = [Reply(404)]
    script.replies["/realm/protocol/openid-connect/token"] = [Reply(200, {"Content-Encoding": "gzip"}, b"\x1f\x8b")]
    with pytest.raises(ServiceError, match="Content-Encoding 'gzip'"):
        token_source(server.base_url + "/realm").access_token()
    (_, _, sent) = script.requests[-1]
    assert b"client_secret" in sent  # the request went out; its answer is what is refused


# --- 2: the client secret never goes to a token endpoint weaker than its issuer ---------------------------------


@pytest.fixture(scope="module")
def test_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trusting(test_ca, tmp_path) -> ssl.SSLContext:
    path = tmp_path / "ca.pem"
    test_ca.cert_pem.write_to_path(str(path))
    return trusted_context(str(path))


def https_server(test_ca: trustme.CA, script: Script) -> LoopbackServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    test_ca.issue_cert("127.0.0.1").configure_cert(context)
    return LoopbackServer(ScriptedHandler, script, ssl_context=context)


def discovery(endpoint: str) -> dict[str, list[Reply]]:
    return {"/realm/.well-known/openid-configuration": [json_reply(200, {"token_endpoint": endpoint})]}


TOKEN = {"access_token": "token-from-elsewhere-1c", "token_type": "Bearer", "expires_in": 300}


def test_an_http_token_endpoint_of_an_https_issuer_is_refused_before_the_secret_goes_out(
    test_ca, trusting, script, server
):
    script.replies["/token"] = [json_reply(200, TOKEN)]
    with https_server(test_ca, Script(discovery(f"{server.base_url}/token"))) as issuer:
        with pytest.raises(ServiceError) as refused:
            token_source(issuer.base_url + "/realm", trusting).access_token()
    message = str(refused.value)
    assert f"oauth_issuer_uri {issuer.base_url}/realm" in message and f"{server.base_url}/token" in message
    assert "not https" in message and SECRET not in message
    assert script.requests == []


def test_a_token_endpoint_with_user_info_is_refused(test_ca, trusting, script, server):
    endpoint = server.base_url.replace("://", "://admin:pw-in-url@") + "/token"
    with https_server(test_ca, Script(discovery(endpoint))) as issuer:
        with pytest.raises(ServiceError, match="user name or password") as refused:
            token_source(issuer.base_url + "/realm", trusting).access_token()
    assert "pw-in-url" not in str(refused.value) and SECRET not in str(refused.value)
    assert script.requests == []


def test_a_token_endpoint_on_another_https_origin_is_used(test_ca, trusting):
    tokens = Script({"/token": [json_reply(200, TOKEN)]})
    with https_server(test_ca, tokens) as token_server:
        with https_server(test_ca, Script(discovery(f"{token_server.base_url}/token"))) as issuer:
            assert token_source(issuer.base_url + "/realm", trusting).access_token() == TOKEN["access_token"]
    ((method, path, form),) = tokens.requests
    assert (method, path) == ("POST", "/token") and SECRET.encode() in form


def test_an_http_issuer_may_name_an_http_token_endpoint(script, server):
    script.replies.update(discovery(f"{server.base_url}/token") | {"/token": [json_reply(200, TOKEN)]})
    assert token_source(server.base_url + "/realm").access_token() == TOKEN["access_token"]
