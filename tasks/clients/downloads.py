"""Streaming download of one NDJSON file into the job directory; no Prefect.

Note: for ``extractor`` and ``http_import``. See docs/development.md#service-clients.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httpx

from tasks.clients.body_reads import body_pieces
from tasks.clients.bounds import Deadline, answer_within, declared_size
from tasks.clients.errors import (
    Call,
    ServiceError,
    is_transient_network_error,
    is_transient_status,
    json_or_none,
    network_error,
    raise_for_service_status,
)
from tasks.clients.http import http_timeout, service_name
from tasks.clients.retry import call_with_retry
from tasks.core.errors import StepError
from tasks.core.names import name_from_data_problem, name_key, show_name
from tasks.core.url_credentials import shown_url
from tasks.streams.ndjson_writer import AtomicNdjsonWriter
from tasks.streams.fanout import Sleep, pause
from tasks.streams.processes import CountCallback, uncounted
from tasks.streams.ndjson import (
    CompressionLevel,
    FileStats,
    TruncatedLineError,
    UnsafeNameError,
    StreamDecoder,
    first_non_blank,
    output_name,
)

if TYPE_CHECKING:
    from config.settings import RetrySettings

NDJSON_ACCEPT = "application/fhir+ndjson"
PROBE_FALLBACK_STATUSES = (403, 404, 405)
PROBE_DEADLINE = timedelta(seconds=30)
PROBE_TIMEOUT = http_timeout(PROBE_DEADLINE)
DEFAULT_MAX_FILES = 100_000
# a 206's "bytes <first>-<last>/<size>" (its first byte), a 416's "bytes */<size>"
CONTENT_RANGE = re.compile(r"bytes (?:(\d+)(?:-|\Z)|\*/(\d+)\Z)")


class DownloadError(StepError):
    """A download that failed terminally; the message names the URL and what to do."""


def safe_file_name(url: str, compress: bool) -> str:
    """Name a file ``<last URL segment>`` forced to ``.ndjson`` (+ ``.zst``).

    Note: path parameters (``;jsessionid=…``) are dropped; names that could leave the folder are
    refused.
    """
    raw_path = httpx.URL(url).raw_path.decode("ascii").split("?", 1)[0]
    # split before decoding: %2F, %3B are data
    segment = unquote(raw_path.rsplit("/", 1)[-1].split(";", 1)[0])
    if problem := name_from_data_problem(segment):
        raise DownloadError(
            f"{shown_url(url)}: cannot use {show_name(segment)} as a file name in import/: it "
            f"{problem}; the URL must end with a plain file name"
        )
    try:
        return output_name(segment, compress)
    except UnsafeNameError as exc:
        raise DownloadError(
            f"{shown_url(url)}: {exc}; the server must list plain file names"
        ) from None


def target_names(
    urls: Iterable[str], compress: bool, max_files: int = DEFAULT_MAX_FILES
) -> dict[str, str]:
    """Map each URL to its file name in ``import/``.

    Note: two URLs on one name, or more than ``max_files`` URLs, are an error.
    """
    owners: dict[str, tuple[str, str]] = {}
    for count, url in enumerate(urls, start=1):
        if count > max_files:
            raise DownloadError(
                f"the result lists more than {max_files:,} files, more than "
                "services.extractor.max_result_files allows; check the extraction (raise the key "
                "if the result is really that large)"
            )
        name = safe_file_name(url, compress)
        if (key := name_key(name)) in owners and owners[key][1] != url:
            raise DownloadError(
                f"{shown_url(owners[key][1])} and {shown_url(url)} would both be saved as {name} "
                "(a file system that ignores case takes them for one file); the server listed "
                "two files with the same name"
            )
        owners[key] = (name, url)
    return {url: name for name, url in owners.values()}


def wait_until_available(
    client: httpx.Client,
    url: str,
    *,
    checks: int,
    interval: timedelta,
    sleep: Sleep = pause,
) -> None:
    """Check up to ``checks`` times, ``interval`` apart, that the file can be fetched."""
    for check in range(checks):
        if is_available(client, url):
            return
        if check < checks - 1:
            sleep(interval.total_seconds())
    if checks > 0:
        raise DownloadError(
            f"{shown_url(url)} was still not available after {checks} checks "
            f"{interval.total_seconds():g} s apart; raise services.extractor.file_ready_retries "
            "or file_ready_interval, or run continue later"
        )


def is_available(client: httpx.Client, url: str) -> bool:
    """Tell whether ``url`` is ready: HEAD, else a GET of the first byte.

    Note: not ready: a 404, a transient status or a network error; any other 4xx is terminal (401:
    the credentials are wrong).
    """
    status = _probe_status(client, "HEAD", url)
    if status in PROBE_FALLBACK_STATUSES:
        status = _probe_status(client, "GET", url, headers={"Range": "bytes=0-0"})
        if status == 404:
            return False
    if status is None or is_transient_status(status):
        return False
    if status < 400 or status == 416:  # 416: an empty file has no byte 0, but it exists
        return True
    raise DownloadError(
        f"{shown_url(url)}: the availability check was answered HTTP {status}; check the "
        "credentials and the URL"
    )


def _probe_status(
    client: httpx.Client, method: str, url: str, headers: dict[str, str] | None = None
) -> int | None:
    """Return the status of a request whose body is never read.

    Note: a server may ignore Range.
    Note: None on a network error that waiting may cure or no answer within ``PROBE_DEADLINE``; an
    untrusted certificate or an unsupported URL is raised at once.
    """
    call: Call = {"operation": "check that a result file is ready", "service": service_name(client)}
    deadline = Deadline(PROBE_DEADLINE, "PROBE_DEADLINE of tasks/clients/downloads.py, 30 s")
    try:
        with answer_within(
            client, deadline, method, url, **call, headers=headers, timeout=PROBE_TIMEOUT
        ) as response:
            return response.status_code
    except ServiceError as exc:  # no answer within the deadline; else refused (compressed, login)
        if exc.no_answer:
            return None
        raise
    except httpx.TransportError as exc:
        if is_transient_network_error(exc):
            return None
        raise network_error(exc, **call) from exc


def download_ndjson(
    client: httpx.Client,
    url: str,
    dest: Path,
    *,
    level: CompressionLevel | None,
    max_line_bytes: int,
    stall_timeout: timedelta,
    retry: RetrySettings,
    on_bytes: CountCallback = uncounted,
    on_total: CountCallback = uncounted,
) -> FileStats:
    """Stream ``url`` into ``dest``; return its size and resource count.

    Note: compressed at ``level``, plain when None. ``on_bytes`` is told every piece of the body as
    it arrives, ``on_total`` its Content-Length when given.
    """
    new_sink = functools.partial(_Sink, url, dest, level, max_line_bytes)
    download = _Download(client, url, stall_timeout, on_bytes, on_total, new_sink)
    try:
        return call_with_retry(
            download.attempt,
            retry,
            operation=f"download {shown_url(url)}",
            service=service_name(client),
        )
    finally:
        download.discard()


@dataclass
class _Download:
    """One file across attempts, fed as it arrives into a ``_Sink``.

    Why: after a break the next attempt asks for the rest only (``Range``), so every byte is
    decoded, checked and counted once (a 200 instead starts over).
    """

    _client: httpx.Client
    _url: str
    _stall_timeout: timedelta
    _on_bytes: CountCallback
    _on_total: CountCallback
    _new_sink: Callable[[], _Sink]
    _sink: _Sink | None = None
    _received: int = 0  # body bytes in the sink
    _told: int = 0  # body bytes told to on_bytes

    def attempt(self) -> FileStats:
        url, headers = self._url, {"Accept": NDJSON_ACCEPT}
        if self._received:
            headers["Range"] = f"bytes={self._received}-"
        with contextlib.ExitStack() as stack:
            try:
                response = stack.enter_context(
                    self._client.stream(
                        "GET", url, headers=headers, timeout=http_timeout(self._stall_timeout)
                    )
                )
            except httpx.ReadTimeout as exc:
                raise self._stalled() from exc
            if (
                response.status_code == 416
                and self._received
                and content_range(response)[1] == self._received
            ):
                # every byte had come; only the body's end was lost (a chunked body's last)
                return self._finished()
            raise_for_service_status(
                response, operation=f"download {shown_url(url)}", service=service_name(self._client)
            )
            check_response(response, url, resuming_at=self._received)
            # the whole file: a first attempt, or a server that ignored the Range
            if response.status_code == 200:
                self.discard()
                # told of earlier attempts: taken back in one, so the bytes done never exceed the
                # file
                if self._told:
                    self._progress(-self._told)
                if (size := declared_size(response)) is not None:
                    self._on_total(size)
                self._sink = self._new_sink()
            assert self._sink is not None
            self._receive(response)
        return self._finished()

    def _receive(self, response: httpx.Response) -> None:
        """Feed the body into the sink as the socket gives it.

        Why: ``iter_bytes(size)`` would copy it again.
        """
        assert self._sink is not None
        try:
            for chunk in body_pieces(response, self._stall_timeout.total_seconds()):
                self._progress(len(chunk))
                self._sink.write(chunk)
                self._received += len(chunk)
        except httpx.ReadTimeout as exc:
            raise self._stalled() from exc
        except httpx.TransportError as exc:
            message = (
                f"the connection broke after {self._received:,} bytes of the file "
                f"({type(exc).__name__}: {exc}); resumed from there while retry.max_attempts "
                "allows, then run continue to download it again"
            )
            raise ServiceError(
                f"download {shown_url(self._url)}", None, message, transient=True
            ) from exc

    def _progress(self, amount: int) -> None:
        self._told += amount
        self._on_bytes(amount)

    def _finished(self) -> FileStats:
        assert self._sink is not None
        try:
            return self._sink.finish()
        # no Content-Length told the body was short: read it again
        except TruncatedLineError as exc:
            message = f"{exc} (the connection ended before the whole file arrived)"
            raise ServiceError(
                f"download {shown_url(self._url)}", None, message, transient=True
            ) from None
        finally:
            # the temporary file of a file that failed its last checks; nothing after the rename
            self.discard()

    def _stalled(self) -> DownloadError:
        return DownloadError(
            f"{shown_url(self._url)}: no data arrived for {self._stall_timeout.total_seconds():g} "
            "s, download cancelled (services.extractor.download_stall_timeout); run continue to "
            "download it again"
        )

    def discard(self) -> None:
        if self._sink is not None:
            self._sink.discard()
        self._sink, self._received = None, 0


def check_response(response: httpx.Response, url: str, resuming_at: int) -> None:
    """Refuse an answer that is no file: only a 200 with a non-HTML body is one.

    Why: never save a proxy's error page.
    Note: asked for the rest from ``resuming_at``, a 206 from exactly there.
    """
    if response.status_code == 206 and resuming_at and content_range(response)[0] != resuming_at:
        raise DownloadError(
            f"{shown_url(url)}: asked for the file from byte {resuming_at:,}, the server sent "
            f"{response.headers.get('Content-Range', 'no Content-Range')!r}; run continue to "
            "download it again"
        )
    if response.status_code != 200 and not (response.status_code == 206 and resuming_at):
        raise DownloadError(
            f"{shown_url(url)}: expected HTTP 200 with the file, got HTTP {response.status_code}"
        )
    if response.headers.get("Content-Type", "").split(";")[0].strip().lower() == "text/html":
        raise DownloadError(
            f"{shown_url(url)}: the server answered with an HTML page, not NDJSON; check the URL"
        )


def content_range(response: httpx.Response) -> tuple[int | None, int | None]:
    """Return a 206's first byte (``Content-Range``) and a 416's ``bytes */size``."""
    match = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    first, size = match.groups() if match else (None, None)
    return int(first) if first else None, int(size) if size else None


class _Sink:
    """Where a download's body goes across connections, until ``finish``/``discard``.

    Note: zstd decoded, its first line checked, written through ``AtomicNdjsonWriter`` (which checks
    every line).
    """

    def __init__(self, url: str, dest: Path, level: CompressionLevel | None, max_line_bytes: int):
        source = shown_url(url)
        self._dest, self._decoder = dest, StreamDecoder(source)
        self._first_line = FirstLineCheck(url, max_line_bytes)
        self._writer = AtomicNdjsonWriter(dest, level, max_line_bytes, source, zstd_thread=True)
        # left by finish or discard: a sink spans attempts, no ``with`` block
        self._writer.__enter__()

    def write(self, chunk: bytes) -> None:
        for data in self._decoder.feed(chunk):
            self._write_all(self._first_line.feed(data))

    def finish(self) -> FileStats:
        for data in self._decoder.finish():
            self._write_all(self._first_line.feed(data))
        self._write_all(self._first_line.finish())
        self._writer.__exit__(None, None, None)
        assert self._writer.stats is not None
        return self._writer.stats

    def discard(self) -> None:
        self._writer.discard()

    def _write_all(self, pieces: Iterable[bytes]) -> None:
        try:
            for data in pieces:
                self._writer.write(data)
        except OSError as exc:
            raise DownloadError(
                f"writing {self._dest} failed: {exc}; free space or fix permissions, then run "
                "continue"
            ) from exc


class FirstLineCheck:
    """Hold the body back until its first non-empty line proves a JSON object.

    Why: an HTML page must not be saved.
    Note: blank data before it pass at once, and a first line over ``max_line_bytes`` unchecked: the
    writer limits both.
    """

    def __init__(self, url: str, max_line_bytes: int):
        self._url, self._max_line_bytes = url, max_line_bytes
        self._pending: bytearray | None = bytearray()  # None once the first line is checked
        self._content_at = -1

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if (pending := self._pending) is None:
            yield chunk
            return
        searched = len(pending)
        pending += chunk
        if self._content_at < 0:
            self._content_at = first_non_blank(pending, searched)
            if self._content_at == len(pending):
                self._content_at = -1
                yield bytes(pending)
                pending.clear()
                return
        if pending.find(b"\n", max(searched, self._content_at)) >= 0:
            yield from self.finish()
        elif len(pending) > self._max_line_bytes:
            self._pending = None
            yield bytes(pending)

    def finish(self) -> Iterator[bytes]:
        pending, self._pending = self._pending, None
        if not pending:
            return
        if self._content_at >= 0:
            line = bytes(pending[self._content_at :]).split(b"\n", 1)[0]
            if line.startswith(b"<"):
                raise DownloadError(
                    f"{shown_url(self._url)}: the server answered with an HTML or XML page, not "
                    "NDJSON; check the URL"
                )
            if not isinstance(json_or_none(line), dict):
                raise DownloadError(
                    f"{shown_url(self._url)}: the body is not NDJSON (its first line is not a JSON "
                    "object)"
                )
        yield bytes(pending)
