"""S3 for the s3_upload send mode: the boto3 client, the uploader and its manifest.

See docs/development.md#service-clients.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import ssl
import threading
import time
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import boto3
import certifi
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)
from botocore.exceptions import HTTPClientError, SSLError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.utils import get_environ_proxies
from s3transfer.utils import ChunksizeAdjuster

from config.settings import PROXY_AUTH_WITHOUT_ENDPOINT
from tasks.clients.auth import basic_login
from tasks.clients.http import INSECURE_WARNING, trusted_context
from tasks.clients.errors import (
    MAX_MESSAGE_CHARS,
    ServiceError,
    is_transient_status,
    nothing_answers_at,
)
from tasks.core.errors import StepError
from tasks.core.jsonfile import JsonFileError, read_settings_file
from tasks.core.readable import truncate
from tasks.core.redaction import RedactingFilter
from tasks.core.url_credentials import shown_url
from tasks.streams.files import write_file_atomically

if TYPE_CHECKING:
    from config.services import SendSettings
    from config.settings import RetrySettings, TlsSettings

log = logging.getLogger("dupflow.clients")
T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
COMPATIBLE_CHECKSUMS = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
}
"""For a store at ``s3.endpoint``: boto3's CRC32 checksums (since 1.36) are refused by S3-compatible
stores without them (older MinIO and Ceph); without one botocore signs the payload's SHA-256, so the
store still checks every byte."""


def make_s3_client(
    send: SendSettings, tls: TlsSettings, retry: RetrySettings, ca_bundle: Path
) -> Any:
    """Make a boto3 S3 client for ``services.send``; ``ca_bundle``: where its CAs go."""
    s3 = send.s3
    timeout = s3.timeout.total_seconds()
    # creating clients from one session is not thread-safe; reusing it saves ~0.2 s a client
    with _SESSION_LOCK:
        client = _session().client(
            "s3",
            region_name=s3.region,
            endpoint_url=s3.endpoint or None,
            aws_access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
            aws_secret_access_key=s3.secret_access_key.get_secret_value()
            if s3.secret_access_key
            else None,
            verify=s3_verify(tls, ca_bundle),
            config=Config(
                s3={"addressing_style": "path" if s3.use_path_style else "auto"},
                connect_timeout=min(DEFAULT_CONNECT_TIMEOUT_SECONDS, timeout),
                read_timeout=timeout,
                retries={"mode": "standard", "total_max_attempts": retry.max_attempts},
                **(COMPATIBLE_CHECKSUMS if s3.endpoint else {}),
            ),
        )
    if (login := basic_login(send.auth)) is not None:
        refuse_proxy_auth_beyond_the_proxy(send)
        client.meta.events.register("before-send.s3", ProxyAuthorization(*login))
    where = (
        s3.bucket,
        s3.endpoint or "the default endpoint",
        "path-style" if s3.use_path_style else "automatic",
    )
    log.info(
        "S3 client for bucket %s at %s (%s addressing)%s",
        *where,
        " with proxy authentication" if login else "",
    )
    return client


def refuse_proxy_auth_beyond_the_proxy(send: SendSettings) -> None:
    """Refuse proxy credentials that would reach beyond the proxy.

    Why: the proxy's Basic credentials go in a header of every request, for a proxy that the
    endpoint is (spec). Without an endpoint they would go to AWS; to an https endpoint behind
    HTTPS_PROXY, inside the tunnel to the store. Either is refused before any request (for settings
    made other than by the configuration).
    """
    if (endpoint := send.s3.endpoint) is None:
        message = f"services.send.auth {PROXY_AUTH_WITHOUT_ENDPOINT}"
        raise ServiceError("connect to S3", None, message, transient=False, service=SERVICE)
    if endpoint.lower().startswith("https:") and get_environ_proxies(endpoint).get("https"):
        message = (
            "services.send.auth (the proxy's Basic Auth) is sent in a header of each request to "
            "services.send.s3.endpoint, but HTTPS_PROXY routes that https endpoint through a "
            "forward proxy, which would get no credentials while the header travelled on to the "
            "store; set the proxy itself as services.send.s3.endpoint, or exempt the endpoint "
            "with NO_PROXY, or remove username/password from services.send.auth"
        )
        raise ServiceError("connect to S3", None, message, transient=False, service=SERVICE)


_SESSION_LOCK = threading.Lock()


@functools.cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()


class HideCredentialsInBotocoreDebugLogs(logging.Filter):
    """Blank out the access key id in botocore's DEBUG records.

    Note: the ``Authorization`` header and an error body's ``<AWSAccessKeyId>``.
    ``Proxy-Authorization`` is added after botocore logs the request.
    """

    CREDENTIALS = re.compile(
        r"('(?:Proxy-)?Authorization': )b?'[^']*'|(<AWSAccessKeyId>)[^<]*(?=</AWSAccessKeyId>)"
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = self.CREDENTIALS.sub(
            lambda match: (match.group(1) or match.group(2)) + "'<hidden>'", message
        )
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


for _logger_name in ("botocore.endpoint", "botocore.parsers"):
    logging.getLogger(_logger_name).addFilter(HideCredentialsInBotocoreDebugLogs())
    # a response body quoting a registered secret
    logging.getLogger(_logger_name).addFilter(RedactingFilter())


class ProxyAuthorization:
    """botocore ``before-send`` handler setting ``Proxy-Authorization``; repr hides it."""

    def __init__(self, username: str, password: str):
        self._header = "Basic " + basic_credentials(username, password)

    def __call__(self, request: Any, **_: Any) -> None:
        request.headers["Proxy-Authorization"] = self._header

    def __repr__(self) -> str:
        return "ProxyAuthorization(<hidden>)"


def s3_verify(tls: TlsSettings, ca_bundle: Path) -> str | bool:
    """botocore's ``verify``: False when skipping, else a CA bundle file."""
    if tls.insecure_skip_verify:
        log.warning(INSECURE_WARNING, "S3")
        return False
    # what the HTTP clients' context trusts (SSL_CERT_FILE too)
    system_bundle = ssl.get_default_verify_paths().cafile
    if not tls.ca_cert_path and not (system_bundle and os.path.isfile(system_bundle)):
        return certifi.where()
    data = _combined_ca_bundle(tls.ca_cert_path, system_bundle)
    with contextlib.suppress(OSError):
        if ca_bundle.read_bytes() == data:
            return str(ca_bundle)
    # missing, or another run's (the CAs may have changed)
    write_file_atomically(ca_bundle, data, shared=True)
    return str(ca_bundle)


