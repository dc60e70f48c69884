"""TLS of outgoing calls: extra CA bundle on top of the system CAs, or verification skipped with a warning."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from datetime import timedelta

import botocore.exceptions
import pytest
import trustme
from moto.server import ThreadedMotoServer

from config.services import S3Settings, SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.downloads import wait_until_available
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client, ssl_verify
from tasks.clients.s3_client import make_s3_client
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState
from tests.support.deadlines import A_MINUTE

RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=1)


@pytest.fixture(scope="module")
def test_ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_pem(test_ca, tmp_path) -> str:
    path = tmp_path / "test-ca.pem"
    test_ca.cert_pem.write_to_path(str(path))
    return str(path)


def tls_server_context(test_ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    test_ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def https_service(test_ca):
    with LoopbackServer(EchoHandler, EchoState(), ssl_context=tls_server_context(test_ca)) as server:
        yield server


def get_metadata(server: LoopbackServer, tls: TlsSettings, sleep=lambda _: None):
    with ServiceClient(ServiceEndpoint("extractor", server.base_url), tls, RETRY, sleep=sleep) as client:
        return client.request("GET", "/fhir/metadata", deadline=A_MINUTE, operation="read metadata")


def test_certificate_from_an_unknown_ca_is_rejected_without_retry(https_service):
    sleeps: list[float] = []

    with pytest.raises(ServiceError) as raised:
        get_metadata(https_service, TlsSettings(), sleep=sleeps.append)

    assert raised.value.status_code is None and not raised.value.transient
    assert "CERTIFICATE_VERIFY_FAILED" in raised.value.message and "give its CA with tls.ca_cert_path" in str(
        raised.value
    )
    assert sleeps == []
    assert https_service.state.requests == []


@pytest.mark.parametrize("scheme", ["https", "ftp"])
def test_a_result_file_that_no_check_can_make_ready_is_said_at_once_naming_the_fix(https_service, scheme):
    """An untrusted certificate, or a URL of a scheme httpx cannot speak, counted as "not ready": every check was
    waited for, then the advice was to raise file_ready_retries."""
    url = f"{https_service.base_url}/files/a.ndjson".replace("https", scheme)
    sleeps: list[float] = []
    with build_client(ServiceEndpoint("extractor", https_service.base_url), TlsSettings()) as client:
        with pytest.raises(ServiceError) as raised:
            wait_until_available(client, url, checks=10, interval=timedelta(seconds=10), sleep=sleeps.append)
    fix = "give its CA with tls.ca_cert_path" if scheme == "https" else "only http and https URLs can be fetched"
    assert fix in str(raised.value) and "file_ready_retries" not in str(raised.value)
    assert sleeps == [] and not raised.value.transient


def test_ca_cert_path_makes_the_server_trusted(https_service, ca_pem):
    assert get_metadata(https_service, TlsSettings(ca_cert_path=ca_pem)).status_code == 200
    assert len(https_service.state.requests) == 1


def test_system_cas_stay_trusted_next_to_ca_cert_path(ca_pem, test_ca):
    context = ssl_verify(TlsSettings(ca_cert_path=ca_pem), purpose="test")

    subjects = [dict(part[0] for part in cert["subject"]) for cert in context.get_ca_certs()]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert any("trustme" in subject.get("organizationName", "") for subject in subjects)
    assert any(subject.get("commonName") == "ISRG Root X1" for subject in subjects)  # a public root CA


def test_insecure_skip_verify_accepts_any_certificate_and_warns(https_service, caplog):
    caplog.set_level(logging.WARNING, logger="dupflow.clients")

    assert get_metadata(https_service, TlsSettings(insecure_skip_verify=True)).status_code == 200
    assert any(
        r.levelno == logging.WARNING and "verification is disabled for extractor" in r.getMessage()
        for r in caplog.records
    )


def test_unreadable_ca_cert_path_is_reported_with_its_path(tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match="tls.ca_cert_path .*nope.pem"):
        ssl_verify(TlsSettings(ca_cert_path=missing), purpose="test")


# --- S3 behind a TLS endpoint (a TLS reverse proxy in front of moto) ------------------------------------------


@pytest.fixture
def https_s3(test_ca):
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    state = EchoState(upstream=f"http://{host}:{port}")
    with LoopbackServer(EchoHandler, state, ssl_context=tls_server_context(test_ca)) as proxy:
        yield proxy
    moto.stop()


def s3_send(endpoint: str) -> SendSettings:
    return SendSettings(
        s3=S3Settings(
            bucket="secure",
            region="us-east-1",
            access_key_id="AKIDTEST",
            secret_access_key="s3-secret-key",
            endpoint=endpoint,
            use_path_style=True,
        )
    )


@pytest.mark.slow
def test_s3_client_trusts_ca_cert_path(https_s3, ca_pem, tmp_path):
    """botocore takes one bundle file: it is the job's (a killed process leaves no temporary copy behind)."""
    bundle = tmp_path / "send" / "s3-ca-bundle.pem"
    tls = TlsSettings(ca_cert_path=ca_pem)
    s3 = make_s3_client(s3_send(https_s3.base_url), tls, RetrySettings(max_attempts=1), bundle)

    s3.create_bucket(Bucket="secure")
    s3.put_object(Bucket="secure", Key="job/a.ndjson", Body=b"{}\n")

    assert s3.get_object(Bucket="secure", Key="job/a.ndjson")["Body"].read() == b"{}\n"
    assert bundle.read_bytes().endswith(Path(ca_pem).read_bytes())
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["s3-ca-bundle.pem"]


