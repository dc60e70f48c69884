"""Hostile servers, files and configurations (issue 15): each test fails without its fix.

Every hostile peer is a real server on 127.0.0.1 or a real file in tmp_path. The tests check a clear error,
nothing half-written left or taken as finished, and no secret in what leaves the client.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import sys
import threading
import time
import tracemalloc
import unicodedata
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from config.errors import ConfigError
from config.fields import env_var_name
from config.loader import load_settings, refuse_secret_overrides
from config.settings import RetrySettings, TlsSettings
from tasks.clients.downloads import DownloadError, download_ndjson, safe_file_name, target_names
from tasks.clients.errors import ServiceError
from tasks.core.redaction import redact, register_secret
from tasks.core.url_credentials import CredentialsInUrlError, refuse_credentials_in_url, shown_url
from tasks.clients.http import ServiceClient, ServiceEndpoint, build_client
from tasks.clients.pseudonymizer import Pseudonymizer
from tasks.core.errors import JobError
from tasks.core.jsonfile import read_json_file, read_settings_file
from tasks.job.layout import JobPaths
from tasks.job.record import MAX_RECORD_BYTES
from tasks.streams.ndjson import NdjsonError
from deployments.automations.apply import main as apply_automations
from deployments.serve import main as serve
from flows.job_card import markdown_list, one_line_text
from flows.job_state import LOCK_FILE, job_lock, JobLockedError
from flows.jobs import existing_job, prepare_job
from flows.run import EXIT_USAGE, main
from tests.conftest import run_cli
from tests.fakes._server import LoopbackServer
from tests.support.filesystem import unwritable
from tests.support.jobs import put_flow_run
from tests.support.deadlines import A_MINUTE
from tests.fakes.echo import EchoHandler, EchoState, Reply, operation_outcome

MB = 1024 * 1024
NO_RETRY = RetrySettings(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0)
QUICK_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=0, max_backoff_ms=0)
TLS = TlsSettings()
PASSWORD = "pw-Echoed-7f3a9"
API_KEY = "key-Echoed-2b8c1"
CLIENT_SECRET = "cs-Echoed-5d0e4"


@pytest.fixture
def echo() -> Iterator[LoopbackServer]:
    with LoopbackServer(EchoHandler, EchoState()) as server:
        yield server


def resource_lines(count: int) -> bytes:
    return b"".join(b'{"resourceType":"Observation","id":"o%d","status":"final"}\n' % i for i in range(count))


# --- 1. secrets a service echoes back -------------------------------------------------------------------


def secret_config(tmp_path: Path, base_url: str, auth: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"pipeline: {{enabled_steps: [extractor]}}\nservices:\n  extractor:\n    base_url: {base_url}\n"
        f"    auth:\n{auth}",
        encoding="utf-8",
    )
    return path


def test_secrets_echoed_in_errors_and_retry_logs_are_redacted(echo, tmp_path, caplog) -> None:
    auth = "      username: dupflow\n      password: ${PW}\n      api_key: ${KEY}\n"
    settings = load_settings(secret_config(tmp_path, echo.base_url, auth), env={"PW": PASSWORD, "KEY": API_KEY})
    token = base64.b64encode(f"dupflow:{PASSWORD}".encode()).decode()
    echoed = operation_outcome(
        f"Authorization: Basic {token}",
        f"x-api-key: {API_KEY} rejected",
        f"form body username=dupflow&password={PASSWORD}",
    )
    echo.state.replies.extend([Reply(500, body=echoed), Reply(401, body=echoed)])
    endpoint = ServiceEndpoint("extractor", echo.base_url, settings.settings.services.extractor.auth)

    caplog.set_level(logging.INFO)
    with ServiceClient(endpoint, TLS, QUICK_RETRY) as client, pytest.raises(ServiceError) as error:
        client.request("GET", "/fhir/__status/x", deadline=A_MINUTE, operation="poll")

    assert echo.state.requests[0].headers["x-api-key"] == API_KEY  # the secrets did go to the service
    texts = [str(error.value), repr(error.value), error.value.message, caplog.text]
    for secret in (PASSWORD, API_KEY, token):
        assert not any(secret in text for text in texts), secret
    assert "HTTP 401" in str(error.value) and "***" in str(error.value)


def test_an_oauth_error_description_quoting_the_client_secret_is_redacted(echo, tmp_path) -> None:
    auth = (
        f"      oauth_issuer_uri: {echo.base_url}/realms/x\n      oauth_client_id: dupflow\n"
        "      oauth_client_secret: ${SECRET}\n"
    )
    settings = load_settings(secret_config(tmp_path, echo.base_url, auth), env={"SECRET": CLIENT_SECRET})
    description = f"bad credentials: client_secret={CLIENT_SECRET}"
    echo.state.replies.extend(
        [Reply(404), Reply(401, body=b'{"error":"invalid_client","error_description":"%s"}' % description.encode())]
    )
    endpoint = ServiceEndpoint("extractor", echo.base_url, settings.settings.services.extractor.auth)

    with ServiceClient(endpoint, TLS, NO_RETRY) as client, pytest.raises(ServiceError) as error:
        client.request("GET", "/fhir/metadata", deadline=A_MINUTE, operation="probe")

    assert "invalid_client" in str(error.value)
    assert CLIENT_SECRET not in str(error.value) and CLIENT_SECRET not in repr(error.value)


def test_redaction_removes_tokens_but_leaves_prose_alone() -> None:
    register_secret("registered-Secret-1")
    text = redact(
        'got "Authorization": "Bearer eyJhbGciOi.J9x" and Bearer abc123DEF456ghi and registered-Secret-1 '
        "at https://user:pass@host/x; Basic Auth needs username and password"
    )
    assert "eyJhbGciOi" not in text and "abc123DEF456ghi" not in text and "registered-Secret-1" not in text
    assert "user:pass" not in text
    assert "Basic Auth needs username and password" in text


def test_a_secret_in_overrides_is_refused_naming_key_and_the_way_to_give_it() -> None:
    with pytest.raises(ConfigError) as error:
        refuse_secret_overrides(
            {"retry.max_attempts": "3", "services.send.s3.secret_access_key": "sk-123"},
            "the deployment's overrides parameter",
        )
    (problem,) = error.value.problems
    assert problem.startswith("services.send.s3.secret_access_key")
    assert "the deployment's overrides parameter" in problem and "APP_SERVICES_SEND_S3_SECRET_ACCESS_KEY" in problem
    assert "${VAR}" in problem and "sk-123" not in str(error.value)


@pytest.mark.parametrize("token", ["access_token", "X-Amz-Signature", "sig"])
def test_a_url_with_a_token_in_its_query_in_overrides_is_refused_naming_key_and_the_way_to_give_it(token) -> None:
    """Overrides are stored with the job (job.json, the flow run's parameters) and a token in a URL's query is a
    credential (an OAuth token, a signed URL's signature): a service URL given with --set kept it there."""
    url = f"https://fhir.example/fhir?_format=json&{token}=tok-Sekr3t-in-query"
    with pytest.raises(ConfigError) as error:
        refuse_secret_overrides({"services.send.url": url, "retry.max_attempts": "3"}, "--set")
    (problem,) = error.value.problems
    assert problem.startswith("services.send.url (in --set): the URL https://fhir.example/fhir carries a secret")
    assert "configuration file" in problem and "APP_SERVICES_SEND_URL" in problem
    assert "tok-Sekr3t-in-query" not in str(error.value)
    refuse_secret_overrides({"services.send.url": "https://fhir.example/fhir?_format=json"}, "--set")  # no token


# --- 2. a password in a URL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "yaml_block"),
    [
        ("services.extractor.base_url", "services: {extractor: {base_url: 'http://user:pw-in-url@torch:8080'}}"),
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'https://:pw-in-url@pseudo'}}"),
        (
            "services.send.auth.oauth_issuer_uri",
            "services: {send: {auth: {oauth_issuer_uri: 'https://a:pw-in-url@kc/realms/x'}}}",
        ),
        ("services.extractor.base_url", "services: {extractor: {base_url: 'https://bob:q[pw-in-url]@torch'}}"),
        ("services.extractor.base_url", "services: {extractor: {base_url: 'https://b:q[x@torch?token=pw-in-url'}}"),
        # a /, # or ? in the password ends the host for urlsplit, which then finds no @ in it
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'http://r:Gx7/pw-in-url@127.0.0.1:1'}}"),
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'http://r:pw-in-url#x@127.0.0.1:1'}}"),
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'http://r:pw-in-url?x@127.0.0.1:1/p'}}"),
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'r:pw-in-url@localhost:1'}}"),  # no scheme
        # a slash too few or too many: "is not an http(s) URL with a host" quoted the whole text, password and all
        ("services.pseudonymizer.url", "services: {pseudonymizer: {url: 'http:/r:pw-in-url@localhost:1'}}"),
        ("services.send.url", "services: {send: {url: 'https:///r:pw-in-url@fhir/fhir'}}"),
    ],
)
def test_a_password_in_a_url_is_refused_without_repeating_it(tmp_path, key, yaml_block) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"pipeline: {{enabled_steps: [local_import]}}\n{yaml_block}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    assert any(p.startswith(f"{key}: the URL") and "auth block" in p for p in error.value.problems), error.value
    assert "pw-in-url" not in str(error.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://r:Gx7/pw-in-url@127.0.0.1:1/x", "http://127.0.0.1:1/x"),
        ("http://r:pw-in-url#x@h", "http://h"),
        ("http://r:pw-in-url?x@h/p", "http://h/p"),
        ("http://r:2024?pw-in-url@torch.example/fhir", "http://torch.example/fhir"),  # digits, then a ?
    ],
)
def test_the_url_rule_refuses_user_info_that_urlsplit_does_not_see_and_shows_none_of_it(url, shown) -> None:
    with pytest.raises(CredentialsInUrlError) as refused:
        refuse_credentials_in_url(url, door="job input", fix="fix")
    assert str(refused.value).startswith(f"job input: the URL {shown} carries a user name or password")
    assert shown_url(url) == shown and "pw-in-url" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("//r:pw-in-url@127.0.0.1:1/x.ndjson", "127.0.0.1:1/x.ndjson"),
        ("//:pw-in-url@h", "h"),
        ("http:/r:pw-in-url@h/x.ndjson", "http:///h/x.ndjson"),  # a slash too few
        ("https:///r:pw-in-url@h/x.ndjson", "https:///h/x.ndjson"),  # one too many
    ],
)
def test_a_url_without_its_scheme_is_refused_for_user_info_as_one_with_it(url, shown) -> None:
    """A network-path reference (``//host/path``, RFC 3986 4.2) has its user info after the ``//`` as an http URL
    has: httpx reads it so."""
    with pytest.raises(CredentialsInUrlError) as refused:
        refuse_credentials_in_url(url, door="job input", fix="fix")
    assert str(refused.value).startswith(f"job input: the URL {shown} carries a user name or password")
    assert "pw-in-url" not in str(refused.value)


