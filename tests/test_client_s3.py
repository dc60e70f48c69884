"""The S3 uploader against moto in server mode behind a proxy that demands Proxy-Authorization.

Path-style addressing, region eu-central-1. What the bucket holds is read back from moto directly (not through
the uploader): objects, contents and incomplete multipart uploads; what the manifest records is read from its files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from config.services import SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.s3 import S3Uploader, UploadedObject, local_etag
from tasks.core.errors import StepError
from tests.conftest import REPO_ROOT
from tests.fakes.echo import Reply
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
    records_folder,
    stored_digest,
)

pytestmark = pytest.mark.slow  # a moto server

SECRETS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY, PROXY_PASSWORD)
MB = 1024 * 1024
TLS = TlsSettings()
RETRY = RetrySettings(max_attempts=3)
NO_RETRY = RetrySettings(max_attempts=1)


def send_config(endpoint: str, bucket: str, *, password: str = PROXY_PASSWORD, timeout: str = "PT30M") -> dict:
    return {
        "send_as": "s3_upload",
        "auth": {"username": PROXY_USER, "password": password, "api_key": "api-key-ignored"},
        "s3": {
            "bucket": bucket,
            "region": REGION,
            "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY,
            "endpoint": endpoint,
            "use_path_style": True,
            "timeout": timeout,
        },
    }


def uploader(proxy, bucket: str, manifest: Path, *, retry: RetrySettings = RETRY, **config) -> S3Uploader:
    return S3Uploader(SendSettings(**send_config(proxy.base_url, bucket, **config)), TLS, retry, manifest)


def data_file(path: Path, size: int, seed: int = 7) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


# --- upload and manifest ---------------------------------------------------------------------------------------


def test_a_small_file_is_one_put_with_proxy_auth_and_lands_in_the_manifest(proxy, store, bucket, tmp_path):
    source = data_file(tmp_path / "in" / "core.ndjson", 100_000)
    manifest = tmp_path / "job" / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/core.ndjson")

    assert uploaded == UploadedObject("job-1/core.ndjson", 100_000, uploaded.etag)
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, "job-1/core.ndjson") == file_digest(source)
    assert "PutObject" in proxy.state.operations()
    assert all(request.authorized for request in proxy.state.requests)
    assert all(request.path.startswith(f"/{bucket}") for request in proxy.state.requests)  # path style
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["s3-ca-bundle.pem", "s3-manifest"]  # no old-style file
    [record] = records_folder(manifest).iterdir()  # no temporary left
    assert record.name == f"{hashlib.sha256(b'job-1/core.ndjson').hexdigest()}.json"
    assert json.loads(record.read_text()) == {"version": 1, "bucket": bucket, **asdict(uploaded)}


@pytest.mark.parametrize("size", [0, 1, 8 * MB - 1, 8 * MB, 8 * MB + 1, 17 * MB], ids=str)
def test_the_etag_computed_from_the_file_is_the_one_the_store_gives_its_upload(proxy, bucket, tmp_path, size):
    """What lets a resumed job tell that the store already holds a file it never heard the upload of end."""
    source = data_file(tmp_path / "a.ndjson", size)
    with closing(uploader(proxy, bucket, tmp_path / "manifest.json")) as s3:
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert local_etag(source, size, TransferConfig()) == uploaded.etag


def test_a_large_file_goes_up_in_parallel_parts(proxy, store, bucket, tmp_path):
    source = data_file(tmp_path / "batch-0001.ndjson", 20 * MB)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/batch-0001.ndjson")

    operations = proxy.state.operations()
    assert operations.count("CreateMultipartUpload") == 1
    assert operations.count("UploadPart") == 3  # boto3's 8 MB parts
    assert operations.count("CompleteMultipartUpload") == 1
    assert uploaded.etag.endswith("-3") and uploaded.size == 20 * MB
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, uploaded.key) == file_digest(source)


@pytest.mark.parametrize("size", [100_000, 9 * MB], ids=["put", "multipart"])
def test_an_s3_compatible_store_without_flexible_checksums_takes_the_upload(proxy, store, bucket, tmp_path, size):
    """boto3 adds CRC32 checksums (headers, or an aws-chunked trailer over https) to every upload since 1.36; an
    S3-compatible store at s3.endpoint that lacks them (older MinIO and Ceph, many appliances) refused every upload,
    so s3_upload could never send. Checksums are now sent only where an operation requires them."""
    proxy.state.refuse_checksums = True
    source = data_file(tmp_path / "in" / "core.ndjson", size)
    manifest = tmp_path / "job" / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/core.ndjson")

    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, "job-1/core.ndjson") == file_digest(source)


def test_a_store_whose_answers_lack_the_etag_is_said_to_be_so_not_a_bare_key_error(proxy, bucket, tmp_path):
    """A proxy before the store that does not pass the ETag on: the upload crashed with KeyError: 'ETag'."""
    proxy.state.dropped_headers = {"etag"}
    source = data_file(tmp_path / "a.ndjson", 1000)
    s3 = uploader(proxy, bucket, tmp_path / "manifest.json")
    with pytest.raises(ServiceError) as failed:
        s3.upload(source, "job/a.ndjson")
    s3.close()
    assert "HeadObject answer has no ETag; check the S3 endpoint or the proxy before it" in str(failed.value)
    assert not failed.value.transient and manifest_objects(tmp_path / "manifest.json") == []


def test_a_resumed_job_skips_objects_the_manifest_records_and_the_bucket_holds(proxy, store, bucket, tmp_path):
    first, second = data_file(tmp_path / "a.ndjson", 5000, seed=1), data_file(tmp_path / "b.ndjson", 6000, seed=2)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        recorded = s3.upload(first, "job-1/a.ndjson")
    proxy.state.reset()

    with closing(uploader(proxy, bucket, manifest)) as s3:
        again = s3.upload(first, "job-1/a.ndjson")
        other = s3.upload(second, "job-1/b.ndjson")

    assert again == recorded
    assert proxy.state.operations().count("PutObject") == 1  # b only
    assert [r.path for r in proxy.state.requests if r.operation == "PutObject"] == [f"/{bucket}/job-1/b.ndjson"]
    assert listing(store, bucket) == [recorded, other] == manifest_objects(manifest)


def test_a_recorded_object_gone_from_the_bucket_is_uploaded_again(proxy, store, bucket, tmp_path):
    source = data_file(tmp_path / "a.ndjson", 5000)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        s3.upload(source, "job-1/a.ndjson")
    store.delete_object(Bucket=bucket, Key="job-1/a.ndjson")

    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert proxy.state.operations().count("PutObject") == 2
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)


def test_a_file_of_another_size_than_recorded_is_uploaded_again(proxy, store, bucket, tmp_path):
    source = data_file(tmp_path / "a.ndjson", 5000)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        s3.upload(source, "job-1/a.ndjson")
    data_file(source, 7000, seed=3)

    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert uploaded.size == 7000
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, uploaded.key) == file_digest(source)


def test_a_file_written_anew_to_the_same_size_is_uploaded_again(proxy, store, bucket, tmp_path):
    """A step run again (``continue --set``) can write a file of the same name and size: the object the manifest
    records is of another file (it was kept, and the bucket held the old data)."""
    source = data_file(tmp_path / "a.ndjson", 5000, seed=1)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        s3.upload(source, "job-1/a.ndjson")
    data_file(source, 5000, seed=2)
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000))  # a coarse clock

    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert proxy.state.operations().count("PutObject") == 2
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, uploaded.key) == file_digest(source)


def test_a_record_of_another_bucket_or_unreadable_is_not_trusted(proxy, store, bucket, tmp_path, caplog):
    source = data_file(tmp_path / "a.ndjson", 5000)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3:
        s3.upload(source, "job-1/a.ndjson")
        [record] = records_folder(manifest).iterdir()
        record.write_text(json.dumps({**json.loads(record.read_text()), "bucket": "elsewhere"}))
        s3.upload(source, "job-1/a.ndjson")
        record.write_text("{not json")
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert "describes bucket elsewhere" in caplog.text and "is unreadable" in caplog.text
    assert proxy.state.operations().count("PutObject") == 3
    assert manifest_objects(manifest) == [uploaded] == listing(store, bucket)


def test_uploads_from_threads_share_one_manifest(proxy, store, bucket, tmp_path):
    sources = [data_file(tmp_path / f"batch-{n:04d}.ndjson", 3000 + n, seed=n) for n in range(8)]
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as s3, ThreadPoolExecutor(4) as pool:
        uploaded = list(pool.map(lambda path: s3.upload(path, f"job-1/{path.name}"), sources))

    assert sorted(uploaded, key=lambda u: u.key) == listing(store, bucket) == manifest_objects(manifest)


# --- uploaders at once: the per-file tasks on a Dask cluster, each with its own uploader ------------------------


def test_uploaders_made_before_either_uploads_lose_none_of_each_others_objects(proxy, store, bucket, tmp_path):
    """Each records its object without dropping the other's, and reads the manifest when it checks a key (not when
    it was made), so neither the other uploader nor a resumed run uploads an object again."""
    first, second = data_file(tmp_path / "a.ndjson", 5000, seed=1), data_file(tmp_path / "b.ndjson", 6000, seed=2)
    manifest = tmp_path / "s3-manifest.json"
    with closing(uploader(proxy, bucket, manifest)) as one, closing(uploader(proxy, bucket, manifest)) as two:
        a = one.upload(first, "job-1/a.ndjson")
        b = two.upload(second, "job-1/b.ndjson")
        proxy.state.reset()
        assert (two.upload(first, "job-1/a.ndjson"), one.upload(second, "job-1/b.ndjson")) == (a, b)
    with closing(uploader(proxy, bucket, manifest)) as resumed:
        assert (resumed.upload(first, "job-1/a.ndjson"), resumed.upload(second, "job-1/b.ndjson")) == (a, b)

    assert "PutObject" not in proxy.state.operations()
    assert listing(store, bucket) == [a, b] == manifest_objects(manifest)


@pytest.mark.parametrize("same_file", [False, True], ids=["a-file-each", "one-file-for-all"])
def test_uploaders_started_together_in_threads_all_record_their_objects(proxy, store, bucket, tmp_path, same_file):
    """Eight uploaders, one file each (or all the same file, so all write one record at once), released together:
    no write fails, every object is recorded, no temporary file is left."""
    count = 8
    sources = [data_file(tmp_path / f"batch-{n:04d}.ndjson", 3000 + n, seed=n) for n in range(count)]
    sources = [sources[0]] * count if same_file else sources
    manifest = tmp_path / "s3-manifest.json"
    uploaders = [uploader(proxy, bucket, manifest) for _ in range(count)]
    start = threading.Barrier(count)

    def upload(s3: S3Uploader, path: Path) -> UploadedObject:
        start.wait(30)
        return s3.upload(path, f"job-1/{path.name}")

    try:
        with ThreadPoolExecutor(count) as pool:
            uploaded = list(pool.map(upload, uploaders, sources))
    finally:
        for s3 in uploaders:
            s3.close()

    assert sorted(set(uploaded), key=lambda u: u.key) == listing(store, bucket) == manifest_objects(manifest)
    assert len(listing(store, bucket)) == (1 if same_file else count)
    assert all(path.suffix == ".json" and not path.name.startswith(".") for path in records_folder(manifest).iterdir())


# --- the single manifest file of an earlier version -------------------------------------------------------------


def test_the_single_manifest_file_of_an_earlier_version_is_refused_naming_what_to_do(proxy, bucket, tmp_path):
    """An earlier version kept every upload in one ``s3-manifest.json``; its reader went: such a job is refused
    before any request, in one line, rather than uploading what the store may already hold."""
    manifest = tmp_path / "s3-manifest.json"
    manifest.write_text(json.dumps({"version": 1, "bucket": bucket, "objects": []}))

    with pytest.raises(StepError) as refused:
        uploader(proxy, bucket, manifest)

    assert str(refused.value) == (
        f"{manifest} is the S3 manifest of an earlier dupflow (one file): finish the job with it, or remove that "
        "file to upload every object again"
    )
    assert proxy.state.requests == []


# --- kill during a multipart upload -----------------------------------------------------------------------------

CHILD = """
import json, sys
from pathlib import Path
from config.services import SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.s3 import S3Uploader
config, source, key, manifest = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
S3Uploader(SendSettings(**config), TlsSettings(), RetrySettings(max_attempts=1), manifest).upload(source, key)
"""


@pytest.mark.slow
def test_a_kill_during_a_multipart_upload_leaves_no_orphaned_upload_after_the_next_run(proxy, store, bucket, tmp_path):
    source = data_file(tmp_path / "batch-0001.ndjson", 20 * MB)
    manifest = tmp_path / "s3-manifest.json"
    key = "job-1/batch-0001.ndjson"
    proxy.state.hold_parts = True
    config = json.dumps(send_config(proxy.base_url, bucket))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, config, str(source), key, str(manifest)],
        cwd=REPO_ROOT,
        env={name: value for name, value in os.environ.items() if not name.startswith(("APP_", "AWS_"))},
    )
    try:
        assert proxy.state.part_held.wait(60), "the child never started a part upload"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    proxy.state.hold_parts = False
    proxy.state.release.set()
    assert len(incomplete_uploads(store, bucket)) == 1  # what a killed run leaves behind
    assert manifest_objects(manifest) == []

    with closing(uploader(proxy, bucket, manifest)) as s3:
        uploaded = s3.upload(source, key)

    assert "AbortMultipartUpload" in proxy.state.operations()
    assert incomplete_uploads(store, bucket) == []
    assert listing(store, bucket) == [uploaded] == manifest_objects(manifest)
    assert stored_digest(store, bucket, key) == file_digest(source)


# --- errors: classified, and never with a credential in them ----------------------------------------------------


def assert_clean(error: ServiceError) -> None:
    texts = (str(error), repr(error), error.message)
    for secret in SECRETS:
        assert all(secret not in text for text in texts), secret
    assert error.__cause__ is None and error.__suppress_context__  # botocore's own exception is not chained


def test_a_proxy_password_beyond_latin_1_is_sent_as_utf_8_like_every_basic_auth(proxy, store, bucket, tmp_path):
    """httpx sends the FHIR servers' Basic auth as UTF-8; urllib3's helper encoded Latin-1, and a password with €
    failed the step with a UnicodeEncodeError quoting a character of it and its position."""
    source = data_file(tmp_path / "a.ndjson", 5000)
    proxy.state.password = "Kennwort-\u20acuro-2024"
    try:
        with closing(uploader(proxy, bucket, tmp_path / "m.json", password=proxy.state.password)) as s3:
            uploaded = s3.upload(source, "job-1/a.ndjson")
    finally:
        proxy.state.password = PROXY_PASSWORD
    assert listing(store, bucket) == [uploaded]


def test_proxy_auth_that_would_travel_inside_a_forward_proxy_s_tunnel_is_refused(monkeypatch, tmp_path):
    """HTTPS_PROXY tunnels an https endpoint (CONNECT, without the header): the header went on to the store."""
    monkeypatch.setenv("HTTPS_PROXY", "http://egress.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    config = send_config("https://s3.example.org", "b")
    with pytest.raises(ServiceError) as refused:
        S3Uploader(SendSettings(**config), TLS, RETRY, tmp_path / "m.json")
    assert "HTTPS_PROXY routes that https endpoint through a forward proxy" in str(refused.value)
    assert not refused.value.transient and PROXY_PASSWORD not in str(refused.value)
    monkeypatch.setenv("NO_PROXY", "s3.example.org")  # exempted: the endpoint is the proxy
    S3Uploader(SendSettings(**config), TLS, RETRY, tmp_path / "m.json").close()


@pytest.mark.parametrize("https_proxy", ["http://egress.example:3128", None], ids=["forward-proxy", "none"])
def test_proxy_auth_without_an_endpoint_is_refused_as_aws_itself_would_get_it(monkeypatch, tmp_path, https_proxy):
    """No endpoint: every request goes to AWS, and the proxy's password in its header with it (settings made
    otherwise than by the configuration's loader, which refuses the same)."""
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    if https_proxy:
        monkeypatch.setenv("HTTPS_PROXY", https_proxy)
    config = send_config("https://unused.example", "b")
    config["s3"]["endpoint"] = None
    with pytest.raises(ServiceError) as refused:
        S3Uploader(SendSettings(**config), TLS, RETRY, tmp_path / "m.json")
    assert "services.send.auth carries the Basic Auth of a proxy that services.send.s3.endpoint names" in str(
        refused.value
    )
    assert not refused.value.transient and PROXY_PASSWORD not in str(refused.value)


