"""Read a download's streamed body in large pieces, off the socket where it can.

Note: for ``downloads``; the one module that reaches into httpcore.
"""

from collections.abc import Iterator

import httpcore
import httpx
from httpx._transports.default import map_httpcore_exceptions

from tasks.clients.bounds import declared_size

READ_SIZE = 1 << 20
DIRECT_READ_MIN_BYTES = 4 << 20  # a body this large is read off the socket itself (``body_pieces``)


def body_pieces(response: httpx.Response, read_timeout: float) -> Iterator[bytes]:
    """Yield a streamed body in the pieces the socket gives, ``READ_SIZE`` at most.

    Why: h11 and httpcore copy every byte four times under the GIL, about as long as the line check
    takes; a body of ``DIRECT_READ_MIN_BYTES`` or more sent as it is (neither ``Transfer-Encoding``
    nor ``Content-Encoding``) is read off the connection itself, which is then closed, not reused (a
    new connection costs less than copying 4 MiB four times).
    Note: the first piece is all that h11 holds of the body; the rest is still on the socket.
    """
    size, stream = declared_size(response), response.extensions.get("network_stream")
    headers = response.headers
    as_sent = "Transfer-Encoding" not in headers and "Content-Encoding" not in headers
    if size is None or size < DIRECT_READ_MIN_BYTES or stream is None or not as_sent:
        read_in_large_pieces(response)
        yield from response.iter_bytes()
        return
    pieces = response.iter_bytes()
    first = next(pieces, b"")
    yield first
    remaining = size - len(first)
    while remaining > 0:
        piece = _read(stream, min(READ_SIZE, remaining), read_timeout)
        remaining -= len(piece)
        yield piece


def _read(stream: httpcore.NetworkStream, size: int, timeout: float) -> bytes:
    """Read up to ``size`` bytes off ``stream``, failing as httpx does.

    Note: no bytes at all is a body cut short.
    """
    with map_httpcore_exceptions():
        piece = stream.read(size, timeout)
    if not piece:
        raise httpx.RemoteProtocolError("the server closed the connection before the body's end")
    return piece


def read_in_large_pieces(response: httpx.Response) -> None:
    """Let the connection take up to ``READ_SIZE`` bytes per socket read, not 64 KiB.

    Why: a quarter of a download's CPU time went to handling httpcore's small pieces.
    Note: httpcore has no option for it, so this sets private attributes; where they are missing
    (another version, HTTP/2) the download runs with smaller pieces.
    """
    bound = getattr(response.stream, "_stream", None)
    pooled = getattr(getattr(bound, "_httpcore_stream", None), "_stream", None)
    connection = getattr(pooled, "_connection", None)
    if connection is not None and isinstance(
        size := getattr(connection, "READ_NUM_BYTES", None), int
    ):
        connection.READ_NUM_BYTES = max(size, READ_SIZE)
