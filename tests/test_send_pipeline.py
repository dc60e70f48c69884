"""The send step's FHIR modes end to end through the command line, to the real sekmet-fhir server: from
``local_import`` (plain and zstd inputs) and after the ``pseudonymizer``. What the server holds afterwards is read
back by searching it, as the receiving site would."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from flows.run import EXIT_OK
from tests.conftest import run_cli
from tests.sekmet import PASSWORD, USERNAME, start_sekmet
from tests.support.jobs import job_file, only_job_dir
from tests.support.pseudonymization import server_side
from tests.support.sending import generated, stored_as_sent, write_ndjson
from tests.support.sending import ORGANIZATION, plain_content, read_back_as_the_dsf

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


@pytest.fixture(scope="module")
def sekmet(tmp_path_factory):
    server = start_sekmet(tmp_path_factory.mktemp("sekmet"))
    yield server
    server.stop()


def send_config(tmp_path: Path, steps: list[str], send: dict, *, compress: bool, **services) -> dict:
    """The configuration tree of ``steps`` from local_import of tmp_path/in to send as ``send`` says;
    ``services`` are further service blocks."""
    return {
        "pipeline": {"enabled_steps": steps},
        "compression": {"enabled": compress, "level": "fastest"},
        "retry": {"initial_backoff_ms": 10, "max_backoff_ms": 50},
        "services": {"local_import": {"dir": tmp_path / "in"}, **services, "send": send},
    }


def direct(sekmet) -> dict:
    return {
        "send_as": "direct_resource_load",
        "url": sekmet.url,
        "batch_size": 7,
        "auth": {"username": USERNAME, "password": PASSWORD},
    }


def transfer(sekmet, project: str) -> dict:
    return {
        "send_as": "transfer_load",
        "url": sekmet.url,
        "auth": {"username": USERNAME, "password": PASSWORD},
        "transfer": {"project_identifier": project, "organization_identifier": ORGANIZATION},
    }


def start(config: Path, tmp_path: Path) -> Path:
    result = run_cli("start", str(config), "--no-progress")
    assert result.returncode == EXIT_OK, result.stderr
    job_dir = only_job_dir(tmp_path / "jobs")
    assert job_file(job_dir)["state"] == "Completed"
    return job_dir


@pytest.mark.parametrize("zstd", [False, True])
def test_direct_load_from_local_import_stores_every_resource_once(sekmet, tmp_path, write_config, zstd):
    resources = generated(40, f"e2e-{uuid.uuid4().hex[:8]}")
    write_ndjson(tmp_path / "in" / "batch-1.ndjson", resources, zstd=zstd)
    config = write_config(send_config(tmp_path, ["local_import", "send"], direct(sekmet), compress=zstd))
    job_dir = start(config, tmp_path)
    stored_as_sent(sekmet, resources)
    # The job's last words name where the data went, not the import folder as the job's "outputs".
    sent_to = f"sent 1 file (direct_resource_load) to {sekmet.url}; the data sent are in {job_dir / 'import'}"
    assert job_file(job_dir)["state_message"] == sent_to


def test_direct_load_after_the_pseudonymizer_stores_what_the_service_made(
    sekmet, pseudonymizer_fake, tmp_path, write_config
):
    resources = [r for r in generated(30, f"ps-{uuid.uuid4().hex[:8]}") if r["resourceType"] == "Patient"]
    write_ndjson(tmp_path / "in" / "patients.ndjson", resources)
    steps = ["local_import", "pseudonymizer", "send"]
    pseudonymizer = {"url": pseudonymizer_fake.base_url}
    config = write_config(send_config(tmp_path, steps, direct(sekmet), compress=True, pseudonymizer=pseudonymizer))
    start(config, tmp_path)
    stored_as_sent(sekmet, [server_side(r, pseudonymizer_fake) for r in resources])


@pytest.mark.parametrize("zstd", [False, True])
def test_transfer_from_local_import_is_read_back_as_the_dsf_would(sekmet, tmp_path, write_config, zstd):
    project = f"E2E_{uuid.uuid4().hex[:8]}"
    write_ndjson(tmp_path / "in" / "batch-1.ndjson", generated(25, project), zstd=zstd)
    config = write_config(send_config(tmp_path, ["local_import", "send"], transfer(sekmet, project), compress=zstd))
    job_dir = start(config, tmp_path)
    files = read_back_as_the_dsf(sekmet, project)
    imported = sorted((job_dir / "import").iterdir())
    assert list(files) == [path.name.removesuffix(".zst") for path in imported]
    for path in imported:
        assert files[path.name.removesuffix(".zst")] == plain_content(path)