def test_a_wrong_proxy_password_is_a_terminal_error_naming_the_auth_keys(proxy, bucket, tmp_path):
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, bucket, tmp_path / "m.json", password="wrong-password")) as s3:
        with pytest.raises(ServiceError) as caught:
            s3.upload(source, "job-1/a.ndjson")

    error = caught.value
    assert error.status_code == 407 and not error.transient
    assert "services.send.auth" in error.message and "wrong-password" not in str(error)
    assert_clean(error)
    assert not any(request.authorized for request in proxy.state.requests)
    assert manifest_objects(tmp_path / "m.json") == []


def test_a_503_is_retried_by_botocore(proxy, store, bucket, tmp_path):
    proxy.state.replies.extend([Reply(503, body=b"<Error><Code>SlowDown</Code></Error>")])
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, bucket, tmp_path / "m.json")) as s3:
        uploaded = s3.upload(source, "job-1/a.ndjson")

    assert listing(store, bucket) == [uploaded]
    assert len(proxy.state.requests) >= 3  # the list of incomplete uploads was answered 503 and asked again


@pytest.mark.parametrize(
    ("reply", "status"),
    [(Reply(503, body=b"<Error><Code>ServiceUnavailable</Code></Error>"), 503), (Reply(reset=True), None)],
    ids=["503", "reset"],
)
def test_unavailable_or_reset_after_the_last_attempt_is_transient(proxy, bucket, tmp_path, reply, status):
    proxy.state.replies.append(reply)
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, bucket, tmp_path / "m.json", retry=NO_RETRY)) as s3:
        with pytest.raises(ServiceError) as caught:
            s3.upload(source, "job-1/a.ndjson")

    assert caught.value.transient and caught.value.status_code == status
    assert_clean(caught.value)


