"""Secrets reach the services and nowhere else: not the Prefect database, artifacts, logs or job files."""

from __future__ import annotations

import base64

import pytest

from tests.conftest import run_cli
from tests.support.filesystem import files_under

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

SECRETS = {
    "DUPFLOW_TEST_PASSWORD": "pw-4f1c9e-in-file-via-var",
    "APP_SERVICES_PSEUDONYMIZER_AUTH_API_KEY": "key-77ab01-from-env",
    "APP_SERVICES_SEND_AUTH_OAUTH_CLIENT_SECRET": "cs-90d2aa-from-env",
    "APP_SERVICES_SEND_S3_SECRET_ACCESS_KEY": "s3-5be4c1-from-env",
    "APP_SERVICES_SEND_S3_ACCESS_KEY_ID": "AKIA-3e9f00-from-env",
}
CONFIG = """
services:
  extractor:
    base_url: http://127.0.0.1:9
    auth:
      username: researcher
      password: ${DUPFLOW_TEST_PASSWORD}
  pseudonymizer:
    url: http://127.0.0.1:9
  send:
    auth:
      oauth_issuer_uri: http://127.0.0.1:9/realms/x
      oauth_client_id: dupflow
pipeline:
  enabled_steps: [local_import, wait]
jobs_dir: %s
"""


def test_no_secret_value_appears_in_prefect_artifacts_logs_or_the_job_directory(tmp_path, prefect_api):
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.ndjson").write_text('{"resourceType":"Patient","id":"1"}\n')
    config = tmp_path / "secret.yaml"
    config.write_text(CONFIG % (tmp_path / "jobs"))

    outputs = [run_cli("config", "check", str(config), env=SECRETS)]
    outputs.append(run_cli("start", str(config), str(source), "--no-progress", env=SECRETS))
    assert outputs[-1].returncode == 0, outputs[-1].stderr
    (job_dir,) = (tmp_path / "jobs").iterdir()
    outputs.append(run_cli("status", str(job_dir), env=SECRETS))
    outputs.append(run_cli("continue", str(job_dir), "--no-progress", env=SECRETS))
    assert outputs[-1].returncode == 0, outputs[-1].stderr
    assert "state:     Completed" in outputs[-1].stdout + run_cli("status", str(job_dir), env=SECRETS).stdout

    printed = "".join(o.stdout + o.stderr for o in outputs)
    assert "Beginning flow run" in printed  # the run's logs were captured
    assert "********" in printed  # config check showed the secrets masked
    stores = [*files_under(job_dir), *prefect_api["database"].parent.glob(prefect_api["database"].name + "*")]
    assert any(p.name.endswith(".db") for p in stores)
    for secret in SECRETS.values():
        assert secret not in printed
        for path in stores:
            assert secret.encode() not in path.read_bytes(), f"{secret} leaked into {path}"


def test_a_secret_given_on_the_command_line_is_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("pipeline:\n  enabled_steps: [local_import]\n")
    result = run_cli("start", str(config), str(tmp_path), "--set", "services.send.s3.secret_access_key=abc")
    assert result.returncode == 2
    assert "services.send.s3.secret_access_key (in --set): is a secret" in result.stderr
    assert "${VAR}" in result.stderr and "APP_SERVICES_SEND_S3_SECRET_ACCESS_KEY" in result.stderr
    assert "abc" not in result.stderr


@pytest.mark.slow
def test_credentials_used_against_services_and_on_an_error_path_leak_nowhere(tmp_path, prefect_api):
    from tests.conftest import TESTDATA
    from tests.fakes._server import LoopbackServer
    from tests.fakes.extraction_server import start_extraction_server
    from tests.fakes.oauth import REALM_PATH, OAuthHandler, OAuthState
    from tests.fakes.pseudonymizer import start_pseudonymizer

    secrets = {
        "EXTRACTOR_PW": "pw-extractor-8c1d",
        "APP_SERVICES_EXTRACTOR_AUTH_API_KEY": "key-extractor-2b7e",
        "PSEUDO_KEY": "key-pseudo-6a0f",
        "APP_SERVICES_PSEUDONYMIZER_AUTH_OAUTH_CLIENT_SECRET": "cs-pseudo-93e1",
    }
    oauth_state = OAuthState(
        client_id="dupflow-client", client_secret=secrets["APP_SERVICES_PSEUDONYMIZER_AUTH_OAUTH_CLIENT_SECRET"]
    )
    pseudonymizer = start_pseudonymizer(api_key=secrets["PSEUDO_KEY"], fail_next=1, fail_status=500)
    with start_extraction_server() as torch, LoopbackServer(OAuthHandler, oauth_state) as oauth:
        config = tmp_path / "c.yaml"
        config.write_text(
            "services:\n"
            f"  extractor:\n    base_url: {torch.base_url}\n    polling_interval: PT1S\n"
            "    max_polling_interval: PT1S\n    file_ready_interval: PT1S\n"
            "    auth:\n      username: researcher\n      password: ${EXTRACTOR_PW}\n"
            f"  pseudonymizer:\n    url: {pseudonymizer.base_url}\n"
            f"    auth:\n      oauth_issuer_uri: {oauth.base_url}{REALM_PATH}\n"
            "      oauth_client_id: dupflow-client\n      api_key: ${PSEUDO_KEY}\n"
            "pipeline:\n  enabled_steps: [extractor, pseudonymizer]\n"
            "retry:\n  max_attempts: 3\n  initial_backoff_ms: 10\n  max_backoff_ms: 50\n"
            f"jobs_dir: {tmp_path / 'jobs'}\n"
        )
        crtdl = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"
        result = run_cli("start", str(config), str(crtdl), "--no-progress", env=secrets)
        assert result.returncode == 0, result.stderr
        assert (torch.state.requests[0].header("authorization") or "").startswith("Basic ")
        assert any(r.headers.get("authorization", "").startswith("Bearer ") for r in pseudonymizer.state.requests)
        issued_tokens = list(oauth_state._issued)
    pseudonymizer.stop()

    (job_dir,) = (tmp_path / "jobs").iterdir()
    leaked = [*secrets.values(), *issued_tokens, base64.b64encode(b"researcher:" + secrets["EXTRACTOR_PW"].encode())]
    stores = [*files_under(job_dir), *prefect_api["database"].parent.glob(prefect_api["database"].name + "*")]
    printed = (result.stdout + result.stderr).encode()
    assert b"retrying" in printed  # the pseudonymizer's 500 went through the error path
    for secret in leaked:
        value = secret.encode() if isinstance(secret, str) else secret
        assert value not in printed
        for path in stores:
            assert value not in path.read_bytes(), f"a credential leaked into {path}"
