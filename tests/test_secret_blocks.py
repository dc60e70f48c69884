"""Credentials from Prefect Secret blocks (``${prefect-secret:NAME}``), against the real test Prefect API: the block's
text reaches the service and nothing else (no job file, log, artifact, flow-run parameter or Prefect database file),
and every way it can go wrong names the key, the block and the fix."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys

import pytest

from config.errors import ConfigError
from config.loader import load_settings
from tests.support.ports import free_port
from tasks.core.redaction import redact
from tests.conftest import TESTDATA, extraction_tree, run_cli, seed_prefect_home
from tests.fakes._server import LoopbackServer
from tests.fakes.echo import EchoHandler, EchoState, Reply
from tests.fakes.extraction_server import start_extraction_server
from tests.support.controls import finished, home_command
from tests.support.prefect_servers import kill_servers_of, stop_runner_of
from tests.support.jobs import job_file, read_artifacts
from tests.support.filesystem import files_under
from tests.support.leaks import database_texts, forms

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

PASSWORD = "pw-block-5d2e71-from-prefect"
BLOCK = "dupflow-test-torch-password"
REFERENCE = "${prefect-secret:" + BLOCK + "}"
CRTDL = TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json"


@pytest.fixture
def secret_block(prefect_api) -> str:
    """The Secret block BLOCK holding PASSWORD in the test Prefect API."""
    from prefect.blocks.system import Secret

    Secret(value=PASSWORD).save(BLOCK, overwrite=True)
    return BLOCK


def extractor_tree(base_url: str, password: str = REFERENCE) -> dict:
    return extraction_tree(base_url, auth={"username": "researcher", "password": password})


def basic_header(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def prefect_records_of(job_id: str, flow_run_ids: list[str]) -> str:
    """Everything the Prefect API holds of the job's flow runs, as text: parameters, log lines, artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    texts = [json.dumps(read_artifacts(f"job-{job_id}"))]
    with get_client(sync_client=True) as client:
        for flow_run_id in flow_run_ids:
            texts.append(json.dumps(client.read_flow_run(flow_run_id).parameters))
            log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            texts.extend(log.message for log in client.read_logs(log_filter=log_filter, limit=200))
    return "\n".join(texts)


def test_a_secret_block_supplies_the_extraction_password_and_is_stored_nowhere(
    tmp_path, write_config, secret_block, prefect_api
):
    expected = basic_header("researcher", PASSWORD)
    with start_extraction_server(auth_check=lambda headers: headers.get("authorization") == expected) as torch:
        config = write_config(extractor_tree(torch.base_url))
        outputs = [run_cli("config", "check", str(config))]
        assert outputs[0].returncode == 0, outputs[0].stderr
        outputs.append(run_cli("start", str(config), str(CRTDL), "--no-progress"))
        assert outputs[-1].returncode == 0, outputs[-1].stderr
        assert len(torch.state.submissions) == 1  # the fake answers 401 to any other password

    (job_dir,) = (tmp_path / "jobs").iterdir()
    record = job_file(job_dir)
    assert record["state"] == "Completed"
    printed = "".join(output.stdout + output.stderr for output in outputs)
    assert re.search(r"services\.extractor\.auth\.password +\*{8} +\(file\)", printed)  # config check masks it
    in_prefect = prefect_records_of(job_dir.name, record["flow_run_ids"])
    assert "Beginning flow run" in printed and job_dir.name in in_prefect  # logs and artifacts were read
    stores = [*files_under(job_dir), *prefect_api["database"].parent.glob(prefect_api["database"].name + "*")]
    assert (job_dir / "job.log").is_file() and any(path.name.endswith(".db") for path in stores)
    for leaked in (PASSWORD, expected.removeprefix("Basic ")):
        assert leaked not in printed and leaked not in in_prefect
        for path in stores:
            assert leaked.encode() not in path.read_bytes(), f"the block's password leaked into {path}"


def test_the_extraction_commands_read_a_secret_block_from_the_homes_own_server(
    tmp_path, write_config, prefect_database
):
    """Without PREFECT_API_URL, start and config check read Secret blocks from the local server the command line
    keeps (started if need be); the extraction commands did not look for it: PREFECT_API_URL is not set."""
    from flows.prefect_server import stop_server

    home = seed_prefect_home(tmp_path / "home", prefect_database)
    config = write_config(extractor_tree("http://127.0.0.1:9"))
    try:
        code, said = finished(home_command("extraction", "list", str(config), home=home))
    finally:
        stop_runner_of(home)
        stop_server(home)
        kill_servers_of(home)
    assert code == 2
    assert re.search(rf"the Prefect API http://127\.0\.0\.1:\d+/api has no Secret block named {BLOCK}", said), said


def test_the_block_value_is_loaded_into_the_settings_and_redacted(write_config, secret_block):
    loaded = load_settings(write_config(extractor_tree("http://127.0.0.1:9")), env={})
    assert loaded.settings.services.extractor.auth.password.get_secret_value() == PASSWORD
    assert loaded.sources["services.extractor.auth.password"] == "file"
    assert PASSWORD not in redact(f"the server said: wrong password {PASSWORD}")


