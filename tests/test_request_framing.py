"""Every outgoing request with a body declares its length, so a server or front that reads only ``Content-Length``
(an old-style front answers 411, a Java service reading an empty body 400 "not a valid Parameters Resource", nginx
with request buffering off fails) takes it.

Each call goes to the recording echo server set to read only ``Content-Length`` (``allow_chunked=False``: a chunked
body gets 411), and must succeed with every body it sent declared by a ``Content-Length`` of the body's size. The
OAuth token request goes to the OAuth fake, which reads only ``Content-Length`` as every service fake does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from config.services import AuthSettings, ExtractorSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.fhir_server import FhirServer
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.pseudonymizer import AnonymizationConfig, Pseudonymizer
from tasks.clients.validator import Chunk, Validator
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, RecordedRequest, Reply
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState

TLS = TlsSettings()
RETRY = RetrySettings(max_attempts=1)
PATIENT = b'{"resourceType":"Patient","id":"p1"}'
OUTCOME = b'{"resourceType":"OperationOutcome","issue":[{"severity":"information","code":"informational"}]}'
VIEW = b'{"resourceType":"ViewDefinition","resource":"Patient","select":[{"column":[{"name":"id","path":"id"}]}]}'
CRTDL = json.dumps({"cohortDefinition": {"inclusionCriteria": []}, "dataExtraction": {"attributeGroups": []}}).encode()


def kick_off(base_url: str, tmp_path: Path) -> object:
    settings = ExtractorSettings(base_url=base_url)
    with ExtractionServerClient(settings, TLS) as client:
        return client.submit(CRTDL).status_url


def pseudonymize(base_url: str, tmp_path: Path) -> object:
    config = tmp_path / "anonymization.yml"
    config.write_text("fhirPathRules:\n  - path: Patient.name\n    method: redact\n")

    with ServiceClient(ServiceEndpoint("pseudonymizer", base_url), TLS, RETRY) as client:
        pseudonymizer = Pseudonymizer(client, config=AnonymizationConfig.read(config))
        return pseudonymizer.pseudonymize(PATIENT, json.loads(PATIENT)).line


def validate(base_url: str, tmp_path: Path) -> object:
    with ServiceClient(ServiceEndpoint("validation", base_url), TLS, RETRY) as client:
        return Validator(client).validate(Chunk(1, PATIENT + b"\n", ("Patient/p1",)), "a.ndjson")["resourceType"]


def remote_run(base_url: str, tmp_path: Path) -> object:
    with ServiceClient(ServiceEndpoint("flattening", base_url), TLS, RETRY) as client:
        return list(Flattener(client).run(VIEW, [PATIENT]))


def transaction(base_url: str, tmp_path: Path) -> object:
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [{"resource": json.loads(PATIENT)}]}
    with FhirServer(ServiceClient(ServiceEndpoint("FHIR server", base_url), TLS, RETRY)) as server:
        return server.transaction(json.dumps(bundle).encode(), 1)["type"]


def put_document_reference(base_url: str, tmp_path: Path) -> object:
    with FhirServer(ServiceClient(ServiceEndpoint("FHIR server", base_url), TLS, RETRY)) as server:
        server.put("DocumentReference", "d1", b'{"resourceType":"DocumentReference","id":"d1"}')
    return "put"


def put_streamed_binary(base_url: str, tmp_path: Path) -> object:
    pieces = [b'{"resourceType":"Binary","id":"b1",', b'"data":"', b"QUJD" * 1000, b'"}']
    with FhirServer(ServiceClient(ServiceEndpoint("FHIR server", base_url), TLS, RETRY)) as server:
        server.put("Binary", "b1", lambda: iter(pieces), length=sum(map(len, pieces)))
    return "put"


def transaction_response() -> bytes:
    entry = {"response": {"status": "201 Created", "location": "Patient/p1/_history/1"}}
    return json.dumps({"resourceType": "Bundle", "type": "transaction-response", "entry": [entry]}).encode()


# (the call, the echo server's answer to it given its base URL, what the call returns)
CALLS: dict[str, tuple[Callable[[str, Path], object], Callable[[str], Reply], object]] = {
    "extraction kick-off": (
        kick_off,
        lambda base: Reply(202, {"Content-Location": f"{base}/fhir/__status/1"}, b""),
        "{base}/fhir/__status/1",
    ),
    "pseudonymizer": (pseudonymize, lambda base: Reply(200, body=PATIENT), PATIENT),
    "validator": (validate, lambda base: Reply(200, body=OUTCOME), "OperationOutcome"),
    "remote $run": (remote_run, lambda base: Reply(200, body=b'{"id":"p1"}\n'), [{"id": "p1"}]),
    "FHIR transaction": (transaction, lambda base: Reply(200, body=transaction_response()), "transaction-response"),
    "DocumentReference PUT": (put_document_reference, lambda base: Reply(201, body=b"{}"), "put"),
    "Binary PUT streamed": (put_streamed_binary, lambda base: Reply(201, body=b"{}"), "put"),
}


def length_only_server(*replies: Reply) -> LoopbackServer:
    return LoopbackServer(EchoHandler, EchoState(replies=list(replies), allow_chunked=False))


def assert_declared(request: RecordedRequest) -> None:
    assert "transfer-encoding" not in request.headers, request.headers
    assert request.headers.get("content-length") == str(len(request.body)), request.headers
    assert request.body, "the call sent no body"


@pytest.mark.parametrize("name", CALLS)
def test_every_call_with_a_body_declares_its_length_to_a_content_length_only_server(name, tmp_path):
    call, reply, expected = CALLS[name]
    with length_only_server() as server:
        server.state.replies.append(reply(server.base_url))
        result = call(server.base_url, tmp_path)
        [request] = server.state.requests
    assert result == (expected.format(base=server.base_url) if isinstance(expected, str) else expected)
    assert_declared(request)


def test_a_chunked_body_gets_411_from_a_content_length_only_server():
    """The switch the tests above rely on: without it the server would take what it must refuse."""
    with length_only_server(Reply(200)) as server:
        answer = httpx.post(server.base_url + "/fhir", content=iter([b"{", b"}"]))
    assert answer.status_code == 411
    assert server.state.requests == []


def test_the_oauth_token_request_declares_its_length(tmp_path):
    state = OAuthState()
    with LoopbackServer(OAuthHandler, state) as issuer, length_only_server(Reply(200, body=OUTCOME)) as server:
        auth = AuthSettings(
            oauth_issuer_uri=issuer.base_url + REALM_PATH,
            oauth_client_id=state.client_id,
            oauth_client_secret=state.client_secret,
        )

        with ServiceClient(ServiceEndpoint("validation", server.base_url, auth), TLS, RETRY) as client:
            outcome = Validator(client).validate(Chunk(1, PATIENT + b"\n", ("Patient/p1",)), "a.ndjson")
        assert outcome["resourceType"] == "OperationOutcome"
        [request] = server.state.requests
    assert state.token_requests, "no token was requested"  # the OAuth fake refuses a chunked token request
    assert request.headers["authorization"].startswith("Bearer ")
    assert_declared(request)
