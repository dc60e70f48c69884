"""Retry of outgoing calls: attempts, backoff schedule, Retry-After, transient vs terminal errors."""

from __future__ import annotations

import functools
import socket
import threading
import time
from datetime import datetime, timedelta, UTC
from email.utils import format_datetime

import pytest

from config.settings import RetrySettings, TlsSettings
from tasks.clients.bounds import Deadline
from tasks.clients.errors import ServiceError, parse_retry_after
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.streams.fanout import Cancelled, cancel_scope
from tests.conftest import wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply, operation_outcome
from tests.support.deadlines import A_MINUTE

TLS = TlsSettings()
RETRY = RetrySettings(max_attempts=5, initial_backoff_ms=100, max_backoff_ms=1000)


class FakeSleep:
    """Records the waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleep() -> FakeSleep:
    return FakeSleep()


def serve(*replies: Reply) -> LoopbackServer:
    return LoopbackServer(EchoHandler, EchoState(replies=list(replies)))


def call(
    server: LoopbackServer,
    sleep: FakeSleep,
    *,
    retry: RetrySettings = RETRY,
    once: bool = False,
    method: str = "GET",
):
    with ServiceClient(ServiceEndpoint("validator", server.base_url), TLS, retry, sleep=sleep) as client:
        return client.request(method, "/fhir/$validate", deadline=A_MINUTE, operation="validate bundle", once=once)


def test_transient_5xx_is_retried_with_doubling_backoff(sleep):
    with serve(Reply(503), Reply(502), Reply(500)) as server:
        response = call(server, sleep)

        assert response.status_code == 200
        assert len(server.state.requests) == 4
    assert sleep.waits == [0.1, 0.2, 0.4]


def test_backoff_is_capped_at_max_backoff(sleep):
    retry = RetrySettings(max_attempts=6, initial_backoff_ms=100, max_backoff_ms=250)
    with serve(*[Reply(503)] * 5) as server:
        call(server, sleep, retry=retry)
    assert sleep.waits == [0.1, 0.2, 0.25, 0.25, 0.25]


def test_attempts_stop_at_max_attempts_with_a_transient_error(sleep):
    retry = RetrySettings(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=1000)
    with serve(*[Reply(500, body=operation_outcome("database unavailable"))] * 3) as server:
        with pytest.raises(ServiceError) as raised:
            call(server, sleep, retry=retry)

        assert len(server.state.requests) == 3
    error = raised.value
    assert (error.status_code, error.transient, error.kind) == (500, True, "transient")
    assert (error.service, error.operation) == ("validator", "validate bundle")
    assert "database unavailable" in str(error)
    assert sleep.waits == [0.1, 0.2]


@pytest.mark.parametrize("status", [408, 429])
def test_request_timeout_and_too_many_requests_are_transient(sleep, status):
    with serve(Reply(status)) as server:
        assert call(server, sleep).status_code == 200
        assert len(server.state.requests) == 2


def test_retry_after_seconds_replaces_the_backoff(sleep):
    with serve(Reply(429, {"Retry-After": "0.7"})) as server:
        call(server, sleep)
    assert sleep.waits == [0.7]


def test_retry_after_is_capped_at_max_backoff(sleep):
    with serve(Reply(503, {"Retry-After": "120"})) as server:
        call(server, sleep)
    assert sleep.waits == [1.0]


def test_retry_after_http_date_is_honoured(sleep):
    in_a_moment = format_datetime(datetime.now(UTC) + timedelta(seconds=3), usegmt=True)
    retry = RetrySettings(max_attempts=2, initial_backoff_ms=100, max_backoff_ms=10_000)
    with serve(Reply(503, {"Retry-After": in_a_moment})) as server:
        call(server, sleep, retry=retry)
    assert len(sleep.waits) == 1 and 1.5 < sleep.waits[0] <= 3.0


def test_retry_after_parsing():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("5", now=now) == 5.0
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0  # in the past: no wait
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after(None) is None


def test_terminal_4xx_is_not_retried_and_reports_the_operation_outcome_text(sleep):
    outcome = operation_outcome("Profile http://example.org/Foo not found", "Unknown code 'xyz'")
    with serve(Reply(422, body=outcome)) as server:
        with pytest.raises(ServiceError) as raised:
            call(server, sleep)

        assert len(server.state.requests) == 1
    error = raised.value
    assert (error.status_code, error.transient) == (422, False)
    assert error.message == "Profile http://example.org/Foo not found; Unknown code 'xyz'"
    assert sleep.waits == []


def test_error_bodies_other_than_operation_outcomes_are_not_echoed(sleep):
    body = b"<html>upstream said: password=hunter2</html>"
    with serve(Reply(400, {"Content-Type": "text/html"}, body)) as server:
        with pytest.raises(ServiceError) as raised:
            call(server, sleep)
    assert "hunter2" not in str(raised.value) + repr(raised.value)
    assert raised.value.message == "HTTP 400 Bad Request"


def test_never_retry_call_is_attempted_once_even_on_a_transient_error(sleep):
    with serve(Reply(503)) as server:
        with pytest.raises(ServiceError) as raised:
            call(server, sleep, once=True, method="POST")

        assert len(server.state.requests) == 1
    assert raised.value.transient
    assert sleep.waits == []


def test_connection_reset_is_retried(sleep):
    with serve(Reply(reset=True), Reply(reset=True)) as server:
        response = call(server, sleep)

        assert response.status_code == 200
        assert len(server.state.requests) == 3
    assert sleep.waits == [0.1, 0.2]


def test_read_timeout_is_transient_and_retried(sleep):
    with serve(Reply(delay=0.5)) as server:
        endpoint = ServiceEndpoint("flattener", server.base_url, timeout=timedelta(seconds=0.1))
        with ServiceClient(endpoint, TLS, RETRY, sleep=sleep) as client:
            response = client.request("POST", "/$flatten", deadline=A_MINUTE, operation="flatten")

        assert response.status_code == 200
        assert len(server.state.requests) == 2
    assert sleep.waits == [0.1]


def test_unreachable_service_ends_as_a_transient_network_error(sleep):
    with socket.socket() as placeholder:  # a port that nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    retry = RetrySettings(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=1000)
    with ServiceClient(ServiceEndpoint("extractor", f"http://127.0.0.1:{port}"), TLS, retry, sleep=sleep) as client:
        with pytest.raises(ServiceError) as raised:
            client.request("GET", "/fhir/metadata", deadline=A_MINUTE, operation="poll")

    error = raised.value
    assert (error.status_code, error.transient, error.operation) == (None, True, "poll")
    assert "ConnectError" in error.message
    assert sleep.waits == [0.1, 0.2]


def test_requests_within_a_deadline_retry_with_the_same_schedule():
    waits: list[float] = []
    deadline = functools.partial(Deadline, timedelta(seconds=10), "a test's deadline")

    with serve(Reply(503), Reply(reset=True), Reply(429, {"Retry-After": "0.5"})) as server:
        endpoint = ServiceEndpoint("pseudonymizer", server.base_url)
        with ServiceClient(endpoint, TLS, RETRY, sleep=waits.append) as client:
            request = {"operation": "pseudonymize", "deadline": deadline, "body": b"{}"}
            assert client.request("POST", "/fhir/$de-identify", **request).status_code == 200
        assert len(server.state.requests) == 4
    assert waits == [0.1, 0.2, 0.5]


def test_a_call_of_a_cancelled_fan_out_sends_nothing_and_is_not_logged_as_retrying(caplog):
    with serve(Reply(503)) as server, cancel_scope() as cancel:
        cancel()
        with ServiceClient(ServiceEndpoint("pseudonymizer", server.base_url), TLS, RETRY) as client:
            with pytest.raises(Cancelled):
                client.request("POST", "/fhir/$de-identify", deadline=A_MINUTE, operation="pseudonymize", json={})
        assert server.state.requests == []
    assert "retrying" not in caplog.text


@pytest.mark.parametrize("attempts", [5, 1], ids=["attempts-left", "last-attempt"])
def test_a_cancel_ends_a_request_within_a_deadline_at_once_however_long_the_service_holds_it(attempts):
    """On the last attempt (no retry to refuse it) the read the cancel ended was told as the request's deadline."""
    retry = RetrySettings(max_attempts=attempts, initial_backoff_ms=100, max_backoff_ms=1000)
    deadline = functools.partial(Deadline, timedelta(seconds=120), "a test's deadline")
    with serve(Reply(delay=20)) as server, cancel_scope() as cancel:

        def cancel_once_sent() -> None:
            wait_until(lambda: server.state.requests, "the request reached the service")
            cancel()

        threading.Thread(target=cancel_once_sent, daemon=True).start()
        started = time.monotonic()
        with ServiceClient(ServiceEndpoint("validation", server.base_url), TLS, retry) as client:
            with pytest.raises(Cancelled):
                client.request("POST", "/validateResource", operation="validate", deadline=deadline, body=b"{}")
        assert time.monotonic() - started < 10