def test_a_missing_block_names_the_key_the_block_and_the_fix(write_config):
    config = write_config(extractor_tree("http://127.0.0.1:9", "${prefect-secret:dupflow-test-no-such-block}"))
    with pytest.raises(ConfigError) as raised:
        load_settings(config, env={})
    (problem,) = raised.value.problems
    assert problem.startswith("services.extractor.auth.password: ${prefect-secret:dupflow-test-no-such-block}")
    assert "has no Secret block named dupflow-test-no-such-block; create it" in problem


def test_a_missing_blocks_message_shows_the_api_without_its_password(write_config, prefect_api):
    """A PREFECT_API_URL may carry user:password (a server behind a proxy's Basic Auth): the message names the
    server as every other message does, without them."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = prefect_api["api_url"].replace("http://", "http://admin:api-pw-7c41e0@")
    config = write_config(extractor_tree("http://127.0.0.1:9", "${prefect-secret:dupflow-test-no-such-block}"))
    with temporary_settings(updates={PREFECT_API_URL: api}), pytest.raises(ConfigError) as raised:
        load_settings(config, env={})
    (problem,) = raised.value.problems
    assert f"the Prefect API {prefect_api['api_url']} has no Secret block named dupflow-test-no-such-block" in problem
    assert "api-pw-7c41e0" not in problem and "admin" not in problem


def test_a_missing_block_does_no_harm_when_the_environment_sets_the_key(write_config):
    config = write_config(extractor_tree("http://127.0.0.1:9", "${prefect-secret:dupflow-test-no-such-block}"))
    loaded = load_settings(config, env={"APP_SERVICES_EXTRACTOR_AUTH_PASSWORD": "pw-from-env"})
    assert loaded.settings.services.extractor.auth.password.get_secret_value() == "pw-from-env"


def test_a_block_that_holds_no_text_is_refused(write_config):
    from prefect.blocks.system import Secret

    Secret(value={"user": "u", "password": "pw-in-a-dict-31c"}).save("dupflow-test-dict-secret", overwrite=True)
    config = write_config(extractor_tree("http://127.0.0.1:9", "${prefect-secret:dupflow-test-dict-secret}"))
    with pytest.raises(ConfigError) as raised:
        load_settings(config, env={})
    assert "the Secret block dupflow-test-dict-secret holds a dict, not a text" in str(raised.value)
    assert "pw-in-a-dict-31c" not in str(raised.value)


def test_a_command_whose_blocks_live_on_an_unreachable_api_says_so_in_one_line(write_config):
    """``config check`` and ``start`` find the jobs' server before they read a block: a dead one stops them there."""
    config = write_config(extractor_tree("http://127.0.0.1:9"))
    dead_api = f"http://127.0.0.1:{free_port()}/api"
    result = run_cli("config", "check", str(config), env={"PREFECT_API_URL": dead_api})
    assert result.returncode == 2
    assert f"the Prefect API {dead_api} (PREFECT_API_URL) does not answer" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_loader_without_a_prefect_api_names_the_key_the_block_and_the_setting(write_config, tmp_path):
    """Outside a command (the loader as a library, with no server known: no PREFECT_API_URL, and a home whose
    Prefect profile names none), the error names key, block and fix."""
    config = write_config(extractor_tree("http://127.0.0.1:9"))
    env = {name: value for name, value in os.environ.items() if not name.startswith(("APP_", "PREFECT_API_URL"))}
    env["PREFECT_HOME"] = str(tmp_path / "home-without-a-server")
    code = f"from config.loader import load_settings; load_settings({str(config)!r})"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"services.extractor.auth.password: {REFERENCE}: PREFECT_API_URL is not set" in result.stderr
    assert "set it to the API address of the server holding the block" in result.stderr


def test_a_block_password_echoed_in_a_401_reaches_no_prefect_row_no_file_and_no_artifact(
    tmp_path, write_config, secret_block, prefect_api
):
    """The issue's case: the password comes from a Secret block, the server quotes the credentials back in its 401."""
    echoed = f"denied: Authorization: {basic_header('researcher', PASSWORD)}, password={PASSWORD}".encode()
    with LoopbackServer(EchoHandler, EchoState(replies=[Reply(401, {}, echoed)] * 10)) as torch:
        config = write_config(extractor_tree(torch.base_url))
        failed = run_cli("start", str(config), str(CRTDL), "--no-progress")
        assert torch.state.requests, "the job never reached the server"

    assert failed.returncode == 1, failed.stderr
    (job_dir,) = (tmp_path / "jobs").iterdir()
    rows = database_texts(prefect_api["database"])
    assert job_dir.name.encode() in rows and b"401" in rows  # the failure is there, told without the secret
    home = prefect_api["database"].parent
    stores = {p: p.read_bytes() for p in [*files_under(job_dir), *files_under(home)] if p.is_file()}
    for leak in [*forms(PASSWORD), *forms(f"researcher:{PASSWORD}")]:
        assert leak not in rows, f"{leak!r} in the Prefect database (logs, states, artifacts, parameters)"
        assert leak.decode() not in failed.stdout + failed.stderr
        for path, content in stores.items():
            assert leak not in content, f"{leak!r} in {path}"
