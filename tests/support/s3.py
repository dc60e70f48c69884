"""An S3 bucket in moto behind the fake proxy that demands Proxy-Authorization: its credentials, and what it holds,
read from moto directly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tasks.clients.s3 import UploadedObject

REGION = "eu-central-1"
ACCESS_KEY_ID = "AKIDS3UPLOADTEST"
SECRET_ACCESS_KEY = "s3-secret-9f8e7d"
PROXY_USER = "proxy-user"
PROXY_PASSWORD = "proxy-pw-31337"


def listing(store, bucket: str) -> list[UploadedObject]:
    contents = store.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [UploadedObject(item["Key"], item["Size"], item["ETag"].strip('"')) for item in contents]


def manifest_objects(manifest: Path) -> list[UploadedObject]:
    return [UploadedObject(**entry) for entry in json.loads(manifest.read_text())["objects"]]


def incomplete_uploads(store, bucket: str) -> list[dict]:
    return store.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def stored_digest(store, bucket: str, key: str) -> str:
    return hashlib.sha256(store.get_object(Bucket=bucket, Key=key)["Body"].read()).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
