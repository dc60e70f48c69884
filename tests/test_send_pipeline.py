"""The send step's FHIR modes end to end through the command line, to the real sekmet-fhir server: from
``local_import`` (plain and zstd inputs) and after the ``pseudonymizer``. What the server holds afterwards is read
back by searching it, as the receiving site would."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest

from flows.run import EXIT_OK
from tests.conftest import run_cli
from tests.sekmet import PASSWORD, USERNAME, start_sekmet
from tests.test_job_cli import job_file, only_job_dir
from tests.test_pseudonymizer_client import server_side
from tests.test_send_direct import generated, stored_as_sent, write_ndjson
from tests.test_send_transfer import ORGANIZATION, plain_content, read_back_as_the_dsf

pytestmark = pytest.mark.usefixtures("prefect_api")


@pytest.fixture(scope="module")
def sekmet(tmp_path_factory):
    server = start_sekmet(tmp_path_factory.mktemp("sekmet"))
    yield server
    server.stop()


def write_config(tmp_path: Path, steps: list[str], send: str, *, compress: bool, pseudonymizer_url: str = "") -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        f"pipeline:\n  enabled_steps: {orjson.dumps(steps).decode()}\njobs_dir: {tmp_path / 'jobs'}\n"
        f"compression:\n  enabled: {str(compress).lower()}\n  level: fastest\n"
        "retry:\n  initial_backoff_ms: 10\n  max_backoff_ms: 50\n"
        f"services:\n  local_import:\n    dir: {tmp_path / 'in'}\n"
        + (f"  pseudonymizer:\n    url: {pseudonymizer_url}\n" if pseudonymizer_url else "")
        + f"  send:\n{send}"
    )
    return config


def direct(sekmet) -> str:
    return (
        f"    send_as: direct_resource_load\n    url: {sekmet.url}\n    batch_size: 7\n"
        f"    auth:\n      username: {USERNAME}\n      password: {PASSWORD}\n"
    )


def transfer(sekmet, project: str) -> str:
    return (
        f"    send_as: transfer_load\n    url: {sekmet.url}\n"
        f"    auth:\n      username: {USERNAME}\n      password: {PASSWORD}\n"
        f"    transfer:\n      project_identifier: {project}\n      organization_identifier: {ORGANIZATION}\n"
    )


def start(config: Path, tmp_path: Path) -> Path:
    result = run_cli("start", str(config), "--no-progress")
    assert result.returncode == EXIT_OK, result.stderr
    job_dir = only_job_dir(tmp_path / "jobs")
    assert job_file(job_dir)["state"] == "Completed"
    return job_dir


@pytest.mark.parametrize("zstd", [False, True])
def test_direct_load_from_local_import_stores_every_resource_once(sekmet, tmp_path, zstd):
    resources = generated(40, f"e2e-{uuid.uuid4().hex[:8]}")
    write_ndjson(tmp_path / "in" / "batch-1.ndjson", resources, zstd=zstd)
    start(write_config(tmp_path, ["local_import", "send"], direct(sekmet), compress=zstd), tmp_path)
    stored_as_sent(sekmet, resources)


def test_direct_load_after_the_pseudonymizer_stores_what_the_service_made(sekmet, pseudonymizer_fake, tmp_path):
    resources = [r for r in generated(30, f"ps-{uuid.uuid4().hex[:8]}") if r["resourceType"] == "Patient"]
    write_ndjson(tmp_path / "in" / "patients.ndjson", resources)
    steps = ["local_import", "pseudonymizer", "send"]
    config = write_config(tmp_path, steps, direct(sekmet), compress=True, pseudonymizer_url=pseudonymizer_fake.base_url)
    start(config, tmp_path)
    stored_as_sent(sekmet, [server_side(r, pseudonymizer_fake) for r in resources])


@pytest.mark.parametrize("zstd", [False, True])
def test_transfer_from_local_import_is_read_back_as_the_dsf_would(sekmet, tmp_path, zstd):
    project = f"E2E_{uuid.uuid4().hex[:8]}"
    write_ndjson(tmp_path / "in" / "batch-1.ndjson", generated(25, project), zstd=zstd)
    job_dir = start(
        write_config(tmp_path, ["local_import", "send"], transfer(sekmet, project), compress=zstd), tmp_path
    )
    files = read_back_as_the_dsf(sekmet, project)
    imported = sorted((job_dir / "import").iterdir())
    assert list(files) == [path.name.removesuffix(".zst") for path in imported]
    for path in imported:
        assert files[path.name.removesuffix(".zst")] == plain_content(path)