@pytest.mark.parametrize(
    "steps", [["http_import"], ["local_import"]], ids=["job input of http_import", "job input of local_import"]
)
def test_a_job_input_of_user_info_after_two_slashes_is_refused_before_a_job_exists(
    tmp_path, write_config, capsys, steps
) -> None:
    """``//user:password@host/file``, a URL without its scheme, was taken for a path: the job was made and its
    input, the password in it, went into job.json, the job log, the terminal and the flow run's parameters."""
    config = write_config({"pipeline": {"enabled_steps": steps}})
    assert main(["start", str(config), "//r:pw-in-url@127.0.0.1:9/x.ndjson", "--no-progress"]) == EXIT_USAGE
    printed = capsys.readouterr()
    assert "pw-in-url" not in printed.out + printed.err and "user name or password" in printed.err
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize(
    "url",
    [
        "https://h/x?sig=abc@d",
        "http://h/users/%40me",
        "https://h/a?x=1#f@g",
        "https://h/a#f@g",
        "http://[::1]:80/a@b",
        "https://files.example.org/exports/@latest/Patient.ndjson",
    ],
)
def test_an_at_sign_in_a_path_query_or_fragment_after_a_host_is_no_user_info(url) -> None:
    refuse_credentials_in_url(url, door="job input", fix="fix")
    assert shown_url(url) == url.split("?")[0].split("#")[0]


