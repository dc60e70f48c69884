"""The send step in s3_upload mode end to end through the CLI (in-process; as processes for kill and continue):
moto in server mode (path style, eu-central-1) behind a proxy that demands Proxy-Authorization; what the bucket
holds is read from moto directly.
"""

from __future__ import annotations

import random
import shutil
import signal
import ssl
from pathlib import Path

import certifi
import orjson
import pytest
import zstandard

from flows.run import EXIT_FAILED, EXIT_OK, main
from tests.conftest import TESTDATA, run_cli
from tests.support.s3 import (
    ACCESS_KEY_ID,
    PROXY_PASSWORD,
    PROXY_USER,
    REGION,
    SECRET_ACCESS_KEY,
    file_digest,
    incomplete_uploads,
    listing,
    manifest_objects,
    stored_digest,
)
from tests.support.jobs import job_file, only_job_dir, start_cli_process, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

SECRETS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY, PROXY_PASSWORD)
EXAMPLE_RESULT = TESTDATA / "extraction" / "example-result" / "b4a838f8-55e9-4d4b-8551-e530fc7d9f3e.ndjson"
BLAZE_BUNDLE = TESTDATA / "extraction" / "BlazeBundle.json"


@pytest.fixture
def credentials(monkeypatch):
    """The secrets reach the configuration through ${VAR} substitution, as the spec recommends."""
    monkeypatch.setenv("DUPFLOW_TEST_S3_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("DUPFLOW_TEST_S3_SECRET", SECRET_ACCESS_KEY)
    monkeypatch.setenv("DUPFLOW_TEST_PROXY_PASSWORD", PROXY_PASSWORD)


def send_s3_config(proxy, bucket: str, steps: list[str], *, compression: bool = True, **services) -> dict:
    """The configuration tree of ``steps`` ending in send as s3_upload to ``bucket`` through ``proxy``; the secrets
    as ${VAR} references (see ``credentials``); ``services`` are further service blocks."""
    send = {
        "send_as": "s3_upload",
        "auth": {"username": PROXY_USER, "password": "${DUPFLOW_TEST_PROXY_PASSWORD}"},
        "s3": {
            "bucket": bucket,
            "region": REGION,
            "access_key_id": "${DUPFLOW_TEST_S3_KEY_ID}",
            "secret_access_key": "${DUPFLOW_TEST_S3_SECRET}",
            "endpoint": proxy.base_url,
            "use_path_style": True,
        },
    }
    return {
        "pipeline": {"enabled_steps": steps},
        "compression": {"enabled": compression, "level": "fastest"},
        "retry": {"initial_backoff_ms": 1, "max_backoff_ms": 5},
        "services": {"send": send, **services},
    }


def real_inputs(tmp_path: Path) -> Path:
    """A real TORCH result file (plain) and the TORCH test patients as one zstd-compressed Bundle line."""
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(EXAMPLE_RESULT, source / EXAMPLE_RESULT.name)
    line = orjson.dumps(orjson.loads(BLAZE_BUNDLE.read_bytes())) + b"\n"
    (source / "blaze.ndjson.zst").write_bytes(zstandard.ZstdCompressor().compress(line))
    return source


def assert_bucket_matches_folder(store, bucket: str, job_dir: Path, folder: str) -> None:
    """Every file of the step's input folder is one object ``<job id>/<name>`` with its bytes, and nothing else;
    the manifest agrees with the listing; no multipart upload is left open."""
    files = sorted(p for p in (job_dir / folder).iterdir() if p.is_file() and not p.name.startswith("."))
    objects = listing(store, bucket)
    assert [o.key for o in objects] == [f"{job_dir.name}/{p.name}" for p in files]
    assert all(stored_digest(store, bucket, o.key) == file_digest(p) for o, p in zip(objects, files, strict=True))
    assert manifest_objects(job_dir / "send" / "s3-manifest.json") == objects
    assert incomplete_uploads(store, bucket) == []


def assert_no_secret_under(folder: Path, *texts: str) -> None:
    for secret in SECRETS:
        assert all(secret not in text for text in texts), secret
        for path in folder.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), (secret, path)


