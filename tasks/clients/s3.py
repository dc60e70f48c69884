"""The uploader of the s3_upload send mode and its manifest of the objects put.

See docs/development.md#service-clients.
"""

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.utils import ChunksizeAdjuster

from config.services import SendSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.errors import ServiceError
from tasks.clients.s3_client import (
    SERVICE,
    configured_secrets,
    make_s3_client,
    service_error,
    status_of,
)
from tasks.core.errors import StepError
from tasks.streams.files import write_file_atomically

log = logging.getLogger("dupflow.clients")

MANIFEST_VERSION = 1
MB = 1024 * 1024


@dataclass(frozen=True)
class UploadedObject:
    """One object in the bucket, as the manifest records it (``etag`` without quotes)."""

    key: str
    size: int
    etag: str
    source_modified_ns: int | None = field(default=None, compare=False)
    """The file's time of change: a file written anew to the same size is uploaded again."""


class S3Uploader:
    """Upload files to the bucket and record them in the ``Manifest``; thread-safe."""

    def __init__(
        self, send: SendSettings, tls: TlsSettings, retry: RetrySettings, manifest_path: Path
    ):
        ca_bundle = manifest_path.with_name("s3-ca-bundle.pem")
        self._bucket, self._client = send.s3.bucket, make_s3_client(send, tls, retry, ca_bundle)
        self._secrets = configured_secrets(send)
        # boto3's defaults: 8 MB threshold and parts, 10 parts in parallel
        self._transfer = TransferConfig()
        self._manifest = Manifest(manifest_path, self._bucket)

    def upload(self, path: Path, key: str) -> UploadedObject:
        """Upload ``path`` as ``key``, unless it is there already.

        Note: skipped when the manifest records it and it is still in the bucket, or the bucket
        holds it with this content (an earlier run's upload it never heard end).
        """
        found = path.stat()
        recorded = self._manifest.recorded(key)
        if (
            recorded is not None  # uploaded from the file as it is now
            and (recorded.size, recorded.source_modified_ns) == (found.st_size, found.st_mtime_ns)
            and self._is_stored(recorded)
        ):
            log.info(
                "S3 object %s is already in bucket %s (manifest); not uploading it again",
                key,
                self._bucket,
            )
            return recorded
        if self._manifest.attempted(key) and (stored := self._stored_copy(path, key, found)):
            log.info(
                "S3 object %s is already in bucket %s with this content (an earlier run's upload)",
                key,
                self._bucket,
            )
        else:
            self._manifest.note_attempt(key)
            stored = self._send(path, key, found)
        self._manifest.record(stored)
        return stored

    def _send(self, path: Path, key: str, found: os.stat_result) -> UploadedObject:
        """Upload once; a failure whose object the store holds all the same counts as done."""
        started, size = time.perf_counter(), found.st_size
        try:
            self._abort_incomplete_uploads(key)
            self._client.upload_file(str(path), self._bucket, key, Config=self._transfer)
            size_and_etag = self._head(key, f"upload {key}")
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            if (stored := self._stored_copy(path, key, found)) is None:
                raise self._service_error(f"upload {key}", exc) from None
            log.info(
                "S3 object %s: the store holds the upload whose answer was lost (%s)",
                key,
                type(exc).__name__,
            )
            return stored
        uploaded = UploadedObject(key, *size_and_etag, found.st_mtime_ns)
        if uploaded.size != size:
            message = (
                f"the bucket holds {uploaded.size} bytes after uploading {size}; was the file "
                "changed meanwhile?"
            )
            raise ServiceError(f"upload {key}", None, message, service=SERVICE)
        elapsed, mb = time.perf_counter() - started, size / MB
        log.info(
            "uploaded %s to S3 bucket %s: %.1f MB in %.1f s (%.1f MB/s)",
            key,
            self._bucket,
            mb,
            elapsed,
            mb / max(elapsed, 1e-9),
        )
        return uploaded

    def close(self) -> None:
        self._client.close()

    def _is_stored(self, recorded: UploadedObject) -> bool:
        """Whether the bucket still holds the recorded object (same size and ETag)."""
        try:
            return self._head(recorded.key, f"check {recorded.key}") == (
                recorded.size,
                recorded.etag,
            )
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and status_of(exc) == 404:
                return False
            raise self._service_error(f"check {recorded.key}", exc) from None

    def _stored_copy(self, path: Path, key: str, found: os.stat_result) -> UploadedObject | None:
        """Return ``key`` as the bucket holds it if that is ``path``'s content, else None.

        Note: compared by size and ``local_etag``.
        Why: on None the file is uploaded, whose errors say more than a HEAD's bodiless answer (KMS
        gives ETags of another kind).
        """
        try:
            size, etag = self._head(key, f"check {key}")
        except (BotoCoreError, ClientError, ServiceError):
            return None
        if size != found.st_size or etag != local_etag(path, size, self._transfer):
            return None
        return UploadedObject(key, size, etag, found.st_mtime_ns)

    def _head(self, key: str, operation: str) -> tuple[int, str]:
        """Return ``key``'s size and ETag; a store omitting either cannot prove an upload."""
        head = self._client.head_object(Bucket=self._bucket, Key=key)
        size, etag = head.get("ContentLength"), head.get("ETag")
        if not isinstance(size, int) or not isinstance(etag, str):
            missing = " and ".join(
                name for name, value in (("Content-Length", size), ("ETag", etag)) if value is None
            )
            gap = missing or "usable size or ETag"
            message = (
                f"the store's HeadObject answer has no {gap}; check the S3 endpoint or the proxy "
                "before it"
            )
            raise ServiceError(operation, None, message, service=SERVICE)
        return size, etag.strip('"')

    def _abort_incomplete_uploads(self, key: str) -> None:
        """Abort ``key``'s multipart uploads a killed run left (the server keeps parts)."""
        pages = self._client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self._bucket, Prefix=key
        )
        for page in pages:
            for upload in page.get("Uploads", []):
                if upload["Key"] == key:
                    log.info(
                        "aborting an incomplete multipart upload of %s left by an earlier run", key
                    )
                    self._client.abort_multipart_upload(
                        Bucket=self._bucket, Key=key, UploadId=upload["UploadId"]
                    )

    def _service_error(self, operation: str, exc: BaseException) -> ServiceError:
        return service_error(operation, exc, bucket=self._bucket, secrets=self._secrets)


