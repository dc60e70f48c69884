"""Credentials for outgoing calls, scoped to the configured service URL's origin.

See docs/development.md#service-clients.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import ssl
import threading
import time
import warnings
from collections.abc import Generator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import httpx

from tasks.clients.bounds import CappedBody, Deadline, UnreadBody, within_deadlines
from tasks.clients.errors import (
    MAX_TEXT_CHARS,
    ServiceError,
    is_transient_status,
    json_or_none,
    SERVICE_SETTING,
)
from tasks.core.json_shapes import JsonObject, as_object

from tasks.core.names import show_name
from tasks.core.readable import plain_text, size_text, truncate
from tasks.core.redaction import register_secret
from tasks.core.url_credentials import CredentialsInUrlError, refuse_credentials_in_url, shown_url

if TYPE_CHECKING:
    from authlib.integrations.httpx_client import OAuth2Client

    from config.services import AuthSettings

log = logging.getLogger("dupflow.clients")

CREDENTIAL_HEADERS = ("Authorization", "Proxy-Authorization")
TOKEN_REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
TOKEN_DEADLINE = timedelta(seconds=60)  # discovery and the token request in all
TOKEN_DEADLINE_SETTING = "TOKEN_DEADLINE of tasks/clients/auth.py, 60 s"
MAX_RENEWAL_LEEWAY_SECONDS = 30.0
MAX_OAUTH_ANSWER_BYTES = 1024 * 1024
"""The most of a discovery document or a token answer that is read (either is a few KB)."""
OAUTH_FIX = "check oauth_issuer_uri and the identity provider's configuration"
UNCOMPRESSED_FIX = f"{OAUTH_FIX} (it must not compress its answers to this client)"


def oauth2_client_class() -> type[OAuth2Client]:
    """Import authlib's OAuth client on first use.

    Why: else it costs every command about 0.1 s.
    """
    # installs authlib's "always" filter first, so ours below wins
    import authlib.deprecate  # noqa: F401

    # authlib 1.9 announces a move of its httpx integration to the httpx2 package; the httpx one is
    # what we use.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The httpx module is deprecated")
        from authlib.integrations.httpx_client import OAuth2Client
    client_class: type[Any] = OAuth2Client
    return client_class


_DEFAULT_PORTS = {"http": 80, "https": 443}
AS_SENT = {"Accept-Encoding": "identity"}
"""Every client asks for answers as sent: httpx decodes a compressed piece whole, before any bound
can count it."""


def refuse_compressed(service: str, fix: str, response: httpx.Response) -> None:
    """Response event hook: an answer compressed despite ``AS_SENT`` is terminal.

    Why: a 16 KB zstd answer can unfold to gigabytes in one piece.
    """
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        message = (
            f"the answer from {shown_url(str(response.url))} came compressed (Content-Encoding "
            f"{show_name(encoding)}) although dupflow asked for none (Accept-Encoding: identity); "
            f"{fix}"
        )
        operation = f"{response.request.method} {shown_url(str(response.request.url))}"
        raise ServiceError(operation, response.status_code, message, service=service)


class Origin(NamedTuple):
    """Where credentials may go; shown as ``scheme://host:port``."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def origin_of(url: httpx.URL | str) -> Origin:
    """Return (scheme, host, port) with the default port filled in.

    Why: https://h and https://h:443 are one origin.
    """
    url = httpx.URL(url)
    return Origin(url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme, 0))


# the monotonic clock that token lifetimes are measured on; one name, so a test can move it on
clock = time.monotonic


