"""An S3 bucket in moto behind the fake proxy that demands Proxy-Authorization: its credentials, and what it holds,
read from moto directly. A pytest plugin (``tests/conftest.py``): its fixtures serve every S3 test module."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tasks.clients.s3 import UploadedObject
from tests.fakes.s3_proxy import start_s3_proxy

REGION = "eu-central-1"
ACCESS_KEY_ID = "AKIDS3UPLOADTEST"
SECRET_ACCESS_KEY = "s3-secret-9f8e7d"
PROXY_USER = "proxy-user"
PROXY_PASSWORD = "proxy-pw-31337"


def listing(store, bucket: str) -> list[UploadedObject]:
    contents = store.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [UploadedObject(item["Key"], item["Size"], item["ETag"].strip('"')) for item in contents]


def manifest_objects(manifest: Path) -> list[UploadedObject]:
    """What the manifest's records (``<manifest without .json>/*.json``, one per object) hold, by key."""
    records = [json.loads(path.read_text()) for path in records_folder(manifest).glob("*.json")]
    objects = (UploadedObject(record["key"], record["size"], record["etag"]) for record in records)
    return sorted(objects, key=lambda uploaded: uploaded.key)


def records_folder(manifest: Path) -> Path:
    return manifest.with_suffix("")


def incomplete_uploads(store, bucket: str) -> list[dict]:
    return store.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def stored_digest(store, bucket: str, key: str) -> str:
    return hashlib.sha256(store.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def moto_url():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def running_proxy(moto_url):
    proxy = start_s3_proxy(moto_url, username=PROXY_USER, password=PROXY_PASSWORD)
    yield proxy
    proxy.stop()


@pytest.fixture
def proxy(running_proxy):
    running_proxy.state.reset()
    yield running_proxy
    running_proxy.state.release.set()  # let any held part go, so no handler thread waits past the test


@pytest.fixture(scope="module")
def store(moto_url):
    """A moto client that bypasses the proxy, to look at what the bucket really holds."""
    return boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url=moto_url,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )


@pytest.fixture
def bucket(store) -> str:
    name = f"research-{uuid.uuid4().hex[:12]}"
    store.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    return name
