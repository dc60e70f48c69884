"""A service where nothing answers (nothing listens at the port) fails naming the configuration key of its URL, for
every service and the OAuth issuer; a connection made and then lost, or one to another origin than the configured
one (a result file's host, a redirect's target), does not name it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from config.settings import RetrySettings, Settings, TlsSettings
from flows.run import setting_named_in
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_documents import ExtractionHandle, ExtractionTimeoutError
from tasks.clients.extraction_jobs import ExtractionTaskClient
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.fhir_server import FhirServer
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.s3 import S3Uploader
from tasks.clients.transfer import send_binary
from tasks.flattening import flattening
from tasks.pseudonymizer import pseudonymize_with_service
from tasks.validation import validate_with_service
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.steps import step_input
from tests.support.flattening import EXAMPLE, LOOKUP
from tests.support.ndjson import write_lines
from tests.support.ports import free_port
from tests.support.deadlines import A_MINUTE

TLS = TlsSettings()
ONE_ATTEMPT = RetrySettings(max_attempts=1)
PATIENT = {"resourceType": "Patient", "id": "p1"}
BASIC = {"username": "dupflow", "password": "pw"}
CRTDL = (EXAMPLE / "example-crtdl.json").read_bytes()


@pytest.fixture
def dead() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


def nothing_answers(url: str, key: str) -> str:
    return f"nothing answers at {url}: is the service running there, and is {key} right?"


def settings(steps: list[str], **services: Any) -> Settings:
    tree = {"pipeline": {"enabled_steps": steps}, "retry": {"max_attempts": 1}, "services": services}
    return Settings.model_validate(tree)


def patients(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "Patient.ndjson", [PATIENT])


def test_the_pseudonymizer_step_names_services_pseudonymizer_url(dead, tmp_path):
    configured = settings(["local_import", "pseudonymizer"], pseudonymizer={"url": dead})
    with pytest.raises(Exception) as raised:
        pseudonymize_with_service(configured, patients(tmp_path), tmp_path / "out.zst", None, None)

    message = str(raised.value)
    assert nothing_answers(dead, "services.pseudonymizer.url") in message
    assert setting_named_in(message) == "services.pseudonymizer.url"  # the failure summary's --set line


def test_the_validation_step_names_services_validation_url(dead, tmp_path):
    configured = settings(["local_import", "validation"], validation={"url": dead})
    with pytest.raises(Exception) as raised:
        validate_with_service(configured, patients(tmp_path), tmp_path / "out.zst", 1, None)

    assert nothing_answers(dead, "services.validation.url") in str(raised.value)


def test_the_flattening_step_names_services_flattening_service_url(dead, tmp_path):
    step = step_input(
        tmp_path / "job",
        "flattening",
        folder="import",
        facts={"crtdl_path": str(EXAMPLE / "example-crtdl.json")},
        position=1,
        pipeline__enabled_steps="[local_import, flattening]",
        retry__max_attempts="1",
        services__flattening__lookup_path=str(LOOKUP),
        services__flattening__service_url=dead,
    )
    with pytest.raises(ServiceError) as raised:
        flattening.fn(step)

    assert nothing_answers(dead, "services.flattening.service_url") in str(raised.value)


def test_direct_resource_load_and_transfer_load_name_services_send_url(dead, tmp_path):
    send = settings(
        ["local_import", "send"], send={"url": dead, "send_as": "direct_resource_load", "auth": BASIC}
    ).services.send
    with FhirServer.connect(send, TLS, ONE_ATTEMPT) as server:
        with pytest.raises(ServiceError) as transaction:
            server.transaction(b'{"resourceType": "Bundle", "type": "transaction", "entry": []}', 0)
        with pytest.raises(ServiceError) as binary:
            send_binary(server, patients(tmp_path), "b1", tmp_path)

    for raised in (transaction, binary):
        assert nothing_answers(dead, "services.send.url") in str(raised.value)


def test_s3_upload_names_services_send_s3_endpoint(dead, tmp_path):
    """s3_upload to an endpoint where nothing listens said only botocore's "Could not connect to the endpoint URL",
    naming no key (and no --set line in the failure summary)."""
    s3 = {"bucket": "research", "region": "eu-central-1", "access_key_id": "AKIDX", "secret_access_key": "s3-secret"}
    send = settings(["local_import", "send"], send={"send_as": "s3_upload", "s3": {**s3, "endpoint": dead}})
    uploader = S3Uploader(send.services.send, TLS, ONE_ATTEMPT, tmp_path / "s3-manifest.json")
    try:
        with pytest.raises(ServiceError) as raised:
            uploader.upload(patients(tmp_path), "job-1/Patient.ndjson")
    finally:
        uploader.close()

    message = str(raised.value)
    assert nothing_answers(dead, "services.send.s3.endpoint") in message
    assert setting_named_in(message) == "services.send.s3.endpoint"
    assert raised.value.transient and "s3-secret" not in message


def test_the_extraction_kick_off_and_the_task_api_name_services_extractor_base_url(dead):
    extractor = settings(["extractor"], extractor={"base_url": dead}).services.extractor
    with ExtractionServerClient(extractor, TLS) as client, pytest.raises(ServiceError) as kick_off:
        client.submit(CRTDL)
    with ExtractionTaskClient(extractor, TLS, ONE_ATTEMPT) as client, pytest.raises(ServiceError) as search:
        client.search()

    for raised in (kick_off, search):
        assert nothing_answers(dead, "services.extractor.base_url") in str(raised.value)


def test_a_status_poll_where_nothing_answers_logs_services_extractor_base_url(dead, caplog):
    extractor = settings(["extractor"], extractor={"base_url": dead}).services.extractor
    moments = itertools.count(step=10**6)  # each look at the clock finds the liveness window passed
    handle = ExtractionHandle(f"{dead}/fhir/__status/j1", "j1")
    with ExtractionServerClient(extractor, TLS, clock=lambda: next(moments)) as client:
        with pytest.raises(ExtractionTimeoutError):
            client.poll_until_complete(handle)

    (warning,) = [record.getMessage() for record in caplog.records if "status poll" in record.getMessage()]
    assert nothing_answers(dead, "services.extractor.base_url") in warning


def test_an_oauth_issuer_where_nothing_answers_names_its_key(dead, tmp_path):
    with LoopbackServer(EchoHandler, EchoState()) as service:
        auth = {"oauth_issuer_uri": f"{dead}/realms/r", "oauth_client_id": "dupflow", "oauth_client_secret": "s3"}
        pseudonymizer = {"url": service.base_url, "auth": auth}
        configured = settings(["local_import", "pseudonymizer"], pseudonymizer=pseudonymizer)
        with pytest.raises(Exception) as raised:
            pseudonymize_with_service(configured, patients(tmp_path), tmp_path / "out.zst", None, None)
        assert service.state.requests == []

    assert nothing_answers(dead, "services.pseudonymizer.auth.oauth_issuer_uri") in str(raised.value)
    assert "s3" not in str(raised.value)


def test_another_origin_than_the_service_s_is_not_taken_for_the_service(dead):
    """A result file on another host, or a redirect's target, is not the configured URL: no key is named."""
    redirect = Reply(302, {"Location": f"{dead}/files/a.ndjson"}, b"")
    with LoopbackServer(EchoHandler, EchoState([redirect])) as service:
        endpoint = ServiceEndpoint("extractor", f"{service.base_url}/fhir", setting="services.extractor.base_url")
        with ServiceClient(endpoint, TLS, ONE_ATTEMPT) as client:
            with pytest.raises(ServiceError) as elsewhere:
                client.request("GET", f"{dead}/files/a.ndjson", deadline=A_MINUTE, operation="download")
            with pytest.raises(ServiceError) as redirected:
                client.request("GET", "/fhir/files/a.ndjson", deadline=A_MINUTE, operation="download")

    for raised in (elsewhere, redirected):
        assert "ConnectError" in str(raised.value) and "nothing answers" not in str(raised.value)


def test_a_connection_lost_mid_answer_is_not_told_as_nothing_answering():
    with LoopbackServer(EchoHandler, EchoState([Reply(reset=True)])) as service:
        endpoint = ServiceEndpoint("validation", service.base_url, setting="services.validation.url")
        with ServiceClient(endpoint, TLS, ONE_ATTEMPT) as client, pytest.raises(ServiceError) as raised:
            client.request("GET", "/metadata", deadline=A_MINUTE, operation="read metadata")

    assert "network error" in str(raised.value) and "nothing answers" not in str(raised.value)
