"""Hostile services (issue 22, "Hardening, round two"): a service that quotes credentials back, one that drips its
answer a byte at a time, one whose answer is larger than memory.

Every fake is a real HTTP server on 127.0.0.1 (tests/fakes/); the secrets are searched for in everything a run
stores: the job directory (job.log, send/failed/, reports, Prefect results), what the command printed, and the
Prefect database (logs, artifacts, states).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
import pytest

from config.settings import RetrySettings, TlsSettings
from flows.run import EXIT_FAILED
from config.settings import Settings
from tasks.clients.errors import ServiceError
from tasks.core.redaction import redact_record, register_secret
from tasks.clients.fhir_server import FhirServer
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.validator import Validator, iter_chunks
from tasks.core.errors import StepError
from tests.support.ndjson import iter_resources
from tasks.send import send_resources
from tasks.validation import validate_path
from tests.conftest import REPO_ROOT, run_cli, wait_until
from tests.fakes._server import LoopbackServer
from tests.fakes.fhir_server import start_fhir_fake
from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
from tests.support.jobs import job_file, only_job_dir
from tests.support.pseudonymization import pseudonymize
from tests.support.sending import generated, write_ndjson

MB = 1024 * 1024
FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)
READ_TIMEOUT = timedelta(seconds=30)
"""Longer than any test's deadline: what cuts a dripping server off is the deadline, not the read timeout."""
USERNAME = "sender"
PASSWORD = "s3cr/et+pa=ss&w0rd-7c1e"
"""URL-encoding changes it (``/``, ``+``, ``=``, ``&``), so every encoded form is a different string to find."""
API_KEY = "api-key-0c7e55-sent-with-basic"


@pytest.fixture(scope="module")
def fake_fhir():
    server = start_fhir_fake()
    yield server
    server.stop()


@pytest.fixture
def fhir_fake(fake_fhir):
    fake_fhir.state.reset()
    return fake_fhir


# --- item 1: a secret echoed by a service is stored nowhere --------------------------------------------------