def test_a_stalled_request_times_out_after_s3_timeout(proxy, bucket, tmp_path):
    proxy.state.replies.append(Reply(200, delay=3.0))
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, bucket, tmp_path / "m.json", retry=NO_RETRY, timeout="PT1S")) as s3:
        with pytest.raises(ServiceError, match="network error: ReadTimeoutError") as caught:
            s3.upload(source, "job-1/a.ndjson")

    assert caught.value.transient


def test_an_error_text_quoting_the_credentials_is_blanked_out(proxy, bucket, tmp_path):
    body = (
        "<Error><Code>InvalidAccessKeyId</Code><Message>Access key "
        f"{ACCESS_KEY_ID} with secret {SECRET_ACCESS_KEY} via {PROXY_PASSWORD} is unknown</Message>"
        f"<AWSAccessKeyId>{ACCESS_KEY_ID}</AWSAccessKeyId></Error>"
    ).encode()
    proxy.state.replies.append(Reply(403, {"Content-Type": "application/xml"}, body))
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, bucket, tmp_path / "m.json")) as s3:
        with pytest.raises(ServiceError) as caught:
            s3.upload(source, "job-1/a.ndjson")

    error = caught.value
    assert error.status_code == 403 and not error.transient
    assert "Access key <hidden> with secret <hidden> via <hidden> is unknown" in error.message
    assert "services.send.s3.access_key_id" in error.message
    assert_clean(error)


