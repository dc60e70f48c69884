"""transfer_load: Binaries and the one DocumentReference on the real sekmet-fhir server, read back as the DSF
would (search the DocumentReference by project identifier, resolve each attachment, unzip, compare byte for byte);
streaming and retry against the fake."""

from __future__ import annotations

import base64
import io
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import orjson
import pytest
import zstandard

from tasks.clients.errors import ServiceError
from tasks.clients.fhir_server import FhirServer
from tasks.clients.transfer import (
    PROJECT_IDENTIFIER_SYSTEM,
    binary_body,
    binary_id,
    document_reference_id,
    send_binary,
    zip_data_file,
)
from tests.conftest import REPO_ROOT, TESTDATA
from tests.fakes.fhir_server import start_fhir_fake
from tests.sekmet import start_sekmet
from tests.support.sending import PROJECT, plain_content, read_back_as_the_dsf, settings_for, transfer


@pytest.fixture(scope="module")
def sekmet(tmp_path_factory):
    server = start_sekmet(tmp_path_factory.mktemp("sekmet"))
    yield server
    server.stop()


def input_folder(folder: Path, seed: int = 3) -> list[Path]:
    """The real TORCH result (zstd), varied generated NDJSON (plain) and a CSV, as a step's folder would hold."""
    folder.mkdir(parents=True, exist_ok=True)
    core = folder / "core.ndjson.zst"
    core.write_bytes(zstandard.ZstdCompressor().compress((TESTDATA / "extraction" / "BlazeBundle.json").read_bytes()))
    torch = folder / "b4a838f8.ndjson.zst"
    torch_result = TESTDATA / "extraction" / "example-result" / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
    torch.write_bytes(zstandard.ZstdCompressor().compress(torch_result.read_bytes()))
    rng = random.Random(seed)
    batch = folder / "batch-1.ndjson"
    batch.write_text(
        "".join(
            f'{{"resourceType":"Observation","id":"o{i}","valueQuantity":{{"value":{rng.random()}}}}}\n'
            for i in range(500)
        )
    )
    csv = folder / "Diagnosis.csv"
    csv.write_text(
        "id,patient,code\n" + "".join(f"c{i},Patient/p{i % 7},I{rng.randint(10, 99)}.{i % 10}\n" for i in range(300))
    )
    return [core, torch, batch, csv]


@pytest.mark.slow
def test_every_file_arrives_zipped_and_one_document_reference_lists_them(sekmet, tmp_path):
    inputs = input_folder(tmp_path / "pseudonymizer")

    reference = transfer(sekmet.url, "job-a", inputs, tmp_path / "send")

    assert reference == f"DocumentReference/{document_reference_id('job-a')}"
    files = read_back_as_the_dsf(sekmet, PROJECT)
    assert list(files) == ["core.ndjson", "b4a838f8.ndjson", "batch-1.ndjson", "Diagnosis.csv"]
    for path in inputs:
        assert files[path.name.removesuffix(".zst")] == plain_content(path)
    assert not list((tmp_path / "send").glob("*.part"))


@pytest.mark.slow
def test_a_resumed_job_puts_the_same_ids_and_never_a_second_document_reference(sekmet, tmp_path):
    project = "Resume_PROJECT"
    inputs = input_folder(tmp_path / "in", seed=5)
    transfer(sekmet.url, "job-b", inputs[:2], tmp_path / "send", project)  # a first run that got this far …
    first = (tmp_path / "send" / "transfer.json").read_bytes()

    transfer(sekmet.url, "job-b", inputs, tmp_path / "send", project)  # … and the resumed one

    files = read_back_as_the_dsf(sekmet, project)
    assert sorted(files) == sorted(p.name.removesuffix(".zst") for p in inputs)
    assert b'"date"' in first and first.split(b'"date":')[1][:30] in (tmp_path / "send" / "transfer.json").read_bytes()
    for path in inputs:
        assert sekmet.count("Binary", _id=binary_id("job-b", path.name)) == 1


KILLABLE_TRANSFER = """
import sys
from pathlib import Path
from tests.support.sending import transfer
url, job, records, project, *inputs = sys.argv[1:]
transfer(url, job, [Path(p) for p in inputs], Path(records), project)
"""