@pytest.mark.parametrize("compression", [True, False], ids=["zstd", "plain"])
def test_local_import_then_s3_upload_puts_every_file_once_through_the_proxy(
    credentials, proxy, store, bucket, tmp_path, write_config, compression, capsys
):
    config = write_config(send_s3_config(proxy, bucket, ["local_import", "send"], compression=compression))

    assert main(["start", str(config), str(real_inputs(tmp_path)), "--no-progress"]) == EXIT_OK

    job_dir = only_job_dir(tmp_path / "jobs")
    assert job_file(job_dir)["state"] == "Completed"
    said = f"sent 2 files (s3_upload) to S3 bucket {bucket}; the data sent are in {job_dir / 'import'}"
    out = capsys.readouterr()
    assert job_file(job_dir)["state_message"] == said and said in out.out
    suffix = ".ndjson.zst" if compression else ".ndjson"
    assert all(o.key.endswith(suffix) for o in listing(store, bucket)) and len(listing(store, bucket)) == 2
    assert_bucket_matches_folder(store, bucket, job_dir, "import")
    assert proxy.state.requests and all(r.authorized for r in proxy.state.requests)
    assert_no_secret_under(tmp_path / "jobs", out.out, out.err)


def test_after_the_pseudonymizer_the_pseudonymized_files_are_uploaded(
    credentials, proxy, store, bucket, pseudonymizer_fake, tmp_path, write_config, capsys
):
    steps = ["local_import", "pseudonymizer", "send"]
    pseudonymizer = {"url": pseudonymizer_fake.base_url}
    config = write_config(send_s3_config(proxy, bucket, steps, pseudonymizer=pseudonymizer))

    assert main(["start", str(config), str(real_inputs(tmp_path)), "--no-progress"]) == EXIT_OK

    job_dir = only_job_dir(tmp_path / "jobs")
    assert_bucket_matches_folder(store, bucket, job_dir, "pseudonymizer")
    out = capsys.readouterr()
    assert_no_secret_under(tmp_path / "jobs", out.out, out.err)


def test_a_refused_proxy_login_fails_the_job_naming_the_auth_keys_without_the_password(
    credentials, proxy, store, bucket, tmp_path, write_config, monkeypatch, capsys
):
    monkeypatch.setenv("DUPFLOW_TEST_PROXY_PASSWORD", "not-the-password")
    config = write_config(send_s3_config(proxy, bucket, ["local_import", "send"]))

    assert main(["start", str(config), str(real_inputs(tmp_path)), "--no-progress"]) == EXIT_FAILED

    out = capsys.readouterr()
    assert "407" in out.err and "services.send.auth" in out.err
    assert "not-the-password" not in out.out + out.err
    assert job_file(only_job_dir(tmp_path / "jobs"))["state"] == "Failed"
    assert listing(store, bucket) == []
    assert_no_secret_under(tmp_path / "jobs", out.out, out.err)


def random_resources(path: Path, megabytes: int, seed: int) -> Path:
    """NDJSON Observations with random notes: ``megabytes`` of data that does not compress away."""
    rng = random.Random(seed)
    with open(path, "wb") as out:
        for n in range(megabytes * 1024):
            note = rng.randbytes(500).hex()
            out.write(orjson.dumps({"resourceType": "Observation", "id": f"o-{n}", "note": [{"text": note}]}) + b"\n")
    return path


@pytest.mark.slow
def test_kill_during_a_multipart_upload_then_continue_leaves_every_object_once(
    credentials, proxy, store, bucket, tmp_path, write_config
):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(EXAMPLE_RESULT, source / "a.ndjson")
    random_resources(source / "b.ndjson", 20, seed=5)
    config = write_config(send_s3_config(proxy, bucket, ["local_import", "send"], compression=False))
    proxy.state.hold_parts = True

    process = start_cli_process("start", str(config), str(source), "--no-progress")
    wait_for(lambda: proxy.state.part_held.wait(0.05) or None, process, timeout=120)
    process.send_signal(signal.SIGKILL)
    process.wait()
    proxy.state.hold_parts = False
    proxy.state.release.set()
    job_dir = only_job_dir(tmp_path / "jobs")
    assert [o.key for o in listing(store, bucket)] == [f"{job_dir.name}/a.ndjson"]
    assert len(incomplete_uploads(store, bucket)) == 1
    proxy.state.reset()

    result = run_cli("continue", str(job_dir), "--no-progress")

    assert result.returncode == EXIT_OK, result.stderr
    assert_bucket_matches_folder(store, bucket, job_dir, "import")
    uploads = [r.path for r in proxy.state.requests if r.operation in ("PutObject", "CreateMultipartUpload")]
    assert uploads == [f"/{bucket}/{job_dir.name}/b.ndjson?uploads"]  # a.ndjson was not sent again