def test_a_missing_bucket_is_a_terminal_error_naming_the_key(proxy, tmp_path):
    source = data_file(tmp_path / "a.ndjson", 5000)
    with closing(uploader(proxy, "no-such-bucket", tmp_path / "m.json")) as s3:
        with pytest.raises(ServiceError, match=r"bucket no-such-bucket \(services.send.s3.bucket\) does not exist"):
            s3.upload(source, "job-1/a.ndjson")


def test_debug_logs_of_boto_carry_no_credentials(proxy, bucket, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    refusal = (
        "<Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our "
        f"records.</Message><AWSAccessKeyId>{ACCESS_KEY_ID}</AWSAccessKeyId></Error>"
    ).encode()
    with closing(uploader(proxy, bucket, tmp_path / "m.json")) as s3:
        s3.upload(data_file(tmp_path / "a.ndjson", 5000), "job-1/a.ndjson")
        s3.upload(data_file(tmp_path / "b.ndjson", 9 * MB), "job-1/b.ndjson")
        proxy.state.replies.append(Reply(403, {"Content-Type": "application/xml"}, refusal))
        with pytest.raises(ServiceError, match="InvalidAccessKeyId"):
            s3.upload(data_file(tmp_path / "c.ndjson", 5000), "job-1/c.ndjson")

    proxy_header = proxy.state.requests[0].proxy_authorization
    assert "Sending http request" in caplog.text and "<AWSAccessKeyId>'<hidden>'" in caplog.text
    for secret in (*SECRETS, proxy_header.removeprefix("Basic ")):
        assert secret not in caplog.text, secret
