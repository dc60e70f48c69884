"""Kept-alive connections: calls share them, and each call's deadline holds on a reused one."""

from __future__ import annotations

import functools
import socket
import threading
import time
from datetime import timedelta

import orjson
import pytest

from config.settings import RetrySettings, TlsSettings
from tasks.clients.bounds import MB, Deadline
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tests.fakes._server import LoopbackServer
from tests.conftest import wait_until
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.flattener import FlattenerHandler, FlattenerState
from tests.support.extraction import CRTDL, extractor_settings
from tests.support.pseudonymization import open_service, patient
from tests.support.deadlines import A_MINUTE

PATIENT_IDS = orjson.dumps(
    {"resourceType": "ViewDefinition", "resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]}
)
ONE_ATTEMPT = RetrySettings(max_attempts=1, initial_backoff_ms=1, max_backoff_ms=1)


def test_sequential_calls_to_the_pseudonymizer_share_one_connection(pseudonymizer_fake):
    before = pseudonymizer_fake.connections
    with open_service(pseudonymizer_fake) as service:
        for i in range(50):
            service.pseudonymize(orjson.dumps(patient(i)), patient(i))
    assert len(pseudonymizer_fake.state.requests) == 50
    assert pseudonymizer_fake.connections - before == 1


def test_concurrent_calls_to_the_pseudonymizer_open_at_most_one_connection_each(pseudonymizer_fake):
    before = pseudonymizer_fake.connections
    with open_service(pseudonymizer_fake) as service:

        def calls(first: int) -> None:
            for i in range(first, first + 25):
                service.pseudonymize(orjson.dumps(patient(i)), patient(i))

        threads = [threading.Thread(target=calls, args=(25 * n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(pseudonymizer_fake.state.requests) == 100
    assert 1 <= pseudonymizer_fake.connections - before <= 4


def test_a_server_dripping_its_headers_on_a_reused_connection_is_cut_off_at_the_deadline():
    with LoopbackServer(FlattenerHandler, FlattenerState()) as server:
        endpoint = ServiceEndpoint("flattening", server.base_url)
        with ServiceClient(endpoint, TlsSettings(), ONE_ATTEMPT) as client:
            service = Flattener(client, deadline=timedelta(seconds=1))
            assert list(service.run(PATIENT_IDS, [orjson.dumps(patient(1))])) == [{"id": "p1"}]
            server.state.drip_header_seconds = 0.3  # its headers would take about a minute
            started = time.monotonic()
            with pytest.raises(ServiceError, match=r"no complete answer from \S+ within 1 s, the deadline"):
                list(service.run(PATIENT_IDS, [orjson.dumps(patient(2))]))
            assert time.monotonic() - started < 10
        assert server.connections == 1  # the second call went on the first one's connection


def test_an_extraction_kick_off_never_goes_on_a_connection_another_call_left_open():
    kicked_off = Reply(202, {"Content-Location": "http://127.0.0.1/fhir/__status/job-1"}, b"")
    with LoopbackServer(EchoHandler, EchoState(replies=[kicked_off, kicked_off])) as server:
        with ExtractionServerClient(extractor_settings(server.base_url), TlsSettings()) as client:
            client.submit(CRTDL)
            client.submit(CRTDL)
        assert [request.headers["connection"] for request in server.state.requests] == ["close", "close"]
        assert server.connections == 2


def test_a_server_that_never_reads_the_body_is_cut_off_at_the_deadline():
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the kernel takes the connection; none reads
        endpoint = ServiceEndpoint("validation", f"http://127.0.0.1:{listener.getsockname()[1]}")
        deadline = functools.partial(Deadline, timedelta(seconds=1), "a test's deadline")
        started = time.monotonic()
        with ServiceClient(endpoint, TlsSettings(), ONE_ATTEMPT) as client:
            with pytest.raises(ServiceError, match=r"within 1 s, the deadline of one request \(a test's deadline"):
                client.request("POST", "/validate", operation="validate", deadline=deadline, body=b"x" * 64 * MB)
        assert time.monotonic() - started < 10


def test_a_server_reading_the_body_slowly_is_cut_off_near_the_deadline():
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def read_slowly() -> None:  # about 300 KB/s, always some: the body would take a minute
            connection, _ = listener.accept()
            with connection:
                while not stop.is_set() and connection.recv(65536):
                    stop.wait(0.2)

        threading.Thread(target=read_slowly, daemon=True).start()
        endpoint = ServiceEndpoint("validation", f"http://127.0.0.1:{listener.getsockname()[1]}")
        deadline = functools.partial(Deadline, timedelta(seconds=1), "a test's deadline")
        started = time.monotonic()
        try:
            with ServiceClient(endpoint, TlsSettings(), ONE_ATTEMPT) as client:
                with pytest.raises(ServiceError, match=r"within 1 s, the deadline of one request"):
                    client.request("POST", "/validate", operation="validate", deadline=deadline, body=b"x" * 16 * MB)
        finally:
            stop.set()
        assert time.monotonic() - started < 10


class SilentlyClosingHandler(EchoHandler):
    """Closes each connection after its answer without saying so, as a server's idle timeout does."""

    closed = 0

    def handle(self) -> None:
        self.handle_one_request()

    def finish(self) -> None:
        super().finish()
        self.connection.shutdown(socket.SHUT_WR)  # the FIN goes out now, before it is counted
        type(self).closed += 1


def test_a_call_after_the_server_closed_the_idle_connection_goes_once_on_a_new_one():
    with LoopbackServer(SilentlyClosingHandler, EchoState()) as server:
        with ServiceClient(ServiceEndpoint("fhir_server", server.base_url), TlsSettings(), ONE_ATTEMPT) as client:
            client.request("POST", "/fhir", deadline=A_MINUTE, operation="transaction", body=b"{}", once=True)
            wait_until(lambda: SilentlyClosingHandler.closed == 1, "the server closing the connection")
            client.request("POST", "/fhir", deadline=A_MINUTE, operation="transaction", body=b"{}", once=True)
        assert len(server.state.requests) == 2 and server.connections == 2