def test_a_password_with_a_bracket_in_an_attach_url_is_refused_in_one_line(tmp_path, write_config, capsys):
    """urlsplit reads ``[…]`` as an IPv6 address and quoted the password in its error, a traceback."""
    _, job_dir = made_job(tmp_path, write_config)
    url = "https://bob:q[pw-in-url]@torch.example/fhir/__status/job-1"
    assert main(["continue", str(job_dir), "--attach", url, "--no-progress"]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "pw-in-url" not in error and "Traceback" not in error and "user name or password" in error


# --- 3. truncated downloads -----------------------------------------------------------------------------


class TruncatingHandler(BaseHTTPRequestHandler):
    """Serves ``state["body"]``; the first ``state["truncate"]`` answers stop in the middle of a line and close,
    without Content-Length (HTTP/1.0 style) or as a well-formed chunked body (``state["chunked"]``)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        state = self.server.state
        with state["lock"]:
            state["requests"] += 1
            truncate = state["truncate"] > 0
            state["truncate"] -= 1
        body = state["body"][: state["cut_at"]] if truncate else state["body"]
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+ndjson")
        # It closes the connection after each answer, and says so: a client that did not hear it reused the closed
        # connection for its next attempt when that came at once (retry.initial_backoff_ms 0), unseen here.
        self.send_header("Connection", "close")
        if state["chunked"]:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 4096):
                piece = body[start : start + 4096]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.end_headers()
            self.wfile.write(body)
        self.close_connection = True


def truncating_server(*, truncate: int, chunked: bool) -> LoopbackServer:
    body = resource_lines(1000)
    cut_at = body.index(b"\n", len(body) // 2) + 1 + len(b'{"resou')  # 501 whole lines, then a broken one
    state = {"body": body, "cut_at": cut_at, "truncate": truncate, "chunked": chunked}
    return LoopbackServer(TruncatingHandler, state | {"requests": 0, "lock": threading.Lock()})


def download(server: LoopbackServer, dest: Path, retry: RetrySettings = QUICK_RETRY):
    endpoint = ServiceEndpoint("http_import", server.base_url, None, timedelta(seconds=10))
    with build_client(endpoint, TLS) as client:
        return download_ndjson(
            client,
            f"{server.base_url}/core.ndjson",
            dest,
            level="fastest",
            max_line_bytes=MB,
            stall_timeout=timedelta(seconds=10),
            retry=retry,
        )


@pytest.mark.parametrize("chunked", [False, True], ids=["no-content-length", "chunked"])
def test_a_download_cut_mid_line_is_never_taken_as_finished(tmp_path, chunked) -> None:
    with truncating_server(truncate=99, chunked=chunked) as server, pytest.raises(ServiceError) as error:
        download(server, tmp_path / "core.ndjson.zst")
    assert error.value.transient and "end in the middle of line 502" in str(error.value)
    assert server.state["requests"] == QUICK_RETRY.max_attempts
    assert list(tmp_path.iterdir()) == []


def test_a_download_cut_mid_line_is_retried_and_then_complete(tmp_path) -> None:
    with truncating_server(truncate=1, chunked=False) as server:
        stats = download(server, tmp_path / "core.ndjson.zst")
    assert stats.resources == 1000 and server.state["requests"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["core.ndjson.zst"]


# --- 4. a pseudonymizer dripping its answer -------------------------------------------------------------


class DrippingHandler(BaseHTTPRequestHandler):
    """Answers 200 and then one byte every 0.1 s, never finishing (until the client hangs up)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/fhir+json")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        stop: threading.Event = self.server.state
        try:
            while not stop.wait(0.1):
                self.wfile.write(b" ")
                self.wfile.flush()
        except OSError:
            pass


def test_the_pseudonymizer_timeout_bounds_the_whole_request(tmp_path) -> None:
    stop = threading.Event()
    with LoopbackServer(DrippingHandler, stop) as server:
        endpoint = ServiceEndpoint("pseudonymizer", server.base_url, None, timedelta(seconds=1))

        def pseudonymize() -> None:
            with ServiceClient(endpoint, TLS, NO_RETRY) as client:
                service = Pseudonymizer(client)
                service.pseudonymize(b'{"resourceType":"Patient"}', {"resourceType": "Patient"})

        started = time.monotonic()
        try:
            with pytest.raises(ServiceError) as error:
                pseudonymize()
        finally:
            stop.set()
    assert time.monotonic() - started < 10  # a per-read timeout would wait forever
    assert error.value.transient and "services.pseudonymizer.timeout" in str(error.value)


# --- 8. file names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "fragment"),
    [
        ("a%0Ab.ndjson.zst", "control character"),
        ("a%0Db.ndjson", "control character"),
        ("report%E2%80%AEgpj.ndjson", "bidirectional"),
        ("x" * 300 + ".ndjson", "too long"),
    ],
    ids=["newline", "carriage-return", "bidi-override", "over-255-bytes"],
)
def test_unsafe_result_file_names_are_refused_clearly(segment, fragment) -> None:
    with pytest.raises(DownloadError, match=fragment) as error:
        safe_file_name(f"http://files.example/result/{segment}", compress=True)
    assert "http://files.example/result/" in str(error.value)
    assert "\n" not in str(error.value) and "\r" not in str(error.value) and "\u202e" not in str(error.value)


