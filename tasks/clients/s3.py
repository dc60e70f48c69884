"""boto3 S3 client factory for the s3_upload send mode: endpoint, addressing, TLS, timeouts, retry, proxy auth.

The S3 API is authenticated by ``s3.access_key_id`` / ``s3.secret_access_key``. ``send.auth`` username and
password become a ``Proxy-Authorization: Basic`` header on every request for an upstream proxy in front of the
store; ``api_key`` is ignored. The header is added on botocore's ``before-send`` event, after SigV4 signing, so
it is not part of the signature and a proxy may strip it without breaking the request.

botocore does its own retry backoff; only the number of attempts (``retry.max_attempts``) carries over.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import certifi
from botocore.config import Config
from urllib3.util import make_headers

if TYPE_CHECKING:
    from config.settings import RetrySettings, SendSettings, TlsSettings

log = logging.getLogger("dupflow.clients")

DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0


def make_s3_client(send: SendSettings, tls: TlsSettings, retry: RetrySettings) -> Any:
    """A boto3 S3 client configured from ``services.send`` (its ``s3`` block and ``auth``), ``tls`` and ``retry``."""
    s3 = send.s3
    timeout = s3.timeout.total_seconds()
    client = boto3.session.Session().client(
        "s3",
        region_name=s3.region,
        endpoint_url=s3.endpoint or None,
        aws_access_key_id=s3.access_key_id.get_secret_value() if s3.access_key_id else None,
        aws_secret_access_key=s3.secret_access_key.get_secret_value() if s3.secret_access_key else None,
        verify=s3_verify(tls),
        config=Config(
            s3={"addressing_style": "path" if s3.use_path_style else "auto"},
            connect_timeout=min(DEFAULT_CONNECT_TIMEOUT_SECONDS, timeout),
            read_timeout=timeout,
            retries={"mode": "standard", "total_max_attempts": retry.max_attempts},
        ),
    )
    proxy_auth = send.auth.uses_basic
    if proxy_auth:
        client.meta.events.register(
            "before-send.s3", ProxyAuthorization(send.auth.username, send.auth.password.get_secret_value())
        )
    log.info(
        "S3 client for bucket %s at %s (%s addressing)%s",
        s3.bucket,
        s3.endpoint or "the default endpoint",
        "path-style" if s3.use_path_style else "automatic",
        " with proxy authentication" if proxy_auth else "",
    )
    return client


class ProxyAuthorization:
    """botocore ``before-send`` handler that sets ``Proxy-Authorization: Basic …``; its repr hides the value."""

    def __init__(self, username: str, password: str):
        self._header = make_headers(proxy_basic_auth=f"{username}:{password}")["proxy-authorization"]

    def __call__(self, request: Any, **_: Any) -> None:
        request.headers["Proxy-Authorization"] = self._header

    def __repr__(self) -> str:
        return "ProxyAuthorization(<hidden>)"


def s3_verify(tls: TlsSettings) -> str | bool:
    """botocore's ``verify``: False when skipping, else a CA bundle file (certifi + system CAs + ca_cert_path)."""
    if tls.insecure_skip_verify:
        log.warning(
            "TLS certificate verification is disabled for S3 (tls.insecure_skip_verify); "
            "use this for development and testing only"
        )
        return False
    if not tls.ca_cert_path:
        return certifi.where()
    return _combined_ca_bundle(tls.ca_cert_path)


@functools.cache
def _combined_ca_bundle(ca_cert_path: str) -> str:
    """botocore takes a single bundle file, so the extra PEMs are appended to the default CAs in a temp file."""
    try:
        extra = Path(ca_cert_path).read_text()
    except OSError as exc:
        raise ValueError(f"tls.ca_cert_path {ca_cert_path}: cannot read PEM bundle: {exc}") from exc
    parts = [Path(certifi.where()).read_text()]
    system_bundle = ssl.get_default_verify_paths().cafile
    if system_bundle and os.path.isfile(system_bundle):
        parts.append(Path(system_bundle).read_text())
    parts.append(extra)
    with tempfile.NamedTemporaryFile("w", prefix="dupflow-ca-", suffix=".pem", delete=False) as bundle:
        bundle.write("\n".join(parts))
    atexit.register(Path(bundle.name).unlink, missing_ok=True)
    return bundle.name
