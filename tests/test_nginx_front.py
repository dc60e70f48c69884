"""The clients through a real nginx before the fakes, as hospitals run their services (tests/support/nginx.py): TLS
ending at nginx, request bodies passed on as they come (``proxy_request_buffering off``), and nginx's own body limit
(``client_max_body_size``), whose 413 names the fix. The fakes read a request body by its Content-Length only, so a
body nginx passes on chunked (as it does any body the client sent chunked) is refused: the extraction kick-off went
out chunked before it declared its length."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from config.settings import TlsSettings
from tasks.clients.downloads import download_ndjson, wait_until_available
from tasks.clients.errors import ServiceError
from tasks.core.errors import StepError
from tasks.pseudonymizer import pseudonymize_path
from tests.fakes.extraction_server import ExtractionServer, start_extraction_server
from tests.fakes.fhir_server import start_fhir_fake
from tests.fakes.pseudonymizer import start_pseudonymizer
from tests.support.extraction import CRTDL, FAST_RETRY, SimulatedTime, client_for
from tests.support.ndjson import read_output, write_lines
from tests.support.nginx import NginxFront, Upstream
from tests.support.pseudonymization import observation_bundle, open_service, patient, server_side
from tests.support.sending import MB, generated, send_file, transfer, write_ndjson

pytestmark = pytest.mark.slow

TIGHT = "8k"  # the body limit of the fronts named "tight …"
SIM = SimulatedTime()  # the fake extraction server's clock, and its clients': polling takes no real time


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict]:
    servers = {
        "extraction": start_extraction_server(clock=SIM),
        "pseudonymizer": start_pseudonymizer(),
        "fhir": start_fhir_fake(),
    }
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def nginx_upstreams(fakes) -> dict[str, Upstream]:
    """Each fake behind nginx twice: with nginx's default body limit (1m), and with a tight one."""
    fronts = {name: Upstream(server.port) for name, server in fakes.items()}
    return fronts | {f"tight {name}": Upstream(server.port, TIGHT) for name, server in fakes.items()}


def tls(front: NginxFront) -> TlsSettings:
    return TlsSettings(ca_cert_path=front.ca_cert_path)


# --- the extraction ------------------------------------------------------------------------------------------


def test_an_extraction_through_nginx_kicks_off_polls_and_downloads(nginx_front, fakes, tmp_path):
    """Kick-off, polling and every download (as the step does them) over https through nginx, request bodies not
    buffered: the kick-off reaches the server, which reads a body by its Content-Length only, with its length (before
    a2d6640 it went out chunked, nginx passed it on chunked, and the server answered 411)."""
    torch: ExtractionServer = fakes["extraction"]
    url = nginx_front.urls["extraction"]
    with client_for(url, SIM, tls(nginx_front)) as client:
        handle = client.submit(CRTDL)
        urls = client.poll_until_complete(handle)
        files = [download_file(client.http, file_url, tmp_path) for file_url in urls]

    (submission,) = [s for s in torch.state.submissions if s.job_id == handle.job_id]
    assert submission.status == 202 and handle.status_url.startswith(f"{url}/fhir/__status/")
    assert "transfer-encoding" not in submission.headers
    assert submission.headers["content-length"] == str(len(submission.body))
    assert urls and all(file_url.startswith(f"{url}/") for file_url in urls)
    assert all(stats.resources > 0 for stats in files)


def download_file(http, url: str, folder: Path):
    wait_until_available(http, url, checks=3, interval=timedelta(seconds=1))
    return download_ndjson(
        http,
        url,
        folder / url.rsplit("/", 1)[-1],
        level=None,
        max_line_bytes=MB,
        stall_timeout=timedelta(seconds=30),
        retry=FAST_RETRY,
    )


# --- the pseudonymizer ---------------------------------------------------------------------------------------


def pseudonymize_file(url: str, front: NginxFront, source: Path, dest: Path, **options):
    with open_service(url, tls=tls(front), **options) as service:
        written = {"level": "fastest", "max_line_bytes": 16 * MB}
        return pseudonymize_path(source, dest, service, **written, concurrency=4)


def test_a_file_is_pseudonymized_through_nginx(nginx_front, fakes, tmp_path):
    """Resources and a Bundle split in chunks (each below nginx's default limit of 1 MB), four requests at a time,
    over https through nginx."""
    fakes["pseudonymizer"].state.reset()
    resources = [patient(i) for i in range(12)] + [observation_bundle(count=6, pad=300_000)]
    source = write_lines(tmp_path / "in.ndjson", resources)

    counts = pseudonymize_file(
        nginx_front.urls["pseudonymizer"], nginx_front, source, tmp_path / "out.ndjson.zst", split_threshold_mb=1
    )

    written = read_output(tmp_path / "out.ndjson.zst")
    assert written[:12] == [server_side(p, fakes["pseudonymizer"]) for p in resources[:12]]
    assert [entry["resource"]["valueInteger"] for entry in written[12]["entry"]] == list(range(6))
    assert (counts.resources_in, counts.resources_out, counts.bundles_split) == (13, 13, 1)
    requests = fakes["pseudonymizer"].state.requests
    assert counts.requests == len(requests) > 13 and all(r.status == 200 and r.size <= MB for r in requests)


