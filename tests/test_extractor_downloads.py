"""A result-file download builds its client where it runs, from the step's settings: run on its own (as on a Dask
worker) it downloads and closes its client; run beside others in one process it shares theirs, and the last
holder closes it."""

from __future__ import annotations

import httpx
import pytest

import tasks.extractor
from tasks.clients.extraction_server import ExtractionServerClient
from tasks.job.contract import StepInput
from tasks.extractor import download_client, download_result_file
from tasks.job.filework import map_files
from tasks.streams.fanout import results_or_raise
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


@pytest.fixture
def built(monkeypatch) -> list[ExtractionServerClient]:
    """Every extraction server client the downloads build."""
    clients = []

    class Recorded(ExtractionServerClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            clients.append(self)

    monkeypatch.setattr(tasks.extractor, "ExtractionServerClient", Recorded)
    return clients


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


def test_a_download_run_on_its_own_builds_its_client_and_closes_it(tmp_path, torch, write_config, built):
    step = download_step(tmp_path, torch, write_config)

    downloaded = download_result_file(step, result_url(torch), "core.ndjson")

    assert (step.output_dir / "core.ndjson").read_bytes() == SOURCE.read_bytes()
    assert downloaded.resources == len(SOURCE.read_bytes().splitlines())
    assert len(built) == 1 and built[0].http.is_closed, "the download's client outlived it"


def test_downloads_beside_the_step_share_its_client_and_the_last_holder_closes_it(tmp_path, torch, write_config, built):
    step = download_step(tmp_path, torch, write_config)
    url = result_url(torch)

    with download_client(step) as client:
        download_result_file(step, url, "core.ndjson")
        download_result_file(step, url, "again.ndjson")
        assert built == [client] and not client.http.is_closed

    assert client.http.is_closed and built == [client]
    assert (step.output_dir / "again.ndjson").read_bytes() == SOURCE.read_bytes()


def test_downloads_the_step_runs_on_threads_share_its_client(tmp_path, torch, write_config, built):
    step = download_step(tmp_path, torch, write_config)
    url = result_url(torch)

    with download_client(step) as client:
        outcomes = map_files(download_result_file, [(step, url, "core.ndjson"), (step, url, "again.ndjson")], 2)

    assert [f.name for f in results_or_raise(outcomes)] == ["core.ndjson", "again.ndjson"]
    assert built == [client] and client.http.is_closed
