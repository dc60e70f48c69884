"""The extraction client against the in-process fake TORCH server, on a simulated clock, and the fake's own REST
API driven by hand."""

from __future__ import annotations

import base64
import time

import httpx

from config.services import ExtractorSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.extraction_server import ExtractionServerClient
from tests.conftest import TESTDATA
from tests.fakes.extraction_server import ExtractionServer

CRTDL = (TESTDATA / "crtdl" / "CRTDL_diagnosis_basic.json").read_bytes()
FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)
LONG_JOB = {"PENDING": 2.0, "RUNNING_GET_COHORT": 3.0, "RUNNING_PROCESS_BATCH": 4.0, "RUNNING_PROCESS_CORE": 2.0}


class SimulatedTime:
    """A clock the fake server and the client share; ``sleep`` moves it instead of waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def extractor_settings(base_url: str, **overrides) -> ExtractorSettings:
    values = (
        dict(base_url=base_url, polling_interval="PT1S", max_polling_interval="PT8S", extraction_timeout="PT60S")
        | overrides
    )
    return ExtractorSettings(**values)


def client_for(
    base_url: str, sim: SimulatedTime, tls: TlsSettings | None = None, **overrides
) -> ExtractionServerClient:
    settings = extractor_settings(base_url, **overrides)
    return ExtractionServerClient(settings, tls or TlsSettings(), clock=sim, sleep=sim.sleep)


CRTDL_DIR = TESTDATA / "crtdl"


def kickoff_body(crtdl: bytes, patients: tuple[str, ...] = ()) -> dict:
    parameters = [{"name": "crtdl", "valueBase64Binary": base64.b64encode(crtdl).decode()}]
    parameters += [{"name": "patient", "valueString": p} for p in patients]
    return {"resourceType": "Parameters", "parameter": parameters}


def submit(client: httpx.Client, srv: ExtractionServer, crtdl_name: str = "CRTDL_diagnosis_basic.json", **kw) -> str:
    response = client.post(
        f"{srv.base_url}/fhir/$extract-data",
        json=kickoff_body((CRTDL_DIR / crtdl_name).read_bytes(), **kw),
        headers={"Content-Type": "application/fhir+json", "Accept": "application/fhir+json"},
    )
    assert response.status_code == 202, response.text
    return response.headers["Content-Location"]


def poll_until_done(client: httpx.Client, status_url: str, timeout: float = 60.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(status_url, headers={"Accept": "application/json"})
        if response.status_code != 202:
            return response
        time.sleep(0.02)
    raise AssertionError("job did not finish")
