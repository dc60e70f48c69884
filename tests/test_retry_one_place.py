"""Every client retries through the one policy of ``tasks.clients.retry``; the extraction kick-off never does.

Each client talks to the recording echo server, which answers a scripted 503 with ``Retry-After``, another 503,
then success (or 503s only). The policy shows itself in three ways that must be the same for every client: the
number of requests that reach the server (``retry.max_attempts`` at most), the wait before each retry (the server's
Retry-After, else the backoff) as the policy logs it, and the transient ``ServiceError`` raised when the attempts
are used up.

The extraction status poll is not a retry but the spec's poll loop (pipeline-tool.md, "States and transitions"): one
GET per iteration, 503 is "sleep with backoff, retry" from ``polling_interval`` until ``extraction_timeout`` of
silence, so ``retry.max_attempts`` does not bound it; it honours Retry-After the same way.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from config.services import ExtractorSettings
from config.settings import RetrySettings, Settings, TlsSettings
from tasks.clients.downloads import download_ndjson
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_documents import ExtractionHandle
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.fhir_server import FhirServer
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client
from tasks.clients.pseudonymizer import Pseudonymizer
from tasks.clients.validator import Chunk, Validator
from tasks.http_import import fetch_ndjson
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply

TLS = TlsSettings()
RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=1000)
UNAVAILABLE_A_MOMENT = Reply(503, {"Retry-After": "0.3"})
UNAVAILABLE = Reply(503)
POLICY_WAITS = ["attempt 1 of 3, retrying in 0.3 s", "attempt 2 of 3, retrying in 0.2 s"]
"""The first wait is the server's Retry-After, the second the backoff min(100 ms * 2**1, 1000 ms)."""

PATIENT = b'{"resourceType":"Patient","id":"p1"}'
NDJSON = PATIENT + b"\n"
TRANSACTION = b'{"resourceType":"Bundle","type":"transaction","entry":[{"resource":' + PATIENT + b"}]}"
TRANSACTION_RESPONSE = (
    b'{"resourceType":"Bundle","type":"transaction-response","entry":[{"response":{"status":"201 Created"}}]}'
)
OUTCOME = b'{"resourceType":"OperationOutcome","issue":[{"severity":"information","code":"informational"}]}'
CAPABILITIES = json.dumps(
    {
        "resourceType": "CapabilityStatement",
        "rest": [{"resource": [{"type": "ViewDefinition", "operation": [{"name": "run"}]}]}],
    }
).encode()


def ndjson_file() -> Reply:
    return Reply(200, {"Content-Type": "application/fhir+ndjson"}, NDJSON)


def download(base_url: str, tmp_path: Path) -> object:
    with build_client(ServiceEndpoint("extractor", base_url), TLS) as client:
        return download_ndjson(
            client,
            f"{base_url}/files/a.ndjson",
            tmp_path / "a.ndjson",
            level=None,
            max_line_bytes=1 << 20,
            stall_timeout=timedelta(seconds=30),
            retry=RETRY,
        ).resources


def http_import(base_url: str, tmp_path: Path) -> object:
    settings = Settings(pipeline={"enabled_steps": ["http_import"]}, retry=RETRY.model_dump())
    return fetch_ndjson(f"{base_url}/a.ndjson", tmp_path / "a.ndjson", settings).resources


def pseudonymize(base_url: str, tmp_path: Path) -> object:
    with ServiceClient(ServiceEndpoint("pseudonymizer", base_url), TLS, RETRY) as client:
        return Pseudonymizer(client).pseudonymize(PATIENT, json.loads(PATIENT)).line


def validate(base_url: str, tmp_path: Path) -> object:
    with ServiceClient(ServiceEndpoint("validation", base_url), TLS, RETRY) as client:
        return Validator(client).validate(Chunk(1, PATIENT, ("Patient/p1",)), "a.ndjson")["resourceType"]


def send_to_fhir_server(base_url: str, tmp_path: Path) -> object:
    with FhirServer(ServiceClient(ServiceEndpoint("FHIR server", base_url), TLS, RETRY)) as server:
        return server.transaction(TRANSACTION, 1)["type"]


def check_flattener(base_url: str, tmp_path: Path) -> object:
    with ServiceClient(ServiceEndpoint("flattening", base_url), TLS, RETRY) as client:
        Flattener(client).check()
    return "listed $run"


# (client, its success answer, what the call returns with it)
CLIENTS: dict[str, tuple[Callable[[str, Path], object], Reply, object]] = {
    "extraction download": (download, ndjson_file(), 1),
    "http_import": (http_import, ndjson_file(), 1),
    "pseudonymizer": (pseudonymize, Reply(200, body=PATIENT), PATIENT),
    "validator": (validate, Reply(200, body=OUTCOME), "OperationOutcome"),
    "FHIR server": (send_to_fhir_server, Reply(200, body=TRANSACTION_RESPONSE), "transaction-response"),
    "flattener": (check_flattener, Reply(200, body=CAPABILITIES), "listed $run"),
}


