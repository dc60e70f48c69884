"""Authentication of outgoing calls: Basic, OAuth 2.0 client credentials, API keys, S3 proxy auth, no leaks."""

from __future__ import annotations

import base64
import logging
import time

import httpx
import pytest

from config.services import AuthSettings, S3Settings, SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.bounds import ReplayableBody
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client
from tasks.clients.s3_client import make_s3_client
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState
from tests.fakes.oauth import (
    DISCOVERED_TOKEN_PATH,
    KEYCLOAK_TOKEN_PATH,
    REALM_PATH,
    OAuthHandler,
    OAuthState,
    ResourceHandler,
)
from tests.support.deadlines import A_MINUTE

CREDENTIAL_HEADER_NAMES = {"authorization", "proxy-authorization", "x-api-key", "x-custom-key"}
PASSWORD = "basic-pw-4711"
API_KEY = "api-key-0815"
TLS = TlsSettings()
NO_RETRY = RetrySettings(max_attempts=1)


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def oauth() -> OAuthState:
    return OAuthState()


@pytest.fixture
def issuer(oauth: OAuthState):
    with LoopbackServer(OAuthHandler, oauth) as server:
        yield server


@pytest.fixture
def resource(oauth: OAuthState):
    """A service that accepts only tokens the issuer handed out and that have not expired."""
    with LoopbackServer(ResourceHandler, oauth) as server:
        yield server


@pytest.fixture
def service():
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


def oauth_auth(issuer: LoopbackServer, oauth: OAuthState, **extra) -> AuthSettings:
    return AuthSettings(
        oauth_issuer_uri=issuer.base_url + REALM_PATH,
        oauth_client_id=oauth.client_id,
        oauth_client_secret=oauth.client_secret,
        **extra,
    )


def sent_credentials(server: LoopbackServer) -> dict[str, str]:
    (request,) = server.state.requests
    return {name: value for name, value in request.headers.items() if name in CREDENTIAL_HEADER_NAMES}


def get_once(base_url: str, auth: AuthSettings | None, path: str = "/metadata") -> httpx.Response:
    with build_client(ServiceEndpoint("svc", base_url, auth), TLS) as client:
        return client.get(path)


# --- which headers each auth block produces ------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth_fields", "expected"),
    [
        ({}, {}),
        ({"username": "alice", "password": PASSWORD}, {"authorization": basic("alice", PASSWORD)}),
        ({"api_key": API_KEY}, {"x-api-key": API_KEY}),
        ({"api_key": API_KEY, "api_key_header": "X-Custom-Key"}, {"x-custom-key": API_KEY}),
        (
            {"username": "alice", "password": PASSWORD, "api_key": API_KEY},
            {"authorization": basic("alice", PASSWORD), "x-api-key": API_KEY},
        ),
        ({"api_key": "static-token", "api_key_header": "Authorization"}, {"authorization": "static-token"}),
    ],
    ids=["none", "basic", "api-key", "api-key-custom-header", "api-key+basic", "api-key-as-authorization"],
)
def test_static_auth_sends_exactly_the_configured_headers(service, auth_fields, expected):
    get_once(service.base_url, AuthSettings(**auth_fields))

    assert sent_credentials(service) == expected


@pytest.mark.parametrize("with_api_key", [False, True], ids=["oauth", "oauth+api-key"])
def test_oauth_sends_a_bearer_token_from_the_issuer(service, issuer, oauth, with_api_key):
    extra = {"api_key": API_KEY} if with_api_key else {}

    get_once(service.base_url, oauth_auth(issuer, oauth, **extra))

    headers = sent_credentials(service)
    token = headers.pop("authorization").removeprefix("Bearer ")
    assert oauth.is_valid(token)
    assert headers == ({"x-api-key": API_KEY} if with_api_key else {})


# --- OAuth 2.0 client credentials ---------------------------------------------------------------------


def test_token_endpoint_is_found_by_oidc_discovery(resource, issuer, oauth):
    assert get_once(resource.base_url, oauth_auth(issuer, oauth)).status_code == 200
    assert oauth.token_requests == [DISCOVERED_TOKEN_PATH]