def basic_forms(username: str, password: str) -> list[str]:
    """The Basic password as a server could quote it back: plain, base64, URL-encoded, and the header's token."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return [
        password,
        base64.b64encode(password.encode()).decode(),
        quote(password, safe=""),
        quote_plus(password),
        token,
    ]


def send_job_config(tmp_path: Path, url: str, auth: str) -> Path:
    write_ndjson(tmp_path / "in" / "core.ndjson", generated(4, "echo"))
    config = tmp_path / "job.yaml"
    config.write_text(
        "pipeline:\n  enabled_steps: [local_import, send]\n"
        f"jobs_dir: {tmp_path / 'jobs'}\n"
        "retry:\n  max_attempts: 2\n  initial_backoff_ms: 10\n  max_backoff_ms: 50\n"
        f"services:\n  local_import:\n    dir: {tmp_path / 'in'}\n"
        f"  send:\n    send_as: direct_resource_load\n    url: {url}\n    auth:\n{auth}"
    )
    return config


def stored_everywhere(job_dir: Path, printed: str, prefect_api: dict) -> dict[str, bytes]:
    """Everything a run stored or printed, by where: the job's files, the output, the Prefect database's files."""
    database = prefect_api["database"]
    paths = [*(p for p in job_dir.rglob("*") if p.is_file()), *database.parent.glob(database.name + "*")]
    return {"printed": printed.encode(), **{str(path): path.read_bytes() for path in paths}}


def assert_stored_nowhere(secrets: list[str], stores: dict[str, bytes]) -> None:
    leaks = [
        f"{secret!r} in {where}" for secret in secrets for where, data in stores.items() if secret.encode() in data
    ]
    assert not leaks, "secrets were stored: " + "; ".join(leaks)


@pytest.mark.slow  # a job through the command line
@pytest.mark.parametrize("echo", ["text", "outcome"])
def test_basic_credentials_quoted_back_by_the_fhir_server_are_stored_nowhere(fhir_fake, tmp_path, prefect_api, echo):
    fhir_fake.state.echo_credentials = echo
    fhir_fake.state.echo_status = 401 if echo == "text" else 422
    auth = f"      username: {USERNAME}\n      password: ${{SEND_PASSWORD}}\n      api_key: ${{SEND_API_KEY}}\n"
    config = send_job_config(tmp_path, fhir_fake.base_url, auth)
    result = run_cli("start", str(config), "--no-progress", env={"SEND_PASSWORD": PASSWORD, "SEND_API_KEY": API_KEY})

    assert result.returncode == EXIT_FAILED, result.stderr
    job_dir = only_job_dir(tmp_path / "jobs")
    assert job_file(job_dir)["state"] == "Failed"
    (answer,) = (job_dir / "send" / "failed").glob("*-batch-1.response.txt")
    assert f"HTTP {fhir_fake.state.echo_status}" in answer.read_text()
    assert "you sent Authorization: ***" in answer.read_text()  # kept for inspection, credentials blanked
    stores = stored_everywhere(job_dir, result.stdout + result.stderr, prefect_api)
    assert_stored_nowhere([*basic_forms(USERNAME, PASSWORD), API_KEY], stores)


@pytest.mark.slow  # a job through the command line
def test_an_oauth_token_quoted_back_by_the_fhir_server_is_stored_nowhere(fhir_fake, tmp_path, prefect_api):
    oauth = OAuthState(client_secret="oauth-client-secret-5d9a")
    with LoopbackServer(OAuthHandler, oauth) as issuer:
        fhir_fake.state.oauth, fhir_fake.state.echo_credentials = oauth, "outcome"
        auth = (
            f"      oauth_issuer_uri: {issuer.base_url}{REALM_PATH}\n      oauth_client_id: {oauth.client_id}\n"
            "      oauth_client_secret: ${CLIENT_SECRET}\n"
        )
        config = send_job_config(tmp_path, fhir_fake.base_url, auth)
        result = run_cli("start", str(config), "--no-progress", env={"CLIENT_SECRET": oauth.client_secret})

    assert result.returncode == EXIT_FAILED, result.stderr
    tokens = list(oauth._issued)
    assert len(tokens) == 2  # the first token, and the fresh one fetched after the 401
    job_dir = only_job_dir(tmp_path / "jobs")
    (answer,) = (job_dir / "send" / "failed").glob("*-batch-1.response.txt")
    assert "you sent Bearer ***" in answer.read_text()
    stores = stored_everywhere(job_dir, result.stdout + result.stderr, prefect_api)
    assert_stored_nowhere([oauth.client_secret, *tokens], stores)


def test_a_secret_a_validator_quotes_back_reaches_no_report_summary_or_log(validator_fake, tmp_path, caplog):
    secret = "validator-quoted-secret-41be"
    register_secret(secret)
    validator_fake.state.quote = f"Authorization: Basic {base64.b64encode(secret.encode()).decode()} ({secret})"
    source = tmp_path / "in.ndjson"
    source.write_bytes(b"".join(orjson.dumps(patient(i)) + b"\n" for i in range(3)))

    endpoint = ServiceEndpoint("validation", validator_fake.base_url)
    with ServiceClient(endpoint, TlsSettings(), FAST_RETRY) as client:
        checked = validate_path(
            source,
            tmp_path / "report.ndjson",
            Validator(client),
            chunk_bytes=MB,
            concurrency=2,
            level=None,
            max_line_bytes=MB,
        )

    assert checked.errors == 1 and "the request came with Authorization: ***" in checked.first_errors[0]
    report = (tmp_path / "report.ndjson").read_bytes()
    assert b"the request came with Authorization: ***" in report
    assert [o["resourceType"] for _, o in iter_resources(tmp_path / "report.ndjson", MB)] == ["OperationOutcome"]
    stores = {"report": report, "summary": checked.model_dump_json().encode(), "log": caplog.text.encode()}
    assert_stored_nowhere([secret, base64.b64encode(secret.encode()).decode()], stores)


def test_a_logged_traceback_quoting_a_secret_is_redacted_for_every_handler(tmp_path):
    secret = "traceback-secret-9e02"
    register_secret(secret)
    log_file = tmp_path / "job.log"
    handler = logging.FileHandler(log_file)
    handler.addFilter(redact_record)
    logger = logging.getLogger("dupflow.test.hostile")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"the server said: you sent {secret}")
        except ValueError:
            logger.exception("send failed")
    finally:
        logger.removeHandler(handler)
        handler.close()
    logged = log_file.read_text()
    assert "ValueError: the server said: you sent ***" in logged and "Traceback" in logged
    assert secret not in logged


def test_botocore_debug_logs_of_an_answer_quoting_a_secret_are_redacted(caplog):
    import tasks.clients.s3_client  # noqa: F401 - installs the filters on botocore's loggers

    secret = "s3-proxy-secret-77d1"
    register_secret(secret)
    with caplog.at_level(logging.DEBUG, logger="botocore.parsers"):
        logging.getLogger("botocore.parsers").debug("Response body:\n%r", f"<Error>bad {secret}</Error>".encode())
    assert "Response body" in caplog.text and "bad ***" in caplog.text
    assert secret not in caplog.text


# --- items 7 and 8: every call has a whole-request deadline and a bounded answer ------------------------------


def patient(i: int) -> dict[str, Any]:
    return {"resourceType": "Patient", "id": f"p{i}", "gender": "male"}


def one_chunk():
    (chunk,) = iter_chunks([(1, orjson.dumps(patient(1)))], MB, "a.ndjson")
    return chunk


def validate_chunk(server: LoopbackServer, **options: Any) -> dict[str, Any]:
    endpoint = ServiceEndpoint("validation", server.base_url, None, READ_TIMEOUT)
    with ServiceClient(endpoint, TlsSettings(), FAST_RETRY) as client:
        return Validator(client, **options).validate(one_chunk(), "a.ndjson")


def test_a_validator_dripping_its_answer_is_cut_off_at_the_request_deadline_and_retried(validator_fake):
    validator_fake.state.reset(drip_byte_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(
        ServiceError,
        match=r"no complete answer from http://127\.0\.0\.1:\d+/validateResource within 1 s, the deadline of one "
        r"request \(REQUEST_DEADLINE",
    ) as caught:
        validate_chunk(validator_fake, deadline=timedelta(seconds=1))
    assert caught.value.transient and caught.value.status_code is None
    assert len(validator_fake.state.requests) == FAST_RETRY.max_attempts
    assert time.monotonic() - started < 15  # three attempts of 1 s each, not three answers of minutes


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_validator_answer_over_the_cap_is_refused_without_being_read_whole(validator_fake, chunked):
    validator_fake.state.reset(answer_padding=200 * MB, chunked_answer=chunked)
    size = "over 1.0 MB" if chunked else "200.0 MB"
    expected = f"the answer from \\S+ is {size}, more than the 1.0 MB read from this service; lower services.validation"
    with pytest.raises(ServiceError, match=expected) as caught:
        validate_chunk(validator_fake, max_answer_bytes=MB)
    assert not caught.value.transient and len(validator_fake.state.requests) == 1
    wait_until(lambda: validator_fake.state.in_flight == 0)
    assert validator_fake.state.bytes_written < 50 * MB  # the client hung up: no more than the socket buffers


def send_to(server: LoopbackServer, tmp_path: Path, **bounds: Any):
    """Send four resources in one transaction to ``server`` with the FHIR client's ``bounds``."""
    settings = Settings.model_validate(
        {
            "pipeline": {"enabled_steps": ["local_import", "send"]},
            "services": {
                "send": {
                    "send_as": "direct_resource_load",
                    "url": server.base_url,
                    "auth": {"username": "dupflow", "password": "fhir-password"},
                }
            },
            "retry": {"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 50},
        }
    )
    source = write_ndjson(tmp_path / "core.ndjson", generated(4, "bounded"))
    with FhirServer.connect(settings.services.send, settings.tls, settings.retry, **bounds) as fhir:
        return send_resources(fhir, source, tmp_path / "send", job_id="j", batch_size=10, max_line_bytes=MB)


def test_a_fhir_server_dripping_its_answer_is_cut_off_at_the_request_deadline_and_retried(fhir_fake, tmp_path):
    fhir_fake.state.drip_seconds = 0.3
    started = time.monotonic()
    with pytest.raises(
        StepError,
        match=r"batch 1 .* could not be sent: .*no complete answer from http://127\.0\.0\.1:\d+/fhir within 1 s, the "
        r"deadline of one request \(REQUEST_",
    ):
        send_to(fhir_fake, tmp_path, deadline=timedelta(seconds=1))
    assert len(fhir_fake.state.transactions) == 2  # retried once (retry.max_attempts: 2), like a lost answer
    assert time.monotonic() - started < 15
    assert not (tmp_path / "send" / "progress" / "core.ndjson.json").exists()  # the batch is not taken as sent


def test_a_fhir_server_dripping_its_headers_is_cut_off_at_the_request_deadline(fhir_fake, tmp_path):
    fhir_fake.state.drip_header_seconds = 0.3
    started = time.monotonic()
    with pytest.raises(
        StepError, match=r"could not be sent: .*no complete answer from http://127\.0\.0\.1:\d+/fhir within 1 s"
    ):
        send_to(fhir_fake, tmp_path, deadline=timedelta(seconds=1))
    assert len(fhir_fake.state.transactions) == 2
    assert time.monotonic() - started < 15


def test_a_fhir_server_answer_over_the_cap_fails_the_batch_without_being_read_whole(fhir_fake, tmp_path):
    fhir_fake.state.answer_padding = 100 * MB
    with pytest.raises(StepError, match="the answer is 100.0 MB, more than the 1.0 MB read from this service; lower"):
        send_to(fhir_fake, tmp_path, max_answer_bytes=MB)
    assert len(fhir_fake.state.transactions) == 1  # terminal: not retried


def test_a_pseudonymizer_answer_over_the_cap_is_refused_without_being_read_whole(pseudonymizer_fake):
    pseudonymizer_fake.state.answer_padding = 100 * MB
    expected = (
        "the answer from \\S+ is 100.0 MB, more than the 1.0 MB read from this service; .* "
        "pipeline.max_ndjson_line_size_mb"
    )
    with pytest.raises(ServiceError, match=expected) as caught:
        pseudonymize(pseudonymizer_fake, patient(1), max_answer_bytes=MB)
    assert not caught.value.transient and len(pseudonymizer_fake.state.requests) == 1


PATIENT_IDS = orjson.dumps(
    {"resourceType": "ViewDefinition", "resource": "Patient", "select": [{"column": [{"name": "id", "path": "id"}]}]}
)


def flattener(server: LoopbackServer, **options: Any) -> ServiceClient:
    endpoint = ServiceEndpoint("flattening", server.base_url, None, READ_TIMEOUT)
    return ServiceClient(endpoint, TlsSettings(), FAST_RETRY)


def test_flattener_rows_are_streamed_one_line_at_a_time_never_the_whole_answer(flattener_fake):
    flattener_fake.state.repeat_rows = 4_000_000  # about 50 MB of {"id":"p1"} rows
    total = 4_000_000 * len(b'{"id":"p1"}\n')
    with flattener(flattener_fake) as client:
        rows = Flattener(client).run(PATIENT_IDS, [orjson.dumps(patient(1))])
        first = [next(rows) for _ in range(1000)]
        rows.close()  # the consumer stops: the answer is closed, not read to its end
    assert first == [{"id": "p1"}] * 1000
    wait_until(lambda: flattener_fake.state.streams_ended == 1)
    assert flattener_fake.state.bytes_written < total / 2


@pytest.mark.parametrize("drip", ["drip_byte_seconds", "drip_header_seconds"], ids=["rows", "headers"])
def test_a_flattener_dripping_its_answer_is_cut_off_at_the_request_deadline(flattener_fake, drip):
    setattr(flattener_fake.state, drip, 0.3)
    started = time.monotonic()
    with flattener(flattener_fake) as client:
        service = Flattener(client, deadline=timedelta(seconds=1))
        expected = (
            r"no complete answer from http://127\.0\.0\.1:\d+/fhir/ViewDefinition/\$run within 1 s, the deadline "
            r"of one request \(services.flattening.timeout\)"
        )
        with pytest.raises(ServiceError, match=expected):
            list(service.run(PATIENT_IDS, [orjson.dumps(patient(1))]))
    assert time.monotonic() - started < 10


# --- item 8's acceptance: a 300 MB answer, the client in its own process, its peak RSS under 400 MB -------------

LARGE_ANSWER = 300 * MB
PEAK_RSS_LIMIT_MB = 400
CHILD_TIMEOUT = 240
VALIDATE_IN_A_CHILD = """
import sys
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.validator import Validator, iter_chunks
(chunk,) = iter_chunks([(1, b'{"resourceType":"Patient","id":"p1"}')], 1 << 20, "a.ndjson")
endpoint = ServiceEndpoint("validation", sys.argv[1])
try:
    with ServiceClient(endpoint, TlsSettings(), RetrySettings(max_attempts=1)) as client:
        Validator(client).validate(chunk, "a.ndjson")
except ServiceError as exc:
    print(exc)
"""
FLATTEN_IN_A_CHILD = """
import sys
from config.settings import RetrySettings, TlsSettings
from tasks.clients.flattener import Flattener
from tasks.clients.http import ServiceClient, ServiceEndpoint
view, resource = sys.argv[2].encode(), sys.argv[3].encode()
with ServiceClient(ServiceEndpoint("flattening", sys.argv[1]), TlsSettings(), RetrySettings(max_attempts=1)) as client:
    rows = sum(1 for _ in Flattener(client).run(view, [resource]))
print(rows, "rows")
"""


PRINT_PEAK_RSS = """
print("peak", next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")), "kB")
"""


def run_child(script: str, *args: str) -> tuple[str, float]:
    """Run ``script`` in a child Python (which starts no process of its own); its output and its peak RSS in MB,
    which it prints last (VmHWM)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-c", script + PRINT_PEAK_RSS, *args]
    child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 0, child.stderr
    output, peak = child.stdout.rsplit("peak", 1)
    return output, int(peak.split()[0]) / 1024


@pytest.mark.slow  # 300 MB over loopback, in a child process
def test_a_300_mb_validator_answer_keeps_the_clients_peak_rss_under_400_mb(validator_fake):
    validator_fake.state.reset(answer_padding=LARGE_ANSWER, chunked_answer=True, shallow=True)
    output, peak_mb = run_child(VALIDATE_IN_A_CHILD, validator_fake.base_url)
    assert "/validateResource is over 64.0 MB, more than the 64.0 MB read from this service" in output
    assert peak_mb < PEAK_RSS_LIMIT_MB


@pytest.mark.slow  # 300 MB over loopback, in a child process
def test_a_300_mb_flattener_answer_is_streamed_with_the_clients_peak_rss_under_400_mb(flattener_fake):
    resource = orjson.dumps({"resourceType": "Patient", "id": "p" * 1000})
    row = len(b'{"id":""}\n') + 1000
    flattener_fake.state.repeat_rows = LARGE_ANSWER // row
    output, peak_mb = run_child(FLATTEN_IN_A_CHILD, flattener_fake.base_url, PATIENT_IDS.decode(), resource.decode())
    assert output.split() == [str(LARGE_ANSWER // row), "rows"]
    assert flattener_fake.state.bytes_written >= LARGE_ANSWER - row
    assert peak_mb < PEAK_RSS_LIMIT_MB


def test_an_answer_of_the_prefect_api_larger_than_its_bound_is_refused_naming_the_api_and_the_fix(monkeypatch):
    """``prune`` reads the Prefect API's answers bounded like every service's: the API is outside this process."""
    from flows.prefect_api import api_json
    from tests.fakes.echo import EchoHandler, EchoState, Reply

    page = Reply(200, {"Content-Type": "application/json"}, b"[" + b'{"id": "x"},' * 1000 + b'{"id": "y"}]')
    with LoopbackServer(EchoHandler, EchoState(replies=[page])) as api:
        monkeypatch.setenv("PREFECT_API_URL", api.base_url)
        with pytest.raises(ServiceError) as refused:
            api_json("POST", "/flow_runs/filter", {"limit": 200}, limit=1024)
    message = str(refused.value)
    assert f"{api.base_url}/flow_runs/filter" in message and "more than the 1.0 KB" in message
    assert "PREFECT_API_URL points at a Prefect server" in message and not refused.value.transient


def test_a_probe_of_the_prefect_server_reads_at_most_its_bound_of_an_answer():
    """The health and settings probes read a few KB: an endless or huge answer is cut off, not read whole."""
    from flows.prefect_api import MAX_PROBE_ANSWER_BYTES, api_answer
    from tests.fakes.echo import EchoHandler, EchoState, Reply

    huge = Reply(200, {"Content-Type": "application/json"}, b"x" * (3 * MAX_PROBE_ANSWER_BYTES))
    with LoopbackServer(EchoHandler, EchoState(replies=[huge])) as api:
        status, body = api_answer(f"{api.base_url}/api", "/health", 5.0) or (None, b"")
    assert status == 200 and len(body) == MAX_PROBE_ANSWER_BYTES


@pytest.mark.parametrize("command", [["status", "JOB"], ["list"], ["prune", "--yes"]])
def test_a_prefect_api_refusing_the_login_stops_status_list_and_prune_in_one_line_naming_the_setting(
    command, tmp_path, monkeypatch, capsys
):
    """A proxy or server asking for credentials on every call but ``/health``: the state of a job is never shown
    as Unknown nor a job removed; the command says what to set, without the login, exit 2."""
    from flows.run import EXIT_USAGE, main
    from tasks.job.record import JobRecord, changing_record
    from tests.fakes.echo import EchoHandler, EchoState, Reply
    from tests.support.jobs import made_old

    job_id = "00000000-0000-0000-0000-000000000401"
    with changing_record(tmp_path / "jobs" / job_id, new=JobRecord(job_id=job_id, enabled_steps=["local_import"])):
        pass
    made_old(tmp_path / "jobs" / job_id)
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "dupflow:Wrong-Passw0rd")
    refused = Reply(401, body=b'{"exception_message": "Unauthorized"}')
    with LoopbackServer(EchoHandler, EchoState(replies=[refused] * 8)) as api:
        monkeypatch.setenv("PREFECT_API_URL", f"{api.base_url}/api")
        argv = [job_id if word == "JOB" else word for word in command]
        assert main([*argv, "--jobs-dir", str(tmp_path / "jobs")]) == EXIT_USAGE
    said = capsys.readouterr()
    (line,) = said.err.splitlines()
    assert f"the Prefect API {api.base_url}/api refuses this command's login (HTTP 401)" in line
    assert "set PREFECT_API_AUTH_STRING to the user:password" in line and "Wrong-Passw0rd" not in said.out + line
    assert (tmp_path / "jobs" / job_id / "job.json").is_file()