def uploads_by_key(proxy) -> dict[str, int]:
    """How often each key's content was sent to the store: one PutObject or one CreateMultipartUpload each time."""
    counts: dict[str, int] = {}
    for request in proxy.state.requests:
        if request.operation in ("PutObject", "CreateMultipartUpload"):
            key = request.path.split("?")[0].split("/", 2)[2]
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["CompleteMultipartUpload", "PutObject"])
def test_killed_after_the_store_took_an_upload_continue_does_not_upload_it_again(
    credentials, proxy, store, bucket, tmp_path, write_config, operation
):
    """The store completed the object; the process died before it heard so (a long CompleteMultipartUpload, a
    PutObject whose answer was on its way), so the manifest has no record of it."""
    source = tmp_path / "in"
    source.mkdir()
    random_resources(source / "b.ndjson", 20 if operation == "CompleteMultipartUpload" else 2, seed=7)
    config = write_config(send_s3_config(proxy, bucket, ["local_import", "send"], compression=False))
    proxy.state.hold_answers = {operation}

    process = start_cli_process("start", str(config), str(source), "--no-progress")
    wait_for(lambda: proxy.state.answer_held.wait(0.05) or None, process, timeout=120)
    process.send_signal(signal.SIGKILL)
    process.wait()
    proxy.state.release.set()
    job_dir = only_job_dir(tmp_path / "jobs")
    assert [o.key for o in listing(store, bucket)] == [f"{job_dir.name}/b.ndjson"]  # the store holds it whole
    proxy.state.reset()

    result = run_cli("continue", str(job_dir), "--no-progress")

    assert result.returncode == EXIT_OK, result.stderr
    assert_bucket_matches_folder(store, bucket, job_dir, "import")
    assert uploads_by_key(proxy) == {}


@pytest.mark.slow
def test_an_upload_whose_answer_is_lost_counts_when_the_store_holds_it(
    credentials, proxy, store, bucket, tmp_path, write_config
):
    """A proxy that cuts the connection after the store applied the request (504 after a long complete, a reset),
    with no attempts left: the object is there, so the job goes on without sending it again."""
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(EXAMPLE_RESULT, source / "a.ndjson")
    random_resources(source / "b.ndjson", 20, seed=8)
    tree = send_s3_config(proxy, bucket, ["local_import", "send"], compression=False)
    config = write_config(tree | {"retry": {"max_attempts": 1}})
    proxy.state.lose_answers = {"PutObject", "CompleteMultipartUpload"}

    result = run_cli("start", str(config), str(source), "--no-progress")

    assert result.returncode == EXIT_OK, result.stderr
    job_dir = only_job_dir(tmp_path / "jobs")
    assert_bucket_matches_folder(store, bucket, job_dir, "import")
    assert uploads_by_key(proxy) == {f"{job_dir.name}/a.ndjson": 1, f"{job_dir.name}/b.ndjson": 1}


def a_ca_certificate() -> str:
    """The first CA of certifi's bundle in PEM, without the comments before it."""
    pem = certifi.contents()
    start = pem.index("-----BEGIN CERTIFICATE-----")
    end = pem.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    return pem[start:end] + "\n"


def test_a_ca_bundle_whose_comments_are_not_utf_8_is_used(credentials, proxy, store, bucket, tmp_path, write_config):
    """A PEM bundle exported on a Windows machine names its CAs in Latin-1 ("Bundesnetzagentur Prüf-CA"): OpenSSL
    and the HTTP clients read only the certificates, the S3 client read the file as UTF-8 text and failed the send
    with a bare UnicodeDecodeError."""
    bundle = tmp_path / "site-ca.pem"
    bundle.write_bytes("# Prüf-CA der Klinik\n".encode("latin-1") + a_ca_certificate().encode())
    config = write_config({**send_s3_config(proxy, bucket, ["local_import", "send"]), "tls": {"ca_cert_path": bundle}})

    assert main(["start", str(config), str(real_inputs(tmp_path)), "--no-progress"]) == EXIT_OK

    assert len(listing(store, bucket)) == 2


def test_a_ca_certificate_in_der_form_fails_the_send_naming_the_key_and_pem(
    credentials, proxy, store, bucket, tmp_path, write_config, capsys
):
    """A CA certificate saved in DER (binary) form, as some sites hand them out: the HTTP clients say that
    ``tls.ca_cert_path`` holds no PEM bundle, the S3 client failed on a bare UnicodeDecodeError."""
    der = tmp_path / "ca.der"
    der.write_bytes(ssl.PEM_cert_to_DER_cert(a_ca_certificate()))
    config = write_config({**send_s3_config(proxy, bucket, ["local_import", "send"]), "tls": {"ca_cert_path": der}})

    assert main(["start", str(config), str(real_inputs(tmp_path)), "--no-progress"]) == EXIT_FAILED

    said = capsys.readouterr().err
    assert "tls.ca_cert_path" in said and "PEM" in said and "UnicodeDecodeError" not in said
    assert listing(store, bucket) == []