def test_without_discovery_the_keycloak_token_path_is_used(resource, issuer, oauth):
    oauth.discovery = False

    assert get_once(resource.base_url, oauth_auth(issuer, oauth)).status_code == 200
    assert oauth.token_requests == [KEYCLOAK_TOKEN_PATH]


def test_one_token_serves_every_client_of_the_same_issuer_and_client_id(resource, issuer, oauth):
    auth = oauth_auth(issuer, oauth)
    with build_client(ServiceEndpoint("extractor", resource.base_url, auth), TLS) as first:
        assert first.get("/a").status_code == 200
    with build_client(ServiceEndpoint("pseudonymizer", resource.base_url, auth), TLS) as second:
        assert second.get("/b").status_code == 200
    assert len(oauth.token_requests) == 1


def test_token_is_renewed_shortly_before_it_expires(resource, issuer, oauth, monkeypatch):
    oauth.expires_in = 400  # renewed after 370 s (30 s early); the client's clock is moved on instead of waited for
    now = [time.monotonic()]
    monkeypatch.setattr("tasks.clients.auth.clock", lambda: now[0])
    with build_client(ServiceEndpoint("svc", resource.base_url, oauth_auth(issuer, oauth)), TLS) as client:
        assert client.get("/1").status_code == 200
        now[0] += 369
        assert client.get("/2").status_code == 200
        assert len(oauth.token_requests) == 1
        now[0] += 2
        assert client.get("/3").status_code == 200

    assert len(oauth.token_requests) == 2
    assert len(oauth.resource_requests) == 3  # renewed ahead of time, never answered 401


def test_rejected_token_is_replaced_once_and_the_request_sent_again(resource, issuer, oauth):
    with build_client(ServiceEndpoint("svc", resource.base_url, oauth_auth(issuer, oauth)), TLS) as client:
        assert client.get("/before").status_code == 200
        oauth.revoke_all()  # the cached token still looks fresh to the client

        response = client.post("/after", json={"resourceType": "Bundle"})

    assert response.status_code == 200
    assert len(oauth.token_requests) == 2
    assert len(oauth.resource_requests) == 3
    assert [r.status_code for r in response.history] == [401]


def test_a_replayable_body_is_streamed_again_after_a_401_instead_of_being_held_in_memory(resource, issuer, oauth):
    streamed = []

    def body():
        streamed.append(len(streamed) + 1)
        yield b'{"resourceType":'
        yield b'"Bundle"}'

    with build_client(ServiceEndpoint("svc", resource.base_url, oauth_auth(issuer, oauth)), TLS) as client:
        assert client.get("/before").status_code == 200
        oauth.revoke_all()
        response = client.put("/after", content=ReplayableBody(body), headers={"Content-Length": "25"})

    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [401]
    assert streamed == [1, 2]  # once per attempt, never read whole beforehand


def test_a_second_401_after_a_fresh_token_is_reported_not_retried_again(resource, issuer, oauth):
    oauth.expires_in = 0  # every token is dead on arrival at the service
    endpoint = ServiceEndpoint("svc", resource.base_url, oauth_auth(issuer, oauth))
    with ServiceClient(endpoint, TLS, RetrySettings()) as client:
        with pytest.raises(ServiceError) as raised:
            client.request("GET", "/data", deadline=A_MINUTE, operation="read data")

    assert raised.value.status_code == 401 and not raised.value.transient
    assert "invalid or expired token" in raised.value.message
    assert len(oauth.token_requests) == 2
    assert len(oauth.resource_requests) == 2


@pytest.mark.parametrize("status", [401, 200], ids=["401", "error-with-200"])
def test_wrong_client_secret_is_a_terminal_error_that_names_the_client_not_the_secret(resource, issuer, oauth, status):
    """An RFC 6749 error answered 200 (GitHub's token endpoint) went out as authlib's OAuthError, no ServiceError."""
    oauth.errors_with_200 = status == 200
    auth = AuthSettings(
        oauth_issuer_uri=issuer.base_url + REALM_PATH,
        oauth_client_id=oauth.client_id,
        oauth_client_secret="wrong-secret-999",
    )
    with ServiceClient(ServiceEndpoint("svc", resource.base_url, auth), TLS, RetrySettings()) as client:
        with pytest.raises(ServiceError) as raised:
            client.request("GET", "/data", deadline=A_MINUTE, operation="read data")

    error = raised.value
    assert (error.status_code, error.transient, error.service) == (status, False, "oauth")
    assert "invalid_client" in str(error) and oauth.client_id in str(error)
    assert "wrong-secret-999" not in str(error) + repr(error)
    assert len(oauth.token_requests) == 1  # terminal: not retried
    assert oauth.resource_requests == []