@functools.cache
def _combined_ca_bundle(ca_cert_path: str | None, system_bundle: str | None) -> bytes:
    """Combine certifi's CAs, the system's (spec) and ``ca_cert_path`` into one bundle.

    Why: botocore takes a single bundle file; it goes in the job's folder (a temporary file was left
    behind by every process killed while it sent). Bytes: a PEM bundle's comments may be in any
    encoding.
    Note: ``ca_cert_path`` is checked as the HTTP clients check it and read within bounds.
    """
    extra = b""
    if ca_cert_path:
        trusted_context(ca_cert_path)
        try:
            extra = read_settings_file(Path(ca_cert_path), "tls.ca_cert_path")
        except JsonFileError as exc:
            raise ValueError(str(exc)) from None
    parts = [Path(certifi.where()).read_bytes()]
    if system_bundle and os.path.isfile(system_bundle):
        parts.append(Path(system_bundle).read_bytes())
    parts.append(extra)
    return b"\n".join(parts)


SERVICE = "s3"
ENDPOINT_SETTING = "services.send.s3.endpoint"
MANIFEST_VERSION = 1
HIDDEN = "<hidden>"
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
        if (recorded := self._recorded(key, found)) is not None and self._is_stored(recorded):
            log.info(
                "S3 object %s is already in bucket %s (manifest); not uploading it again",
                key,
                self._bucket,
            )
            return recorded
        if (
            self._manifest.attempted(key)
            and (stored := self._stored_copy(path, key, found)) is not None
        ):
            where = (key, self._bucket)
            log.info(
                "S3 object %s is already in bucket %s with this content (an earlier run's upload)",
                *where,
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
            raise ServiceError(f"upload {key}", None, message, transient=False, service=SERVICE)
        elapsed, mb = time.perf_counter() - started, size / MB
        rate = (mb, elapsed, mb / max(elapsed, 1e-9))
        log.info(
            "uploaded %s to S3 bucket %s: %.1f MB in %.1f s (%.1f MB/s)", key, self._bucket, *rate
        )
        return uploaded

    def close(self) -> None:
        self._client.close()

    def _recorded(self, key: str, found: os.stat_result) -> UploadedObject | None:
        """Return the manifest's record of ``key`` if uploaded from the file as it is now."""
        recorded = self._manifest.recorded(key)
        if recorded is None or recorded.size != found.st_size:
            return None
        return recorded if recorded.source_modified_ns == found.st_mtime_ns else None

    def _is_stored(self, recorded: UploadedObject) -> bool:
        """Whether the bucket still holds the recorded object (same size and ETag)."""
        try:
            return self._head(recorded.key, f"check {recorded.key}") == (
                recorded.size,
                recorded.etag,
            )
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and _status_of(exc) == 404:
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
            raise ServiceError(operation, None, message, transient=False, service=SERVICE)
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
        """The object recorded as ``key`` in this bucket."""
        path, parse = self._record_path(key), functools.partial(_record, key)
        return _read_manifest_file(
            "S3 manifest record", path, self._bucket, parse, f"{key} is uploaded again"
        )

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


def _record(key: str, record: dict[str, Any]) -> UploadedObject:
    recorded = UploadedObject(
        record["key"], record["size"], record["etag"], record["source_modified_ns"]
    )
    if recorded.key != key:
        raise ValueError(f"it records key {recorded.key}")
    return recorded


def _read_manifest_file(
    what: str, path: Path, bucket: str | None, parse: Callable[[Any], T], then: str
) -> T | None:
    """Parse the JSON in ``path``; None when missing, unreadable or another's.

    Note: on None it logs why, then ``then``.
    """
    try:
        document = json.loads(path.read_bytes())
        parsed = parse(document)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s %s is unreadable (%s); %s", what, path, exc, then)
        return None
    if (described := document.get("bucket")) != bucket:
        log.warning("%s %s describes bucket %s, not %s; %s", what, path, described, bucket, then)
        return None
    return parsed


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


def configured_secrets(send: SendSettings) -> tuple[str, ...]:
    """Return each s3_upload credential, in each form an error text could hold it."""
    values = [send.s3.access_key_id, send.s3.secret_access_key, send.auth.password]
    secrets = [value.get_secret_value() for value in values if value is not None]
    if (login := basic_login(send.auth)) is not None:
        secrets.append(basic_credentials(*login))
    return tuple(secret for secret in secrets if secret)


def basic_credentials(username: str, password: str) -> str:
    """Encode ``user:password`` in Base64 of its UTF-8, as httpx sends Basic auth.

    Why: urllib3's helper encodes Latin-1: a password with € failed with a UnicodeEncodeError
    quoting a character of it.
    """
    return base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def service_error(
    operation: str, exc: BaseException, *, bucket: str | None, secrets: tuple[str, ...]
) -> ServiceError:
    """Classify a boto3 failure as a ``ServiceError``; its message holds no secret."""
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, ClientError):
        exc = exc.__context__  # boto3 wraps the ClientError of a failed upload into a text
    if isinstance(exc, ClientError):
        status = _status_of(exc)
        transient = status is not None and is_transient_status(status)
        message = _client_error_message(exc, status, bucket)
    else:
        status = None
        transient = isinstance(exc, HTTPClientError | BotoConnectionError) and not isinstance(
            exc, SSLError
        )
        message = (
            f"{'network error: ' if transient else ''}{type(exc).__name__}: "
            f"{exc}{nothing_answers(exc)}"
        )
    for secret in secrets:
        message = message.replace(secret, HIDDEN)
    message = truncate(message, MAX_MESSAGE_CHARS)
    return ServiceError(operation, status, message, transient=transient, service=SERVICE)