@pytest.mark.slow
def test_kill_9_during_the_binaries_then_continue_gives_each_binary_once_and_one_document(sekmet, tmp_path):
    project = "Killed_PROJECT"
    inputs = input_folder(tmp_path / "in", seed=9)
    rng = random.Random(11)
    big = tmp_path / "in" / "batch-2.ndjson"
    big.write_text(
        "".join(f'{{"resourceType":"Observation","id":"b{i}","note":"{rng.random()}"}}\n' for i in range(200_000))
    )
    inputs.append(big)
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLABLE_TRANSFER,
            sekmet.url,
            "job-k",
            str(tmp_path / "send"),
            project,
            *map(str, inputs),
        ],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("APP_")} | {"PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        while sekmet.read("Binary", binary_id("job-k", inputs[2].name)) is None:
            assert process.poll() is None, "the transfer ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert sekmet.count("DocumentReference", identifier=f"{PROJECT_IDENTIFIER_SYSTEM}|{project}") == 0

    transfer(sekmet.url, "job-k", inputs, tmp_path / "send", project)

    files = read_back_as_the_dsf(sekmet, project)
    assert sorted(files) == sorted(p.name.removesuffix(".zst") for p in inputs)
    assert files["batch-2.ndjson"] == big.read_bytes()


# --- streaming and retry (the fake) -------------------------------------------------------------------------


def test_the_binary_is_streamed_with_its_length_and_sent_whole_again_after_a_503(tmp_path):
    source = input_folder(tmp_path / "in")[2]
    fake = start_fhir_fake()
    try:
        fake.state.unavailable = 1
        settings = settings_for(fake.base_url)
        with FhirServer.connect(settings.services.send, settings.tls, settings.retry) as server:
            sent = send_binary(server, source, "bin-1", tmp_path / "send")
        zip_path = tmp_path / "check.zip"
        zip_data_file(source, zip_path)
        _, length = binary_body("bin-1", zip_path)
        assert fake.state.put_bytes == {"Binary/bin-1": length}  # Content-Length, the whole body, after the 503
        assert [r["bytes"] for r in fake.state.requests] == [length]
        assert sent["zip_size"] == zip_path.stat().st_size
    finally:
        fake.stop()


def test_the_streamed_body_is_the_binary_json(tmp_path):
    source = input_folder(tmp_path / "in")[0]
    zip_path = tmp_path / "x.zip"
    zip_data_file(source, zip_path)
    stream, length = binary_body("abc", zip_path)

    body = b"".join(stream())

    binary = orjson.loads(body)
    assert len(body) == length
    assert (binary["resourceType"], binary["id"], binary["contentType"]) == ("Binary", "abc", "application/zip")
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(binary["data"]))) as archive:
        assert archive.namelist() == ["core.ndjson"]
        assert archive.read("core.ndjson") == plain_content(source)


@pytest.mark.parametrize(
    ("fault", "status", "fix"),
    [
        ("echo", 401, "check services.send.auth"),
        ("echo", 403, "check services.send.auth and the server's access rules"),
        ("body_limit", 413, "raise the body limit of the server (or of a proxy before it"),
    ],
    ids=["401", "403", "413"],
)
def test_a_refused_binary_says_the_key_or_the_fix_as_a_refused_transaction_does(tmp_path, fault, status, fix):
    """A transaction refused with 401/403/413 named services.send.auth or the fix; the same refusal of a Binary said
    only "HTTP 403 Forbidden" (or the server's own words), the key nowhere."""
    source = input_folder(tmp_path / "in")[2]
    fake = start_fhir_fake()
    try:
        if fault == "echo":
            fake.state.echo_credentials, fake.state.echo_status = "text", status
        else:
            fake.state.max_body_bytes = 1000
        settings = settings_for(fake.base_url)
        with FhirServer.connect(settings.services.send, settings.tls, settings.retry) as server:
            with pytest.raises(ServiceError) as raised:
                send_binary(server, source, "bin-1", tmp_path / "send")
    finally:
        fake.stop()

    message = str(raised.value)
    assert f"PUT Binary/bin-1 failed with HTTP {status}" in message
    assert fix in message
    assert raised.value.status_code == status and not raised.value.transient