def test_a_manifest_with_too_many_files_is_refused() -> None:
    urls = (f"http://files.example/batch-{i}.ndjson" for i in range(11))
    with pytest.raises(DownloadError, match="more than 10 files.*services.extractor.max_result_files"):
        target_names(urls, compress=True, max_files=10)


# --- 9. hostile configuration files ---------------------------------------------------------------------

ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (ALIAS_BOMB.encode(), "once YAML aliases (*name) are expanded"),
        (
            b"pipeline:\n  enabled_steps: [local_import]\njobs_dir: /tmp/\xff\xfe\n",
            "not UTF-8 text (byte 0xff on line 3)",
        ),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested more than 32 levels deep"),
        (b"retry:\n  max_attempts: " + b"9" * 100_000 + b"\n", "a number 100,000 characters long"),
        (b"services:\n  extractor:\n    extraction_timeout: P99999999999D\n", "longer than the maximum of P3650D"),
        (b"retry:\n  max_attempts: 3\n  max_attempts: 4\n", "line 3: key 'max_attempts' appears twice"),
        (b"\x00\x01\x02binary", "invalid YAML"),
    ],
    ids=["alias-bomb", "non-utf8", "deep-nesting", "huge-integer", "huge-duration", "duplicate-key", "binary"],
)
def test_hostile_configuration_files_end_in_a_clear_error_quickly(tmp_path, content, fragment) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as error:
            load_settings(path, env={})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fragment in str(error.value)
    assert time.monotonic() - started < 1.0 and peak < 50 * MB