def serve(*replies: Reply) -> LoopbackServer:
    return LoopbackServer(EchoHandler, EchoState(replies=list(replies)))


def policy_waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the policy logged before each retry: the attempt and the wait (the failure is told once)."""
    messages = [r.getMessage() for r in caplog.records if r.name == "dupflow.clients" and "retrying in" in r.message]
    assert all(message.count(" failed") == 1 for message in messages), messages
    return [message.rsplit("; ", 1)[1] for message in messages]


@pytest.mark.parametrize("name", CLIENTS)
def test_every_client_retries_a_503_through_the_one_policy(name, tmp_path, caplog):
    call, success, expected = CLIENTS[name]
    with (
        caplog.at_level(logging.WARNING, logger="dupflow.clients"),
        serve(UNAVAILABLE_A_MOMENT, UNAVAILABLE, success) as server,
    ):
        assert call(server.base_url, tmp_path) == expected
        assert len(server.state.requests) == 3
    assert policy_waits(caplog) == POLICY_WAITS


@pytest.mark.parametrize("name", CLIENTS)
def test_every_client_stops_after_max_attempts_with_a_transient_error(name, tmp_path, caplog):
    call, _, _ = CLIENTS[name]
    with (
        caplog.at_level(logging.WARNING, logger="dupflow.clients"),
        serve(UNAVAILABLE_A_MOMENT, UNAVAILABLE, UNAVAILABLE) as server,
    ):
        with pytest.raises(ServiceError) as raised:
            call(server.base_url, tmp_path)
        assert len(server.state.requests) == RETRY.max_attempts
    assert (raised.value.status_code, raised.value.transient) == (503, True)
    assert policy_waits(caplog) == POLICY_WAITS


def extraction_client(base_url: str, sleeps: list[float]) -> ExtractionServerClient:
    settings = ExtractorSettings(base_url=base_url, polling_interval="PT1S", max_polling_interval="PT30S")
    return ExtractionServerClient(settings, TLS, sleep=sleeps.append)


def test_the_status_poll_never_polls_sooner_than_its_backoff_and_polls_on_past_max_attempts(tmp_path):
    manifest = {"output": [{"type": "NDJSON Bundle", "url": "/files/a.ndjson"}], "error": []}
    replies = [
        UNAVAILABLE_A_MOMENT,
        *[UNAVAILABLE] * RETRY.max_attempts,
        Reply(200, body=json.dumps(manifest).encode()),
    ]
    sleeps: list[float] = []
    with serve(*replies) as server, extraction_client(server.base_url, sleeps) as client:
        urls = client.poll_until_complete(ExtractionHandle(f"{server.base_url}/fhir/__status/j", "j"))
        assert urls == [f"{server.base_url}/files/a.ndjson"]
        assert [request.method for request in server.state.requests] == ["GET"] * (RETRY.max_attempts + 2)
    assert sleeps == [1.0, 2.0, 4.0, 8.0]  # a Retry-After of 0.3 s does not shorten the wait; the back-off doubles on


@pytest.mark.parametrize("failure", [Reply(503), Reply(502), Reply(reset=True)], ids=["503", "502", "reset"])
def test_the_extraction_kick_off_is_sent_exactly_once(failure, tmp_path, caplog):
    crtdl = json.dumps({"cohortDefinition": {}, "dataExtraction": {}}).encode()
    with caplog.at_level(logging.WARNING, logger="dupflow.clients"), serve(failure, Reply(202)) as server:
        with extraction_client(server.base_url, []) as client, pytest.raises(ServiceError) as raised:
            client.submit(crtdl)
        assert [(r.method, r.path) for r in server.state.requests] == [("POST", "/fhir/$extract-data")]
    assert raised.value.transient and raised.value.operation == f"submit extraction to {server.base_url}"
    assert policy_waits(caplog) == []


def dead_base_url() -> str:
    """An address on 127.0.0.1 where nothing listens (a port just bound and let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("name", CLIENTS)
def test_every_client_names_the_address_nobody_answers_at(name, tmp_path):
    call, _, _ = CLIENTS[name]
    base_url = dead_base_url()

    with pytest.raises(ServiceError) as raised:
        call(base_url, tmp_path)

    assert raised.value.status_code is None
    assert f" at {base_url}/" in str(raised.value)


def test_the_extraction_kick_off_names_the_address_nobody_answers_at():
    base_url = dead_base_url()
    crtdl = json.dumps({"cohortDefinition": {}, "dataExtraction": {}}).encode()

    with extraction_client(base_url, []) as client, pytest.raises(ServiceError) as raised:
        client.submit(crtdl)

    assert f" at {base_url}/fhir/$extract-data" in str(raised.value)