class Manifest:
    """What a job's uploaders have put in the bucket: one record file per object.

    Why: written atomically, so uploaders in any processes record without a lock and none loses
    another's; each is read when its key is checked.
    Note: an earlier version's single file at ``manifest_path`` is refused.
    """

    def __init__(self, manifest_path: Path, bucket: str | None):
        if manifest_path.exists():
            raise StepError(
                f"{manifest_path} is the S3 manifest of an earlier dupflow (one file): finish the "
                "job with it, or remove that file to upload every object again"
            )
        self._folder, self._bucket = manifest_path.with_suffix(""), bucket

    def recorded(self, key: str) -> UploadedObject | None:
        """The object recorded as ``key`` in this bucket; None when missing or unusable.

        Note: an unreadable record, or another bucket's, is logged as such.
        """
        path, then = self._record_path(key), f"{key} is uploaded again"
        try:
            record = json.loads(path.read_bytes())
            recorded = UploadedObject(
                record["key"], record["size"], record["etag"], record["source_modified_ns"]
            )
            if recorded.key != key:
                raise ValueError(f"it records key {recorded.key}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("S3 manifest record %s is unreadable (%s); %s", path, exc, then)
            return None
        if (described := record.get("bucket")) != self._bucket:
            log.warning(
                "S3 manifest record %s describes bucket %s, not %s; %s",
                path,
                described,
                self._bucket,
                then,
            )
            return None
        return recorded

    def record(self, uploaded: UploadedObject) -> None:
        record = {"version": MANIFEST_VERSION, "bucket": self._bucket, **asdict(uploaded)}
        data = (json.dumps(record, indent=2) + "\n").encode()
        write_file_atomically(self._record_path(uploaded.key), data, shared=True)
        self._attempt_path(uploaded.key).unlink(missing_ok=True)

    def note_attempt(self, key: str) -> None:
        """Note that ``key`` is being uploaded; a run dying before its record leaves it."""
        write_file_atomically(
            self._attempt_path(key), f"{self._bucket}/{key}\n".encode(), shared=True
        )

    def attempted(self, key: str) -> bool:
        """Tell whether an upload of ``key`` began unrecorded: the store may hold it whole."""
        return self._attempt_path(key).exists()

    def _attempt_path(self, key: str) -> Path:
        return self._record_path(key).with_suffix(".attempt")

    def _record_path(self, key: str) -> Path:
        """Return the record file of ``key``, named by a digest.

        Why: a key may be longer than a file name may be and hold characters a file name may not.
        """
        return self._folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def local_etag(path: Path, size: int, transfer: TransferConfig) -> str:
    """Return S3's ETag of ``path`` sent with ``transfer``: MD5 of bytes or of parts'."""
    whole = size < transfer.multipart_threshold
    part_size = (
        size if whole else ChunksizeAdjuster().adjust_chunksize(transfer.multipart_chunksize, size)
    )
    digests = []
    with open(path, "rb") as data:
        for _ in range(1 if whole else math.ceil(size / part_size)):
            digest, left = hashlib.md5(usedforsecurity=False), part_size
            while left > 0 and (piece := data.read(min(MB, left))):  # a MB at a time
                digest.update(piece)
                left -= len(piece)
            digests.append(digest)
    if whole:
        return digests[0].hexdigest()
    whole_digest = hashlib.md5(b"".join(d.digest() for d in digests), usedforsecurity=False)
    return f"{whole_digest.hexdigest()}-{len(digests)}"