class TokenSource:
    """Client-credentials tokens of one (issuer, client id), cached and renewed.

    Note: thread-safe.
    Why: the secret goes in the form body (client_secret_post), so a discovered endpoint must be as
    safe as the issuer (``_checked_endpoint``).
    """

    def __init__(
        self,
        issuer: str,
        client_id: str,
        client_secret: str,
        verify: ssl.SSLContext | bool,
        deadline: timedelta = TOKEN_DEADLINE,
    ):
        self.issuer, self.client_id = issuer.rstrip("/"), client_id
        self._client_secret, self._verify, self._deadline = client_secret, verify, deadline
        self._token_endpoint: str | None = None
        self._token: str | None = None
        # clock() after which the token is renewed; None: until rejected
        self._renew_at: float | None = None
        self._lock = threading.Lock()

    def access_token(self, *, rejected: str | None = None, setting: str | None = None) -> str:
        """Return a valid access token; pass one a service just rejected for a fresh one.

        Note: or the replacement another caller already fetched: one renewal per rejection, however
        many 401s. ``setting`` (the issuer's key) is named should nothing answer at the issuer.
        """
        with self._lock:
            due = self._renew_at is not None and clock() >= self._renew_at
            if self._token is None or due or self._token == rejected:
                self._token, self._renew_at = self._fetch(setting)
            return self._token

    def _fetch(self, setting: str | None) -> tuple[str, float | None]:
        """Discover the endpoint (once) and request a token, within the source's deadline.

        Why: the calling request's deadline cannot cut off this other client, and the lock keeps
        other callers waiting.
        """
        deadline = Deadline(self._deadline, TOKEN_DEADLINE_SETTING, self.issuer)
        try:
            with (
                deadline.bounding(),
                within_deadlines(
                    oauth2_client_class()(
                        client_id=self.client_id,
                        client_secret=self._client_secret,
                        token_endpoint_auth_method="client_secret_post",
                        verify=self._verify,
                        timeout=TOKEN_REQUEST_TIMEOUT,
                        headers=AS_SENT,
                        event_hooks={
                            "request": [functools.partial(self._name_issuer_setting, setting)],
                            "response": [
                                functools.partial(refuse_compressed, "oauth", UNCOMPRESSED_FIX),
                                self._bounded,
                            ],
                        },
                    )
                ) as client,
            ):
                client.register_compliance_hook(
                    "access_token_response", self._raise_for_token_error
                )
                endpoint = self._token_endpoint or self._discover_token_endpoint(client)
                token = client.fetch_token(endpoint, grant_type="client_credentials")
        except httpx.TransportError:
            deadline.check("fetch OAuth token", "oauth")
            raise
        # authlib: an answer that is no JSON object (a proxy's login page)
        except ValueError as exc:
            message = f"the token endpoint's answer is no token ({plain_text(exc)}); {OAUTH_FIX}"
            raise self._refused(message) from None
        self._token_endpoint = endpoint
        log.debug("fetched an OAuth access token for client %s from %s", self.client_id, endpoint)
        return self._cached(token)

    def _name_issuer_setting(self, setting: str | None, request: httpx.Request) -> None:
        """Name ``setting`` on a token request to the issuer's origin."""
        if setting and origin_of(request.url) == origin_of(self.issuer):
            request.extensions[SERVICE_SETTING] = setting

    def _cached(self, token: JsonObject) -> tuple[str, float | None]:
        """Return the access token and when it is renewed.

        Note: a quarter of its lifetime early, at most 30 s; one without ``expires_in`` is used
        until the service rejects it.
        """
        if not isinstance(access_token := token.get("access_token"), str) or not access_token:
            raise self._refused(f"the token endpoint's answer has no access_token; {OAUTH_FIX}")
        register_secret(access_token)
        expires_in = token.get("expires_in")
        if not isinstance(expires_in, (int, float)) or expires_in <= 0:
            return access_token, None
        return access_token, clock() + expires_in - min(MAX_RENEWAL_LEEWAY_SECONDS, expires_in / 4)

    def _discover_token_endpoint(self, client: OAuth2Client) -> str:
        document = None
        with contextlib.suppress(httpx.HTTPError):
            response = client.request(
                "GET", f"{self.issuer}/.well-known/openid-configuration", withhold_token=True
            )
            if response.status_code == 200:
                document = json_or_none(response.content)
        endpoint = as_object(document).get("token_endpoint")
        if isinstance(endpoint, str) and endpoint:
            return self._checked_endpoint(endpoint)
        fallback = f"{self.issuer}/protocol/openid-connect/token"
        log.info("OIDC discovery failed for issuer %s; using %s", self.issuer, fallback)
        return fallback

    def _checked_endpoint(self, endpoint: str) -> str:
        """Return a discovered token endpoint if the secret may be sent to it.

        Note: without user info, and https when the issuer is.
        Why: another origin is allowed (Google's issuer names oauth2.googleapis.com): the issuer
        vouches for it.
        """
        door = (
            "the token_endpoint named by the discovery document of oauth_issuer_uri "
            f"{shown_url(self.issuer)}"
        )
        try:
            refuse_credentials_in_url(endpoint, door=door, fix=OAUTH_FIX)
        except CredentialsInUrlError as exc:
            raise self._refused(str(exc)) from None
        if urlsplit(self.issuer).scheme == "https" and urlsplit(endpoint).scheme != "https":
            raise self._refused(
                f"{door} is {shown_url(endpoint)}, which is not https: the client secret would be "
                f"sent in clear text; {OAUTH_FIX} (its token endpoint must be https)"
            )
        return endpoint

    def _bounded(self, response: httpx.Response) -> None:
        """Read a token answer as sent, at most ``MAX_OAUTH_ANSWER_BYTES`` (response hook)."""
        source, limit = shown_url(str(response.url)), size_text(MAX_OAUTH_ANSWER_BYTES)
        message = (
            f"the answer from {source} is more than the {limit} read from an identity provider; "
            f"{OAUTH_FIX}"
        )
        assert isinstance(response.stream, httpx.SyncByteStream), (
            "the token client (authlib's OAuth2Client) is sync"
        )
        response.stream = CappedBody(
            response.stream, MAX_OAUTH_ANSWER_BYTES, lambda: self._refused(message)
        )

    def _refused(self, message: str) -> ServiceError:
        return ServiceError("fetch OAuth token", None, message, service="oauth")

    def _raise_for_token_error(self, response: httpx.Response) -> httpx.Response:
        """Raise a non-2xx or error token response as a ServiceError, never with the body.

        Note: authlib's compliance hook; some (GitHub's) answer an RFC 6749 error with 200.
        """
        body = as_object(json_or_none(response.content))
        if not response.is_error and "error" not in body:
            return response
        if isinstance(error := body.get("error"), str):  # RFC 6749
            description = body.get("error_description")
            text = truncate(
                f"{error}: {description}" if isinstance(description, str) else error, MAX_TEXT_CHARS
            )
        else:
            text = f"HTTP {response.status_code} {response.reason_phrase}"
        raise ServiceError(
            "fetch OAuth token",
            response.status_code,
            f"issuer {self.issuer}, client {self.client_id}: {text}",
            transient=is_transient_status(response.status_code),
            service="oauth",
        )