@pytest.mark.parametrize(
    "read",
    [
        lambda path: read_json_file(path, MAX_RECORD_BYTES, "the job record"),
        lambda path: read_settings_file(path, "services.pseudonymizer.anonymization_config"),
    ],
    ids=["job-record", "settings-file"],
)
def test_a_small_file_is_read_in_memory_of_its_size_not_of_its_limit(tmp_path, read) -> None:
    """A read of at most a limit's bytes asked the allocator for the whole limit up front: 64 MB for each job record
    ``status`` reads, which a host with strict overcommit (as PostgreSQL hosts are set up) may refuse."""
    path = tmp_path / "small.json"
    path.write_bytes(b'{"version": 3}')
    tracemalloc.start()
    try:
        document = read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert document in ({"version": 3}, b'{"version": 3}')
    assert peak < 2 * MB, f"{peak / MB:.1f} MB for a file of 14 bytes"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"[\xff]", "not UTF-8 text")],
    ids=["deep", "non-utf8"],
)
def test_a_hostile_enrichment_file_is_a_clear_error(tmp_path, content, fragment) -> None:
    (tmp_path / "rules.json").write_bytes(content)
    path = tmp_path / "config.yaml"
    path.write_text(
        "pipeline: {enabled_steps: [local_import]}\nservices: {crtdl_preprocessing: {enrichments_path: rules.json}}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_settings(path, env={})
    (problem,) = error.value.problems
    assert problem.startswith("services.crtdl_preprocessing.enrichments_path:") and fragment in problem


def enrichment_bomb(copies: int) -> str:
    """Inline enrichment rules as one flow list: ``copies`` aliases of a rule whose ``copies`` attributes each link
    ``copies`` groups, copies**3 values once expanded in a text of a few kB."""
    aliases = ", ".join
    groups = f"&g [{aliases(['G'] * copies)}]"
    attribute = f"&a {{attribute_ref: Patient.id, linked_groups: {groups}}}"
    rule = f"&r {{group_reference: P, attributes_to_add: [{attribute}, {aliases(['*a'] * (copies - 1))}]}}"
    return f"[{rule}, {aliases(['*r'] * (copies - 1))}]"


@pytest.mark.parametrize(
    ("key", "text", "fragment"),
    [
        ("pipeline.enabled_steps", "[" * 3000 + "]" * 3000, "nested more than 32 levels deep"),  # RecursionError
        ("services.crtdl_preprocessing.enrichments", enrichment_bomb(120), "once YAML aliases (*name) are expanded"),
    ],
    ids=["deep-nesting", "alias-bomb"],
)
@pytest.mark.parametrize("door", ["APP_", "--set", "deployment"])
def test_a_hostile_list_text_from_a_variable_or_an_override_is_refused_as_in_the_file(key, text, fragment, door):
    """A list may be given as a flow list ``[a, b]`` in an APP_* variable, ``--set`` or a deployment's overrides
    parameter (a form in the Prefect UI): parsed without the file's bounds, deep nesting crashed the command or the
    flow run with a RecursionError traceback, and an alias bomb was accepted (4.5 kB of text: 64 million values,
    validated, then printed by config check and written into the job's CRTDL)."""
    env = {env_var_name(key): text} if door == "APP_" else {}
    env |= {"APP_PIPELINE_ENABLED_STEPS": "local_import"} if key != "pipeline.enabled_steps" else {}
    overrides = {key: text} if door != "APP_" else {}
    labels = {key: "the flow's overrides parameter"} if door == "deployment" else None
    with pytest.raises(ConfigError) as error:  # from the parser's events, before a value is built
        load_settings(None, env=env, overrides=overrides, override_labels=labels)
    (problem,) = [problem for problem in error.value.problems if problem.startswith(key)]
    assert fragment in problem
    assert {"APP_": env_var_name(key), "--set": f"--set {key}", "deployment": "overrides parameter"}[door] in problem


def test_a_long_step_list_is_checked_in_linear_time(tmp_path) -> None:
    steps = ["local_import"] + ["nonsense"] * 50_000 + ["pseudonymizer"] * 50_000
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        load_settings(None, env={"APP_PIPELINE_ENABLED_STEPS": ",".join(steps)})
    assert time.monotonic() - started < 1.0
    assert "unknown step 'nonsense'" in str(error.value) and "step pseudonymizer is listed more than once" in str(
        error.value
    )


@pytest.mark.slow
def test_an_alias_bomb_exits_2_through_the_command_line(tmp_path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB, encoding="utf-8")
    result = run_cli("config", "check", str(path), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "once YAML aliases (*name) are expanded" in result.stderr and "Traceback" not in result.stderr


# --- 10. content that is not NDJSON ---------------------------------------------------------------------


def test_a_download_with_a_non_json_line_fails_naming_url_and_line(echo, tmp_path) -> None:
    body = resource_lines(3) + b"\x00\x9f binary garbage\n" + resource_lines(2)
    echo.state.replies.append(Reply(200, {"Content-Type": "application/fhir+ndjson"}, body))
    with pytest.raises(NdjsonError, match=r"/core.ndjson: line 4 is not valid JSON"):
        download(echo, tmp_path / "core.ndjson.zst", NO_RETRY)
    assert list(tmp_path.iterdir()) == []


# --- smaller ones ---------------------------------------------------------------------------------------


def test_a_self_redirect_names_the_url(echo) -> None:
    echo.state.replies.extend([Reply(302, {"Location": "/fhir/loop?token=abc"})] * 3)
    endpoint = ServiceEndpoint("extractor", echo.base_url)
    with ServiceClient(endpoint, TLS, NO_RETRY) as client, pytest.raises(ServiceError) as error:
        client.request("GET", "/fhir/loop?token=abc", deadline=A_MINUTE, operation="poll")
    assert f"{echo.base_url}/fhir/loop redirects to itself" in str(error.value)
    assert "token=abc" not in str(error.value) and len(echo.state.requests) == 1


def test_a_redirect_loop_through_two_urls_names_them(echo) -> None:
    echo.state.replies.extend([Reply(302, {"Location": "/b"}), Reply(302, {"Location": "/a"})])
    with ServiceClient(ServiceEndpoint("extractor", echo.base_url), TLS, NO_RETRY) as client:
        with pytest.raises(ServiceError, match=f"{echo.base_url}/b redirects back to {echo.base_url}/a"):
            client.request("GET", "/a", deadline=A_MINUTE, operation="poll")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"automations: []\n" + b"#" * 1_000_000 + b"\n", "larger than 1 MB"),
        (
            b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + b"".join(
                b"%c: &%c [*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c]\n" % ((98 + i, 98 + i) + (97 + i,) * 10)
                for i in range(8)
            ),
            "values once YAML aliases",
        ),
        (b"automations:\n  - \xff\n", "not UTF-8"),
    ],
    ids=["over-1-MB", "alias-bomb", "not-utf8"],
)
def test_the_automation_file_is_read_within_bounds_one_line_and_exit_1(tmp_path, capsys, content, problem):
    path = tmp_path / "automations.yaml"
    path.write_bytes(content)

    exit_code = apply_automations([str(path)])

    error = capsys.readouterr().err
    assert exit_code == 1 and error.count("\n") == 1, error
    assert error.startswith(f"error: {path}: ") and problem in error


