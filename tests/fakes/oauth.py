"""An OAuth 2.0 authorization server (client credentials only) and a resource server that checks its tokens.

``OAuthHandler`` serves an issuer at ``/realms/dupflow``:

- ``GET {issuer}/.well-known/openid-configuration`` names the token endpoint ``/oauth2/token`` (a path only
  discovery can find); with ``discovery`` off it answers 404;
- ``POST /oauth2/token`` and ``POST {issuer}/protocol/openid-connect/token`` (Keycloak's layout, the
  fallback) accept ``grant_type=client_credentials`` with the client id and secret in the form
  (client_secret_post) or in Basic auth (client_secret_basic); a wrong secret gets 401 ``invalid_client`` (200
  with ``errors_with_200``, as GitHub's token endpoint answers).

Access tokens are opaque random strings that expire ``expires_in`` seconds after issue (a float, so tests can
use short lifetimes). ``ResourceHandler`` shares the same ``OAuthState`` and answers 200 only for a currently
valid ``Authorization: Bearer`` token, 401 otherwise; ``revoke_all`` makes every issued token invalid.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

from tests.fakes._server import LengthOnlyHandler, serve_forever_cli

REALM_PATH = "/realms/dupflow"
DISCOVERED_TOKEN_PATH = "/oauth2/token"
KEYCLOAK_TOKEN_PATH = f"{REALM_PATH}/protocol/openid-connect/token"


@dataclass
class OAuthState:
    # Unique per state: the clients cache a token per (issuer, client id, secret) for the whole process, and an
    # issuer of a later test may get an earlier one's port.
    client_id: str = field(default_factory=lambda: f"dupflow-client-{secrets.token_hex(4)}")
    client_secret: str = "token-secret-123"
    expires_in: float = 300.0
    discovery: bool = True
    token_requests: list[str] = field(default_factory=list)  # path of every token request
    unavailable_next: int = 0  # answer that many next token requests with 503 (a brief outage)
    errors_with_200: bool = False
    resource_requests: list[dict[str, str]] = field(default_factory=list)  # headers, lower-case names
    _issued: dict[str, float] = field(default_factory=dict)  # token -> monotonic expiry
    lock: threading.Lock = field(default_factory=threading.Lock)

    def issue_token(self) -> str:
        token = secrets.token_urlsafe(24)
        with self.lock:
            self._issued[token] = time.monotonic() + self.expires_in
        return token

    def is_valid(self, token: str) -> bool:
        with self.lock:
            return self._issued.get(token, 0.0) > time.monotonic()

    def revoke_all(self) -> None:
        with self.lock:
            self._issued.clear()


class _JsonHandler(LengthOnlyHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class OAuthHandler(_JsonHandler):
    def do_GET(self) -> None:
        state: OAuthState = self.server.state
        if self.path == f"{REALM_PATH}/.well-known/openid-configuration" and state.discovery:
            issuer = f"http://{self.headers['Host']}{REALM_PATH}"
            self._send_json(
                200,
                {
                    "issuer": issuer,
                    "token_endpoint": f"http://{self.headers['Host']}{DISCOVERED_TOKEN_PATH}",
                    "grant_types_supported": ["client_credentials"],
                },
            )
        else:
            self._send_json(404, {"error": "not_found"})

    def do_POST(self) -> None:
        state: OAuthState = self.server.state
        form = {name: values[0] for name, values in parse_qs(self._read_body().decode()).items()}
        if self.path not in (DISCOVERED_TOKEN_PATH, KEYCLOAK_TOKEN_PATH):
            self._send_json(404, {"error": "not_found"})
            return
        with state.lock:
            state.token_requests.append(self.path)
            unavailable, state.unavailable_next = state.unavailable_next > 0, max(0, state.unavailable_next - 1)
        if unavailable:
            self._send_json(503, {"error": "temporarily_unavailable"})
        elif form.get("grant_type") != "client_credentials":
            self._send_json(400, {"error": "unsupported_grant_type"})
        elif self._client_credentials(form) != (state.client_id, state.client_secret):
            self._send_json(
                200 if state.errors_with_200 else 401,
                {"error": "invalid_client", "error_description": "Invalid client credentials"},
                {"WWW-Authenticate": 'Basic realm="dupflow"'},
            )
        else:
            self._send_json(
                200, {"access_token": state.issue_token(), "token_type": "Bearer", "expires_in": state.expires_in}
            )

    def _client_credentials(self, form: dict[str, str]) -> tuple[str | None, str | None]:
        authorization = self.headers.get("Authorization", "")
        if authorization.startswith("Basic "):
            client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
            return unquote(client_id), unquote(secret)
        return form.get("client_id"), form.get("client_secret")


class ResourceHandler(_JsonHandler):
    """A protected resource: 200 with the path for a valid bearer token, 401 for none, unknown or expired."""

    def _handle(self) -> None:
        state: OAuthState = self.server.state
        self._read_body()
        with state.lock:
            state.resource_requests.append({name.lower(): value for name, value in self.headers.items()})
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and state.is_valid(token):
            self._send_json(200, {"ok": True, "path": self.path})
        else:
            self._send_json(
                401,
                {
                    "resourceType": "OperationOutcome",
                    "issue": [{"severity": "error", "code": "login", "diagnostics": "invalid or expired token"}],
                },
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )

    do_GET = do_POST = do_PUT = _handle


if __name__ == "__main__":
    serve_forever_cli(OAuthHandler, OAuthState(), f"OAuth 2.0 issuer at {REALM_PATH}")
