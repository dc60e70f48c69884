"""A result-file download builds its client where it runs, from the step's settings: run on its own (as on a Dask
worker) it downloads and closes its client; run beside others in one process it shares theirs, and the last
holder closes it."""

from __future__ import annotations

import httpx
import pytest

from tasks.job.contract import StepInput
from tasks.extractor import _download_clients, download_client, download_result_file
from tests.conftest import TESTDATA
from tests.fakes.extraction_server import ExtractionServer, start_extraction_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

SOURCE = TESTDATA / "validation" / "Patient.ndjson"


@pytest.fixture
def torch(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "core.ndjson").write_bytes(SOURCE.read_bytes())
    with start_extraction_server(serve_dir=served) as server:
        yield server


def result_url(server: ExtractionServer) -> str:
    (output,) = httpx.get(server.served_status_url).json()["output"]
    return output["url"]


def download_step(tmp_path, server: ExtractionServer, write_config) -> StepInput:
    config = write_config(
        {
            "pipeline": {"enabled_steps": ["extractor"]},
            "compression": {"enabled": False},
            "services": {"extractor": {"base_url": server.base_url}},
        }
    )
    job_dir = tmp_path / "jobs" / "download-job"
    return StepInput(job_id=job_dir.name, job_dir=str(job_dir), position=0, step="extractor", config_path=str(config))


def test_a_download_run_on_its_own_builds_its_client_and_closes_it(tmp_path, torch, write_config):
    step = download_step(tmp_path, torch, write_config)

    downloaded = download_result_file(step, result_url(torch), "core.ndjson")

    assert (step.output_dir / "core.ndjson").read_bytes() == SOURCE.read_bytes()
    assert downloaded.resources == len(SOURCE.read_bytes().splitlines())
    assert not _download_clients, "the download's client outlived it"


def test_downloads_beside_the_step_share_its_client_and_the_last_holder_closes_it(tmp_path, torch, write_config):
    step = download_step(tmp_path, torch, write_config)
    url = result_url(torch)

    with download_client(step, needs_token=False) as client:
        download_result_file(step, url, "core.ndjson")
        download_result_file(step, url, "again.ndjson")
        assert len(_download_clients) == 1 and not client.http.is_closed

    assert client.http.is_closed and not _download_clients
    assert (step.output_dir / "again.ndjson").read_bytes() == SOURCE.read_bytes()