def test_continue_on_a_read_only_job_directory_is_one_line_and_exit_2(tmp_path, write_config, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.ndjson").write_text('{"resourceType":"Patient","id":"1"}\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    job_dir = prepare_job(None, str(config), str(tmp_path / "in"), {}, overrides_source="--set").paths.job_dir
    before = {path.name: path.read_bytes() for path in job_dir.iterdir()}

    with unwritable(job_dir):
        exit_code = main(["continue", str(job_dir), "--no-progress"])

    error = capsys.readouterr().err
    assert exit_code == EXIT_USAGE and error.count("\n") == 1, error
    assert f"cannot write in its directory {job_dir}" in error and "make it writable" in error
    assert {path.name: path.read_bytes() for path in job_dir.iterdir()} == before


def made_job(tmp_path: Path, write_config) -> tuple[str, Path]:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.ndjson").write_text('{"resourceType":"Patient","id":"1"}\n')
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
            "services": {"pseudonymizer": {"url": "http://pseudo.example"}},
        }
    )
    job = prepare_job(None, str(config), str(tmp_path / "in"), {}, overrides_source="--set")
    return job.job_id, job.paths.job_dir


def test_a_job_whose_configuration_now_lists_other_steps_is_refused_naming_both_lists(tmp_path, write_config):
    """The steps a job was started with are the job's: continuing after the file dropped the pseudonymizer ended
    Completed on data never pseudonymized."""
    job_id, job_dir = made_job(tmp_path, write_config)
    before = (job_dir / "job.json").read_bytes()
    write_config(
        {
            "pipeline": {"enabled_steps": ["local_import"]},
            "services": {"pseudonymizer": {"url": "http://pseudo.example"}},
        }
    )

    with pytest.raises(JobError) as refused:
        existing_job(JobPaths(job_dir), {}, "--set")

    assert "pipeline.enabled_steps [local_import, pseudonymizer], the configuration now says [local_import]" in str(
        refused.value
    )
    assert "put the list back to continue it, or start a new job" in str(refused.value)
    assert (job_dir / "job.json").read_bytes() == before


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ({"services.pseudonymizer.url": "https://bob:Sup3rSecretPw@pseudo.example"}, "user name or password"),
        ({"retyr.max_attempts": "3"}, "did you mean retry.max_attempts"),
        ({"retry.max_attempts": "99"}, "must be between 1 and 10"),
    ],
)
def test_a_refused_continue_override_is_never_stored_with_the_job(tmp_path, write_config, override, refusal):
    """A bad ``continue --set`` changed job.json before it was checked: a password stayed in it, and an unknown key
    (which --set cannot remove) made every later continue fail."""
    job_id, job_dir = made_job(tmp_path, write_config)
    before = (job_dir / "job.json").read_bytes()

    with pytest.raises(ConfigError, match=refusal):
        existing_job(JobPaths(job_dir), override, "--set")

    assert (job_dir / "job.json").read_bytes() == before
    assert existing_job(JobPaths(job_dir), {}, "--set").job_id == job_id