# --- secrets stay out of reprs and logs -----------------------------------------------------------------


def test_secrets_appear_in_no_repr_or_log_line(service, issuer, oauth, caplog):
    caplog.set_level(logging.DEBUG)
    secrets = [PASSWORD, API_KEY, oauth.client_secret]
    with LoopbackServer(EchoHandler, EchoState()) as elsewhere:
        clients = [
            build_client(
                ServiceEndpoint(
                    "basic", service.base_url, AuthSettings(username="u", password=PASSWORD, api_key=API_KEY)
                ),
                TLS,
            ),
            build_client(ServiceEndpoint("oauth", service.base_url, oauth_auth(issuer, oauth, api_key=API_KEY)), TLS),
        ]
        for client in clients:
            client.get("/own")
            client.get(elsewhere.base_url + "/foreign")
            client.close()
        issued_tokens = [
            request.headers["authorization"].removeprefix("Bearer ")
            for request in service.state.requests
            if request.headers.get("authorization", "").startswith("Bearer")
        ]

    texts = [repr(client.auth) + str(client.auth) for client in clients] + [caplog.text]
    assert "sending no credentials" in caplog.text
    for secret in secrets + issued_tokens:
        assert all(secret not in text for text in texts), secret


# --- S3: proxy auth on every request, path-style addressing ------------------------------------------------


@pytest.mark.slow
def test_s3_client_sends_proxy_authorization_on_every_request_and_ignores_the_api_key(moto_url, tmp_path):
    with LoopbackServer(EchoHandler, EchoState(upstream=moto_url)) as proxy:
        send = SendSettings(
            send_as="s3_upload",
            auth=AuthSettings(username="proxy-user", password=PASSWORD, api_key=API_KEY),
            s3=S3Settings(
                bucket="research",
                region="eu-central-1",
                access_key_id="AKIDTEST",
                secret_access_key="s3-secret-key",
                endpoint=proxy.base_url,
                use_path_style=True,
            ),
        )
        s3 = make_s3_client(send, TLS, NO_RETRY, tmp_path / "ca.pem")
        s3.create_bucket(Bucket="research", CreateBucketConfiguration={"LocationConstraint": "eu-central-1"})
        s3.put_object(Bucket="research", Key="job-1/core.ndjson", Body=b'{"resourceType":"Patient"}\n')
        body = s3.get_object(Bucket="research", Key="job-1/core.ndjson")["Body"].read()

        requests = proxy.state.requests

    assert body == b'{"resourceType":"Patient"}\n'
    assert len(requests) == 3
    assert all(r.headers.get("proxy-authorization") == basic("proxy-user", PASSWORD) for r in requests)
    assert all("x-api-key" not in r.headers for r in requests)
    assert [r.path.split("?")[0] for r in requests[1:]] == ["/research/job-1/core.ndjson"] * 2  # path-style
    assert all(r.headers["host"] == f"127.0.0.1:{proxy.port}" for r in requests)


@pytest.mark.slow
def test_s3_client_without_auth_sends_no_proxy_authorization(moto_url, tmp_path):
    with LoopbackServer(EchoHandler, EchoState(upstream=moto_url)) as proxy:
        send = SendSettings(
            s3=S3Settings(
                bucket="plain",
                region="us-east-1",
                access_key_id="AKIDTEST",
                secret_access_key="s3-secret-key",
                endpoint=proxy.base_url,
                use_path_style=True,
            )
        )
        make_s3_client(send, TLS, NO_RETRY, tmp_path / "ca.pem").create_bucket(Bucket="plain")

        (request,) = proxy.state.requests

    assert request.path == "/plain"
    assert "proxy-authorization" not in request.headers
