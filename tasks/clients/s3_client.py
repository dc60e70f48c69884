"""The boto3 S3 client of s3_upload: TLS, proxy auth, errors without secrets.

See docs/development.md#service-clients.
"""

import contextlib
import functools
import logging
import os
import re
import ssl
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import certifi
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionError as BotoConnectionError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    SSLError,
)
from botocore.utils import get_environ_proxies

from config.services import SendSettings
from config.settings import PROXY_AUTH_WITHOUT_ENDPOINT, RetrySettings, TlsSettings
from tasks.clients.http import INSECURE_WARNING, http_timeout, trusted_context
from tasks.clients.errors import (
    MAX_MESSAGE_CHARS,
    ServiceError,
    is_transient_status,
    nothing_answers_at,
)
from tasks.core.jsonfile import JsonFileError, read_settings_file
from tasks.core.readable import truncate
from tasks.core.redaction import redact_record
from tasks.core.url_credentials import shown_url
from tasks.streams.files import write_file_atomically

log = logging.getLogger("dupflow.clients")

SERVICE = "s3"
ENDPOINT_SETTING = "services.send.s3.endpoint"
HIDDEN = "<hidden>"
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
    timeout = http_timeout(s3.timeout)  # a connect at most 10 s, as every client's
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
                connect_timeout=timeout.connect,
                read_timeout=timeout.read,
                retries={"mode": "standard", "total_max_attempts": retry.max_attempts},
                **(COMPATIBLE_CHECKSUMS if s3.endpoint else {}),
            ),
        )
    if credentials := send.auth.basic_header_token:
        refuse_proxy_auth_beyond_the_proxy(send)
        client.meta.events.register("before-send.s3", ProxyAuthorization(credentials))
    log.info(
        "S3 client for bucket %s at %s (%s addressing)%s",
        s3.bucket,
        s3.endpoint or "the default endpoint",
        "path-style" if s3.use_path_style else "automatic",
        " with proxy authentication" if credentials else "",
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
    elif endpoint.lower().startswith("https:") and get_environ_proxies(endpoint).get("https"):
        message = (
            "services.send.auth (the proxy's Basic Auth) is sent in a header of each request to "
            "services.send.s3.endpoint, but HTTPS_PROXY routes that https endpoint through a "
            "forward proxy, which would get no credentials while the header travelled on to the "
            "store; set the proxy itself as services.send.s3.endpoint, or exempt the endpoint "
            "with NO_PROXY, or remove username/password from services.send.auth"
        )
    else:
        return
    raise ServiceError("connect to S3", None, message, service=SERVICE)


_SESSION_LOCK = threading.Lock()


@functools.cache
def _session() -> boto3.session.Session:
    return boto3.session.Session()


BOTOCORE_CREDENTIALS = re.compile(
    r"('(?:Proxy-)?Authorization': )b?'[^']*'|(<AWSAccessKeyId>)[^<]*(?=</AWSAccessKeyId>)"
)


def hide_credentials_in_botocore_debug_logs(record: logging.LogRecord) -> bool:
    """Blank out the access key id in botocore's DEBUG records (a logging filter).

    Note: the ``Authorization`` header and an error body's ``<AWSAccessKeyId>``.
    ``Proxy-Authorization`` is added after botocore logs the request.
    """
    message = record.getMessage()
    cleaned = BOTOCORE_CREDENTIALS.sub(
        lambda match: (match.group(1) or match.group(2)) + "'<hidden>'", message
    )
    if cleaned != message:
        record.msg, record.args = cleaned, ()
    return True


for _logger_name in ("botocore.endpoint", "botocore.parsers"):
    logging.getLogger(_logger_name).addFilter(hide_credentials_in_botocore_debug_logs)
    # a response body quoting a registered secret
    logging.getLogger(_logger_name).addFilter(redact_record)


class ProxyAuthorization:
    """botocore ``before-send`` handler setting ``Proxy-Authorization``.

    Note: a class, not a ``functools.partial``: botocore's debug log names each handler it
    calls, and a partial's repr would show the header (``test_client_s3``'s debug-log test).
    """

    def __init__(self, credentials: str):
        self._header = "Basic " + credentials

    def __call__(self, request: Any, **_: Any) -> None:
        request.headers["Proxy-Authorization"] = self._header


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


def configured_secrets(send: SendSettings) -> tuple[str, ...]:
    """Return each s3_upload credential, in each form an error text could hold it."""
    values = [send.s3.access_key_id, send.s3.secret_access_key, send.auth.password]
    secrets = [value.get_secret_value() for value in values if value is not None]
    return tuple(secret for secret in [*secrets, send.auth.basic_header_token] if secret)


def service_error(
    operation: str, exc: BaseException, *, bucket: str | None, secrets: tuple[str, ...]
) -> ServiceError:
    """Classify a boto3 failure as a ``ServiceError``; its message holds no secret."""
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, ClientError):
        exc = exc.__context__  # boto3 wraps the ClientError of a failed upload into a text
    if isinstance(exc, ClientError):
        status = status_of(exc)
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


def status_of(exc: ClientError) -> int | None:
    """The HTTP status of the store's error answer, if it had one."""
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