def test_a_path_given_to_continue_is_frozen_absolute_as_at_start(tmp_path, write_config, monkeypatch):
    job_id, job_dir = made_job(tmp_path, write_config)
    for site in ("siteA", "siteB"):
        (tmp_path / site).mkdir()
        (tmp_path / site / "anon.yaml").write_text("fhirPathRules: []\n")
    key = "services.pseudonymizer.anonymization_config"
    monkeypatch.chdir(tmp_path / "siteA")
    existing_job(JobPaths(job_dir), {key: "anon.yaml"}, "--set")

    monkeypatch.chdir(tmp_path / "siteB")
    job = existing_job(JobPaths(job_dir), {}, "--set")

    assert job.record.overrides[key] == str(tmp_path / "siteA" / "anon.yaml")
    assert str(job.settings.services.pseudonymizer.anonymization_config) == str(tmp_path / "siteA" / "anon.yaml")


@pytest.mark.parametrize(
    ("job_input", "config_text", "said"),
    [
        ("https://bob:pw-in-url@files.example/Patient.ndjson", None, "the job input (INPUT): the URL https://files."),
        ("https://files.example/Patient.ndjson?access_token=pw-in-url", None, "a secret in its query (access_token)"),
        (None, "pipeline: {enabled_steps: [nonsense]}\n", "pipeline.enabled_steps"),
    ],
)
def test_serve_refuses_a_job_input_with_credentials_or_a_bad_configuration_before_a_deployment_exists(
    tmp_path, monkeypatch, capsys, job_input, config_text, said
):
    """They would become the deployment's parameters, shown in the UI, and fail every scheduled run."""
    config = tmp_path / "job.yaml"
    config.write_text(config_text or "pipeline: {enabled_steps: [http_import]}\n")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(sys, "argv", ["serve", str(config), *([job_input] if job_input else [])])
    with pytest.raises(SystemExit) as ended:
        serve()
    error = capsys.readouterr().err
    assert ended.value.code == 2 and error.startswith("error: ") and said in error and "pw-in-url" not in error


def test_a_lock_file_that_is_a_symbolic_link_is_never_written_through(tmp_path, write_config, capsys):
    """The lock is truncated and given the holder's pid: through a link, any file the user may write (prune too)."""
    _, job_dir = made_job(tmp_path, write_config)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    (job_dir / LOCK_FILE).unlink(missing_ok=True)
    (job_dir / LOCK_FILE).symlink_to(precious)

    with pytest.raises(JobError, match=f"its lock file {job_dir / LOCK_FILE} is a symbolic link; remove it"):
        job_lock(JobPaths(job_dir)).__enter__()

    assert precious.read_text() == "keep me\n"


