"""Credentials go only to the origin of the configured service URL — also across redirects."""

from __future__ import annotations

import logging

import pytest

from config.services import AuthSettings, ExtractorSettings
from config.settings import TlsSettings
from tasks.clients.auth import origin_of
from tasks.clients.errors import ServiceError
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.clients.http import ServiceEndpoint, build_client
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState

CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "x-api-key"}
TLS = TlsSettings()


@pytest.fixture
def service():
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


@pytest.fixture
def elsewhere():
    """A second loopback server: same host, another port, so another origin."""
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


@pytest.fixture
def issuer():
    with LoopbackServer(OAuthHandler, OAuthState()) as server:
        yield server


@pytest.fixture(params=["basic+api-key", "oauth+api-key"])
def auth(request, issuer) -> AuthSettings:
    if request.param == "basic+api-key":
        return AuthSettings(username="alice", password="pw-secret", api_key="key-secret")
    state: OAuthState = issuer.state
    return AuthSettings(
        oauth_issuer_uri=issuer.base_url + REALM_PATH,
        oauth_client_id=state.client_id,
        oauth_client_secret=state.client_secret,
        api_key="key-secret",
    )


def credentials_seen(server: LoopbackServer) -> list[set[str]]:
    return [set(request.headers) & CREDENTIAL_HEADERS for request in server.state.requests]


def test_absolute_url_on_another_origin_gets_no_credentials(service, elsewhere, auth):
    with build_client(ServiceEndpoint("extractor", service.base_url, auth), TLS) as client:
        client.get("/fhir/$status", headers={"Proxy-Authorization": "Basic c2VjcmV0"})
        client.get(f"{elsewhere.base_url}/output/batch-1.ndjson", headers={"Proxy-Authorization": "Basic c2VjcmV0"})

    assert credentials_seen(service) == [{"authorization", "x-api-key", "proxy-authorization"}]
    assert credentials_seen(elsewhere) == [set()]


def test_cross_origin_redirect_is_followed_without_credentials(service, elsewhere, auth):
    service.state.replies.append(Reply(302, {"Location": f"{elsewhere.base_url}/files/core.ndjson"}))

    with build_client(ServiceEndpoint("extractor", service.base_url, auth), TLS) as client:
        response = client.get("/output/core.ndjson")

    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [302]
    assert credentials_seen(service) == [{"authorization", "x-api-key"}]
    assert credentials_seen(elsewhere) == [set()]
    assert elsewhere.state.requests[0].path == "/files/core.ndjson"


def test_redirect_back_to_the_service_origin_carries_credentials_again(service, elsewhere, auth):
    service.state.replies.append(Reply(307, {"Location": f"{elsewhere.base_url}/hop"}))
    elsewhere.state.replies.append(Reply(303, {"Location": f"{service.base_url}/final"}))

    with build_client(ServiceEndpoint("send", service.base_url, auth), TLS) as client:
        response = client.get("/start")

    assert response.status_code == 200
    assert [(r.method, r.path) for r in service.state.requests] == [("GET", "/start"), ("GET", "/final")]
    assert elsewhere.state.requests[0].method == "GET"
    assert credentials_seen(service) == [{"authorization", "x-api-key"}] * 2
    assert credentials_seen(elsewhere) == [set()]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_request_with_a_body_is_never_sent_on_by_a_redirect(service, elsewhere, auth, status):
    """A 307/308 handed the transaction (patient data) to the other server, and the step reported success; a
    301/302/303 turned it into a GET without its body, and the error told of anything but the redirect."""
    service.state.replies.append(Reply(status, {"Location": f"{elsewhere.base_url}/fhir"}))

    with build_client(ServiceEndpoint("send", service.base_url, auth), TLS) as client:
        with pytest.raises(ServiceError) as refused:
            client.post("/fhir", content=b"patient data")

    assert f"the server redirects to {elsewhere.base_url}/fhir" in str(refused.value)
    assert "set the service's URL in the configuration" in str(refused.value) and not refused.value.transient
    assert elsewhere.state.requests == [] and len(service.state.requests) == 1


def test_withheld_credentials_are_logged_once_per_origin(service, elsewhere, caplog):
    caplog.set_level(logging.INFO, logger="dupflow.clients")
    auth = AuthSettings(api_key="key-secret")

    with build_client(ServiceEndpoint("extractor", service.base_url, auth), TLS) as client:
        for name in ("a", "b", "c"):
            client.get(f"{elsewhere.base_url}/{name}")

    withheld = [r for r in caplog.records if "sending no credentials" in r.getMessage()]
    assert len(withheld) == 1
    assert f"127.0.0.1:{elsewhere.port}" in withheld[0].getMessage()
    assert "key-secret" not in caplog.text


@pytest.mark.parametrize(
    ("configured", "requested", "same"),
    [
        ("https://fhir.example.org", "https://fhir.example.org:443/fhir/Patient", True),
        ("http://fhir.example.org:80/base", "http://FHIR.example.org/other", True),
        ("https://fhir.example.org", "http://fhir.example.org/", False),
        ("https://fhir.example.org", "https://files.example.org/", False),
        ("https://fhir.example.org:8443", "https://fhir.example.org/", False),
    ],
)
def test_origin_compares_scheme_host_and_normalised_port(configured, requested, same):
    assert (origin_of(configured) == origin_of(requested)) is same


def test_redirect_followed_by_httpx_itself_still_drops_credentials(service, elsewhere, auth):
    service.state.replies.append(Reply(302, {"Location": f"{elsewhere.base_url}/files/core.ndjson"}))

    with build_client(ServiceEndpoint("extractor", service.base_url, auth), TLS) as client:
        response = client.get("/output/core.ndjson", follow_redirects=True)

    assert response.status_code == 200
    assert credentials_seen(service) == [{"authorization", "x-api-key"}]
    assert credentials_seen(elsewhere) == [set()]


def test_a_token_in_the_configured_urls_query_goes_with_each_request_to_its_origin_and_nowhere_else(service, elsewhere):
    """A service URL may carry its token in the query (``services.validation.url: https://h/api?apikey=${KEY}``).
    Paths are joined before it, not after it (httpx would send ``/api?apikey=K/$validate``), and, like every other
    credential, it goes only to the service's origin."""
    endpoint = ServiceEndpoint("validation", f"{service.base_url}/api?apikey=K-secret&tenant=t1")
    with build_client(endpoint, TLS) as client:
        client.post("/$validate", params={"_format": "json"}, content=b"{}")
        client.get(f"{service.base_url}/files/a.ndjson")
        client.get(f"{elsewhere.base_url}/files/b.ndjson")
    assert [request.path for request in service.state.requests] == [
        "/api/$validate?_format=json&apikey=K-secret&tenant=t1",
        "/files/a.ndjson?apikey=K-secret&tenant=t1",
    ]
    assert [request.path for request in elsewhere.state.requests] == ["/files/b.ndjson"]


def test_the_extraction_client_joins_its_paths_before_the_configured_query(service):
    service.state.replies.append(Reply(202, {"Content-Location": f"{service.base_url}/torch/fhir/__status/1"}, b""))
    settings = ExtractorSettings(base_url=f"{service.base_url}/torch?access_token=T-secret")
    with ExtractionServerClient(settings, TLS) as client:
        handle = client.submit(b'{"cohortDefinition": {}, "dataExtraction": {}}')
    assert handle.status_url == f"{service.base_url}/torch/fhir/__status/1"
    assert [request.path for request in service.state.requests] == ["/torch/fhir/$extract-data?access_token=T-secret"]