def nothing_answers(exc: BaseException) -> str:
    """Explain a connection to the store that could not be made; "" otherwise.

    Note: gives ``; nothing answers at <origin>: …`` naming ``services.send.s3.endpoint``. Without
    an endpoint configured, it is AWS's, reached by region.
    """
    if not isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return ""
    url = urlsplit(str(exc.kwargs.get("endpoint_url", "")))
    origin = f"{url.scheme}://{url.netloc}"
    if url.hostname and url.hostname.endswith(".amazonaws.com"):
        shown = shown_url(origin)
        return (
            f"; nothing answers at {shown}: is the network open to it, and are {ENDPOINT_SETTING} "
            "and region right?"
        )
    return nothing_answers_at(origin, ENDPOINT_SETTING)


def _status_of(exc: ClientError) -> int | None:
    status: int | None = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status


def _client_error_message(exc: ClientError, status: int | None, bucket: str | None) -> str:
    error = exc.response.get("Error", {})
    code, text = error.get("Code", ""), error.get("Message", "")
    message = f"{code}: {text}" if text and text != code else code or "no error text"
    if status == 407:
        return (
            f"{message}; the proxy in front of the store wants services.send.auth username and "
            "password"
        )
    if code == "NoSuchBucket":
        return f"{message}; bucket {bucket} (services.send.s3.bucket) does not exist"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
        return f"{message}; check services.send.s3.access_key_id and secret_access_key"
    return message