def test_a_services_words_with_escape_sequences_show_as_plain_text_in_status(
    tmp_path, write_config, capsys, empty_prefect_api
):
    """A service's error text travels into the job's state message; on a terminal its escape sequences would clear
    the screen, retitle the window or forge lines."""
    _, job_dir = made_job(tmp_path, write_config)
    said = "bad \x1b]0;pwned\x07\x1b[2J\x1b[31mFAKE: job Completed\x1b[0m\nforged line\u202eevil"
    put_flow_run(
        empty_prefect_api,
        job_dir,
        "FAILED",
        "Failed",
        f"pseudonymizer: de-identify failed with HTTP 422 (terminal): {said}",
    )
    capsys.readouterr()

    assert main(["status", str(job_dir)]) == 0

    out = capsys.readouterr().out
    (state,) = [line for line in out.splitlines() if line.lstrip().startswith("state:")]
    assert "HTTP 422 (terminal): bad ]0;pwned [2J [31mFAKE: job Completed [0m forged line evil" in state
    assert not any(unicodedata.category(char) in ("Cc", "Cf") for char in out.replace("\n", ""))


@pytest.mark.parametrize(
    ("steps", "said"),
    [(["extractor"], r"needs a CRTDL file \(or a complete result URL\) as INPUT"), (["http_import"], "as INPUT")],
)
def test_an_import_step_without_its_input_is_refused_before_a_job_exists(tmp_path, write_config, steps, said):
    """The job input is frozen with the job: made without one, it failed on every continue."""
    config = write_config(
        {"pipeline": {"enabled_steps": steps}, "services": {"extractor": {"base_url": "http://torch.example"}}}
    )
    with pytest.raises(JobError, match=f"{said}.*; no job was made"):
        prepare_job(None, str(config), None, {}, overrides_source="--set")
    assert not (tmp_path / "jobs").exists() or list((tmp_path / "jobs").iterdir()) == []


def test_a_services_words_make_no_link_image_or_cell_break_in_the_job_record_card():
    """The card is markdown in the Prefect UI: a service's error text or a value from the data made links, images
    (a request to any host when the page is opened) or broke out of a code span."""
    cause = one_line_text("bad ![pixel](https://evil.example/t.png) [click](javascript:alert(1)) | <b>x</b>")
    assert "![" not in cause and "](" not in cause and "<b>" not in cause and " | " not in cause
    assert "evil.example/t.png" in cause  # shown, as text
    (line,) = markdown_list({"[x](https://evil.example)": "a`b``c"})
    assert line == "- **\\[x\\]\\(https\\://evil.example\\)**: ```a`b``c```"


def test_a_job_input_that_is_not_valid_utf_8_is_refused_before_a_job_exists(tmp_path, write_config):
    """A Latin-1 folder name could not be stored in the job's record: a bare serialization error, a half-made job."""
    folder = tmp_path / os.fsdecode(b"M\xfcller-Export")
    folder.mkdir()
    (folder / "a.ndjson").write_text('{"resourceType":"Patient","id":"1"}\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    with pytest.raises(JobError, match=r"the job input .*M\\udcfcller-Export' is not valid UTF-8; rename it"):
        prepare_job(None, str(config), str(folder), {}, overrides_source="--set")
    assert not (tmp_path / "jobs").exists() or list((tmp_path / "jobs").iterdir()) == []


@pytest.mark.parametrize("job_id", ["../outside", "/tmp/elsewhere", "evil\u202etxt", "x" * 300])
def test_a_job_id_that_is_no_job_id_is_refused_before_anything_is_written(tmp_path, write_config, job_id):
    """The deployment's form takes a job id to continue: ``..`` or a path made the job's directory outside jobs_dir."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.ndjson").write_text('{"resourceType":"Patient","id":"1"}\n')
    config = write_config({"pipeline": {"enabled_steps": ["local_import"]}})
    with pytest.raises(JobError, match="is not a job id .*give the id of an existing job, or none"):
        prepare_job(job_id, str(config), str(tmp_path / "in"), {}, overrides_source="the flow's parameters")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "in"]


def test_overrides_for_a_job_another_process_works_on_are_refused_before_they_are_stored(tmp_path, write_config):
    """A deployment run of a locked job wrote its overrides into job.json, then found the job locked and failed:
    the refused run had still changed what the next continue uses."""
    job_id, job_dir = made_job(tmp_path, write_config)
    before = (job_dir / "job.json").read_bytes()
    with open(job_dir / LOCK_FILE, "w") as held:  # as another process holds it: its own lock, another pid
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("999999")
        held.flush()
        with pytest.raises(JobLockedError, match="is being worked on by another process"):
            existing_job(JobPaths(job_dir), {"retry.max_attempts": "1"}, "--set")
    assert (job_dir / "job.json").read_bytes() == before
