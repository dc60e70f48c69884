"""A service's own words reach messages, logs, summaries and artifacts as plain, bounded text: an escape sequence
that clears the terminal, a carriage return that forges a log line, a bidi mark that reverses what follows, each
becomes a space, at every door (any client's error, a transaction entry's status and outcome, a resource id from
the data, a validator's findings). And the OAuth token fetch, bounded in time like every other call."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from config.services import AuthSettings, SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.auth import TokenSource
from tasks.clients.errors import ServiceError
from tasks.clients.fhir_server import FhirServer
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.validator import read_findings
from tasks.core.errors import StepError
from tasks.send import send_resources
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.support.deadlines import A_MINUTE

HOSTILE = "disk\x1b[2J\x1b]0;owned\x07 full\r12:00:00 INFO all sent\u202eexe.gnp"
NO_RETRY = RetrySettings(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0)


def plain(text: str) -> bool:
    return text.isprintable() and "\x1b" not in text and "\u202e" not in text


def outcome(text: str, **issue: object) -> dict:
    return {"resourceType": "OperationOutcome", "issue": [{"severity": "error", "diagnostics": text, **issue}]}


def test_a_services_error_text_is_plain_in_any_clients_error():
    state = EchoState(replies=[Reply(503, body=json.dumps(outcome(HOSTILE)).encode())])
    with LoopbackServer(EchoHandler, state) as server:
        endpoint = ServiceEndpoint("validator", server.base_url, AuthSettings(), timedelta(seconds=10))
        with ServiceClient(endpoint, TlsSettings(), NO_RETRY) as client, pytest.raises(ServiceError) as caught:
            client.request("GET", "/x", deadline=A_MINUTE, operation="validate")
    assert plain(str(caught.value)) and "disk [2J ]0;owned full 12:00:00 INFO all sent exe.gnp" in str(caught.value)


def test_a_rejected_entrys_status_outcome_and_resource_id_are_plain_and_bounded(tmp_path: Path):
    answer = {
        "resourceType": "Bundle",
        "type": "transaction-response",
        "entry": [{"response": {"status": "422 " + HOSTILE + "x" * 1_000_000, "outcome": outcome(HOSTILE)}}],
    }
    state = EchoState(replies=[Reply(200, body=orjson.dumps(answer))])
    hostile_id = "p\x1b[31mRED\n" + "y" * 200_000
    source = tmp_path / "core.ndjson"
    source.write_bytes(orjson.dumps({"resourceType": "Patient", "id": hostile_id}) + b"\n")
    with LoopbackServer(EchoHandler, state) as server:
        send = SendSettings(send_as="direct_resource_load", url=server.base_url)
        with FhirServer.connect(send, TlsSettings(), NO_RETRY) as fhir, pytest.raises(StepError) as caught:
            send_resources(fhir, source, tmp_path / "send", job_id="j", batch_size=10, max_line_bytes=1 << 20)
    message = str(caught.value)
    assert plain(message) and len(message) < 10_000, message[:500]
    assert "first failing entry: entry 1 ('Patient/p\\x1b[31mRED\\n" in message


def test_a_validators_findings_are_plain_and_bounded():
    findings = read_findings(
        outcome(HOSTILE + "z" * 3_000_000, expression=["Patient.name\x1b[2J" + "w" * 100_000]), ("Patient/p1",), 5
    )
    (finding,) = findings.findings
    assert plain(finding.describe()) and len(finding.describe()) < 2_000
    assert finding.message.startswith("disk [2J ]0;owned full 12:00:00 INFO all sent exe.gnp")


# --- the OAuth token: bounded in time, and an answer without a token is a clear error ----------------------------


def test_a_token_endpoint_dripping_its_answer_is_cut_off_at_the_fetchs_deadline():
    """The call needing the token has its own deadline, which cannot cut off the token's client: a token answer
    dripping one byte every 0.2 s held the call (and every caller waiting for the token) as long as it dripped."""
    token = json.dumps({"access_token": "t", "token_type": "Bearer", "expires_in": 300}).encode()
    state = EchoState(replies=[Reply(404), Reply(200, body=token, drip=0.2)])
    started = time.monotonic()
    with LoopbackServer(EchoHandler, state) as idp, pytest.raises(ServiceError) as caught:
        TokenSource(idp.base_url + "/realm", "dupflow", "s3cret", False, deadline=timedelta(seconds=1)).access_token()
    assert caught.value.transient and "no complete answer from http://127.0.0.1" in str(caught.value)
    assert "within 1 s" in str(caught.value) and time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"token_type": "Bearer"}', "has no access_token"),
        (b"<html>sign in</html>", "is no token"),
    ],
    ids=["no-access-token", "login-page"],
)
def test_a_token_answer_without_a_token_names_the_setting_to_check(body, said):
    state = EchoState(replies=[Reply(404), Reply(200, {"Content-Type": "text/html"}, body)])
    with LoopbackServer(EchoHandler, state) as idp, pytest.raises(ServiceError) as caught:
        TokenSource(idp.base_url + "/realm", "dupflow", "s3cret", False).access_token()
    assert said in str(caught.value) and "check oauth_issuer_uri" in str(caught.value)
    assert not caught.value.transient and "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("status", "fix"),
    [(401, "check services.send.auth"), (403, "check services.send.auth"), (413, "lower services.send.batch_size")],
)
def test_a_refused_transaction_names_the_setting_to_check(tmp_path: Path, status, fix):
    state = EchoState(replies=[Reply(status, body=b"")])
    source = tmp_path / "core.ndjson"
    source.write_bytes(b'{"resourceType":"Patient","id":"p1"}\n')
    with LoopbackServer(EchoHandler, state) as server:
        send = SendSettings(send_as="direct_resource_load", url=server.base_url)
        with FhirServer.connect(send, TlsSettings(), NO_RETRY) as fhir, pytest.raises(StepError) as caught:
            send_resources(fhir, source, tmp_path / "send", job_id="j", batch_size=10, max_line_bytes=1 << 20)
    assert f"was rejected (HTTP {status}): " in str(caught.value) and fix in str(caught.value)