_token_sources: dict[tuple[str, str, str], TokenSource] = {}
_token_sources_lock = threading.Lock()


def token_source_for(auth: AuthSettings, verify: ssl.SSLContext | bool) -> TokenSource:
    """Return the process-wide token source of this issuer and client id.

    Note: a changed secret gets its own.
    """
    issuer, client_id, client_secret = (
        auth.oauth_issuer_uri,
        auth.oauth_client_id,
        auth.oauth_client_secret,
    )
    # AuthSettings refuses an OAuth block without all three (a blank key is None)
    assert issuer and client_id and client_secret
    secret = client_secret.get_secret_value()
    key = (issuer.rstrip("/"), client_id, hashlib.sha256(secret.encode()).hexdigest())
    with _token_sources_lock:
        return _token_sources.setdefault(key, TokenSource(issuer, client_id, secret, verify))


class ServiceAuth(httpx.Auth):
    """Scoped credentials of one service; see the module docstring."""

    def __init__(
        self,
        service: str,
        base_url: str,
        auth: AuthSettings | None,
        verify: ssl.SSLContext | bool,
        setting: str | None,
    ):
        """Scope ``auth`` to ``base_url``'s origin; errors name its key ``setting``."""
        self.service, self.origin, self._setting = service, origin_of(base_url), setting
        self._issuer_setting = (
            f"{setting.rpartition('.')[0]}.auth.oauth_issuer_uri" if setting else None
        )
        self._tokens: TokenSource | None = None
        self._headers: dict[str, str] = {}  # Basic's Authorization, then the API key's header
        if auth is not None:
            if auth.uses_oauth:
                self._tokens = token_source_for(auth, verify)
            elif (credentials := auth.basic_header_token) is not None:
                self._headers["Authorization"] = "Basic " + credentials
            if auth.api_key is not None:
                self._headers[auth.api_key_header] = auth.api_key.get_secret_value()
        self.sends_credentials = bool(self._tokens or self._headers)
        # a token in the configured URL's query, a credential too
        self._query = httpx.URL(base_url).params
        self._withheld_origins: set[Origin] = set()
        self._trusted_origins: set[Origin] = {self.origin}

    def trust(self, origin: Origin) -> None:
        """Send the credentials to ``origin`` as well (one the configuration approved)."""
        self._trusted_origins.add(origin)

    def sync_auth_flow(
        self, request: httpx.Request
    ) -> Generator[httpx.Request, httpx.Response, None]:
        renewed = False
        rejected: str | None = None
        visited = {request.url}
        while True:
            token = self._scope_credentials(request, rejected)
            response = yield request
            assert isinstance(response.stream, httpx.SyncByteStream), "every client is sync"
            if token is not None and response.status_code == 401 and not renewed:
                log.info("%s answered 401; retrying once with a fresh OAuth token", self.service)
                renewed, rejected = True, token
                response.stream = UnreadBody(response.stream)
                continue
            rejected = None
            if response.next_request is None:
                return
            request = response.next_request
            self._check_hop(response, request.url, visited)
            visited.add(request.url)
            response.stream = UnreadBody(response.stream)

    def _check_hop(
        self, response: httpx.Response, location: httpx.URL, visited: set[httpx.URL]
    ) -> None:
        """Refuse a loop, a Location with user info, and redirecting a request with a body.

        Why: the body is patient data or a CRTDL: a 301/302/303 would drop it, a 307/308 may hand
        the data to another server.
        """
        source, target = shown_url(str(response.request.url)), shown_url(str(location))
        if response.request.method not in ("GET", "HEAD"):
            raise self._refused_hop(
                response,
                f"the server redirects to {target}; a request with a body is not sent on to "
                "another address: set the service's URL in the configuration to the address it "
                "redirects to",
            )
        door = f"the Location header of {response.request.method} {source}"
        fix = (
            "the server redirects there; fix its configuration so that its redirects carry no "
            "credentials"
        )
        try:
            refuse_credentials_in_url(str(location), door=door, fix=fix)
        except CredentialsInUrlError as exc:
            raise self._refused_hop(response, str(exc)) from None
        if location in visited:
            where = (
                f"{source} redirects to itself"
                if source == target
                else f"{source} redirects back to {target}"
            )
            raise self._refused_hop(
                response, f"redirect loop: {where}; check the URL and the server's configuration"
            )

    def _refused_hop(self, response: httpx.Response, message: str) -> ServiceError:
        """The terminal error of a redirect that is not followed."""
        operation = f"{response.request.method} {shown_url(str(response.request.url))}"
        return ServiceError(operation, response.status_code, message, service=self.service)

    def check_request(self, request: httpx.Request) -> None:
        """Strip credentials bound for another origin; name the URL's key on the service's.

        Note: a request event hook; the key is ``SERVICE_SETTING``.
        Why: the one check, on every request sent, including hops httpx follows by itself when a
        caller passes ``follow_redirects=True`` (httpx would keep the API key header on those).
        """
        origin = origin_of(request.url)
        if origin not in self._trusted_origins:
            for name in [*CREDENTIAL_HEADERS, *self._headers]:
                request.headers.pop(name, None)
            if self.sends_credentials and origin not in self._withheld_origins:
                self._withheld_origins.add(origin)
                log.info(
                    "%s: sending no credentials to %s (not the service origin %s)",
                    self.service,
                    origin,
                    self.origin,
                )
        if self._setting is not None and origin == self.origin:
            request.extensions[SERVICE_SETTING] = self._setting
        else:
            # httpx hands a request's extensions on to its redirect
            request.extensions.pop(SERVICE_SETTING, None)

    def _scope_credentials(self, request: httpx.Request, rejected: str | None) -> str | None:
        """Attach credentials for the service's origin (``check_request`` strips others).

        Note: returns the bearer token used.
        """
        if origin_of(request.url) not in self._trusted_origins:
            return None
        token = None
        if self._tokens is not None:
            token = self._tokens.access_token(rejected=rejected, setting=self._issuer_setting)
            request.headers["Authorization"] = f"Bearer {token}"
        request.headers.update(self._headers)
        if self._query:
            request.url = request.url.copy_merge_params(self._query)
        return token
