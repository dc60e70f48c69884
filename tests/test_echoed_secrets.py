"""Issue 51, item 17: a secret beyond ASCII comes back from a service in forms other than its own. httpx sends it as
UTF-8 (the Base64 of a Basic password's, a query value's percent escapes); a server reading those bytes as Latin-1
quotes ``KennwÃ¶rt`` for ``Kennwört``, one echoing the request line may write the escapes in lower case. Every such
form of every registered secret is redacted. (A header secret that is not ASCII is refused at load:
tests/test_config_errors.py.)"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

import pytest

from config.loader import load_settings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.core.redaction import redact, register_secret
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import operation_outcome
from tests.support.deadlines import A_MINUTE

NO_RETRY = RetrySettings(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0)


def misread(secret: str) -> list[str]:
    """The forms a server reading UTF-8 as Latin-1 or Windows-1252 writes, and percent escapes in lower case."""
    data = secret.encode()
    escaped = "".join(f"%{byte:02x}" if byte > 0x7E or chr(byte) in " %&+/:=?#" else chr(byte) for byte in data)
    windows = [data.decode("cp1252")] if all(byte not in data for byte in b"\x81\x8d\x8f\x90\x9d") else []
    return [data.decode("latin-1"), *windows, escaped, json.dumps(data.decode("latin-1"))[1:-1]]


@pytest.mark.parametrize(
    "secret", ["Kennw\u00f6rt-\u20ac-2026-1a7f", "Gr\u00fc\u00dfe-aus-K\u00f6ln 2026", "\u9375-key-3c9d"]
)
def test_every_misread_form_of_a_registered_secret_is_redacted(secret):
    register_secret(secret)
    for form in misread(secret):
        assert form != secret
        assert redact(f"you sent '{form}'") == "you sent '***'", form


class Latin1QuotingHandler(BaseHTTPRequestHandler):
    """A server that refuses every request with 401 and quotes what it got as it read it: the Basic password decoded
    as Latin-1 (as servers do by RFC 7617's default), the query's values too, and the request line as sent with its
    escapes in lower case, as some logs write them."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        basic = self.headers.get("Authorization", "").removeprefix("Basic ")
        password = base64.b64decode(basic).decode("latin-1").partition(":")[2] if basic else ""
        query = urlsplit(self.path).query
        values = [unquote_to_bytes(pair.partition("=")[2]).decode("latin-1") for pair in query.split("&") if pair]
        lower = "%".join(part[:2].lower() + part[2:] if i else part for i, part in enumerate(self.path.split("%")))
        said = f"wrong password '{password}' or key {values} in GET {lower}"
        body = operation_outcome(said)
        self.send_response(401)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def quoting() -> Iterator[LoopbackServer]:
    with LoopbackServer(Latin1QuotingHandler, None) as server:
        yield server


def configured(tmp_path: Path, base_url: str, env: dict[str, str]):
    """The extractor's settings (Basic auth from ${PW}, a key in the URL's query from ${KEY}) loaded as a job does:
    its secrets registered with the redaction."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "pipeline: {enabled_steps: [extractor]}\nservices:\n  extractor:\n"
        f"    base_url: {base_url}/base?key=${{KEY}}\n    auth: {{username: dupflow, password: '${{PW}}'}}\n",
        encoding="utf-8",
    )
    return load_settings(path, env=env).settings.services.extractor


def test_a_non_ascii_password_and_query_key_quoted_back_as_latin_1_reach_no_error_text(quoting, tmp_path):
    password, key = "Kennw\u00f6rt-\u20ac-echo-5b2e", "Schl\u00fcssel-echo-8c41"
    extractor = configured(tmp_path, quoting.base_url, {"PW": password, "KEY": key})
    endpoint = ServiceEndpoint("extractor", extractor.base_url, extractor.auth)

    with ServiceClient(endpoint, TlsSettings(), NO_RETRY) as client, pytest.raises(ServiceError) as refused:
        client.request("GET", "/fhir/metadata", deadline=A_MINUTE, operation="probe")

    texts = [str(refused.value), repr(refused.value), refused.value.message]
    assert "HTTP 401" in texts[0] and "wrong password '***' or key ['***" in texts[0]
    assert "in GET /base/fhir/metadata?key=***" in texts[0]  # the path joins the URL before its query
    for secret in (password, key):
        for form in [secret, *misread(secret)]:
            assert not any(form in text for text in texts), form