# --- the send ------------------------------------------------------------------------------------------------


def test_resources_are_sent_in_transactions_through_nginx(nginx_front, fakes, tmp_path):
    fhir = fakes["fhir"]
    fhir.state.reset()
    source = write_ndjson(tmp_path / "core.ndjson", generated(25, "n"))

    report = send_file(
        nginx_front.urls["fhir"], source, tmp_path / "send", batch_size=10, basic=False, tls=tls_config(nginx_front)
    )

    assert [len(t["entries"]) for t in fhir.state.transactions] == [10, 10, 5]
    assert len(fhir.state.applied) == 25 and set(fhir.state.applied.values()) == {1}
    assert (report.batches, report.entries) == (3, 25)


def test_files_are_transferred_as_binaries_through_nginx(nginx_front, fakes, tmp_path):
    """transfer_load: each file a Binary PUT whose body is streamed (its length declared), then the
    DocumentReference."""
    fhir = fakes["fhir"]
    fhir.state.reset()
    inputs = [write_ndjson(tmp_path / f"{name}.ndjson", generated(300, name)) for name in ("core", "Observation")]
    records = tmp_path / "send"
    records.mkdir()

    reference = transfer(nginx_front.urls["fhir"], "job-n", inputs, records, tls=tls_config(nginx_front))

    binaries = [key for key in fhir.state.put_bytes if key.startswith("Binary/")]
    assert len(binaries) == 2 and all(fhir.state.put_bytes[key] > 1000 for key in binaries)
    assert reference in fhir.state.put_bytes
    assert set(fhir.state.applied.values()) == {1}


def tls_config(front: NginxFront) -> dict:
    return {"ca_cert_path": front.ca_cert_path}


# --- nginx's body limit --------------------------------------------------------------------------------------

LIMIT_FIX = "nginx's client_max_body_size"


def test_a_kickoff_over_nginxs_body_limit_names_the_limit_to_raise(nginx_front, fakes):
    large = json.dumps(json.loads(CRTDL), indent=4096 * 4).encode()  # the same CRTDL, over 8 KB
    submitted = len(fakes["extraction"].state.submissions)
    with client_for(nginx_front.urls["tight extraction"], SIM, tls(nginx_front)) as client:
        with pytest.raises(ServiceError) as caught:
            client.submit(large)

    assert caught.value.status_code == 413 and LIMIT_FIX in str(caught.value)
    assert len(fakes["extraction"].state.submissions) == submitted  # nginx refused it; the server never saw it


def test_a_resource_over_nginxs_body_limit_names_the_limit_to_raise(nginx_front, fakes, tmp_path):
    fakes["pseudonymizer"].state.reset()
    source = write_lines(tmp_path / "in.ndjson", [patient(1), patient(2, note=[{"text": "x" * 20_000}])])

    with pytest.raises(StepError) as caught:
        pseudonymize_file(nginx_front.urls["tight pseudonymizer"], nginx_front, source, tmp_path / "out.ndjson.zst")

    message = str(caught.value)
    assert "line 2 (Patient/p2)" in message and "HTTP 413" in message and LIMIT_FIX in message
    assert len(fakes["pseudonymizer"].state.requests) == 1  # the first resource; nginx kept the second from it


def test_a_transaction_over_nginxs_body_limit_names_the_limit_to_raise(nginx_front, fakes, tmp_path):
    fakes["fhir"].state.reset()
    source = write_ndjson(tmp_path / "core.ndjson", generated(100, "t"))
    url = nginx_front.urls["tight fhir"]

    with pytest.raises(StepError) as caught:
        send_file(url, source, tmp_path / "send", batch_size=100, basic=False, tls=tls_config(nginx_front))

    message = str(caught.value)
    assert "HTTP 413" in message and "lower services.send.batch_size" in message and LIMIT_FIX in message
    assert fakes["fhir"].state.requests == []


def test_a_binary_over_nginxs_body_limit_names_the_limit_to_raise(nginx_front, fakes, tmp_path):
    fakes["fhir"].state.reset()
    noise = [{"resourceType": "Patient", "id": "p1", "name": [{"text": os.urandom(16_000).hex()}]}]
    source = write_ndjson(tmp_path / "core.ndjson", noise)  # 32 KB that no zip makes smaller than 8 KB
    records = tmp_path / "send"
    records.mkdir()

    with pytest.raises(ServiceError) as caught:
        transfer(nginx_front.urls["tight fhir"], "job-b", [source], records, tls=tls_config(nginx_front))

    assert caught.value.status_code == 413 and LIMIT_FIX in str(caught.value)
    assert fakes["fhir"].state.requests == []