@pytest.mark.slow
def test_an_s3_ca_bundle_removed_or_left_by_another_run_is_written_anew(https_s3, ca_pem, tmp_path):
    """The send folder removed to send again, or a bundle of other CAs (an earlier run's settings): a process that
    made its bundle before still gets one that holds its CAs."""
    bundle, tls, once = tmp_path / "s3-ca-bundle.pem", TlsSettings(ca_cert_path=ca_pem), RetrySettings(max_attempts=1)
    make_s3_client(s3_send(https_s3.base_url), tls, once, bundle)
    for left in (None, b"not the CAs of this run\n"):
        bundle.unlink()
        if left is not None:
            bundle.write_bytes(left)

        make_s3_client(s3_send(https_s3.base_url), tls, once, bundle).create_bucket(Bucket=f"bucket-{len(left or b'')}")

        assert bundle.read_bytes().endswith(Path(ca_pem).read_bytes())


@pytest.mark.slow
def test_s3_client_trusts_the_system_cas_as_every_other_client_does(https_s3, ca_pem, monkeypatch, tmp_path):
    """A site CA installed in the system store (here the file SSL_CERT_FILE names, as OpenSSL reads it): the HTTP
    clients trusted it, but S3 used certifi's public CAs alone and failed with CERTIFICATE_VERIFY_FAILED."""
    monkeypatch.setenv("SSL_CERT_FILE", ca_pem)
    s3 = make_s3_client(s3_send(https_s3.base_url), TlsSettings(), RetrySettings(max_attempts=1), tmp_path / "ca.pem")

    s3.create_bucket(Bucket="secure")

    assert len(https_s3.state.requests) == 1


@pytest.mark.slow
def test_s3_client_rejects_an_unknown_ca(https_s3, tmp_path):
    s3 = make_s3_client(s3_send(https_s3.base_url), TlsSettings(), RetrySettings(max_attempts=1), tmp_path / "ca.pem")

    with pytest.raises(botocore.exceptions.SSLError):
        s3.create_bucket(Bucket="secure")
    assert https_s3.state.requests == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_s3_client_with_insecure_skip_verify_connects_and_warns(https_s3, caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="dupflow.clients")
    tls = TlsSettings(insecure_skip_verify=True)
    s3 = make_s3_client(s3_send(https_s3.base_url), tls, RetrySettings(max_attempts=1), tmp_path / "ca.pem")

    s3.create_bucket(Bucket="secure")

    assert len(https_s3.state.requests) == 1
    assert "verification is disabled for S3" in caplog.text
