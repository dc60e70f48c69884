"""The bodies the clients stream: a request body made afresh for each send (``ReplayableBody``), an answer's body
left unread (``UnreadBody``) and one read at most to a limit (``CappedBody``). No Prefect here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator

import httpx


class ReplayableBody:
    """A request body streamed from a function, afresh each time httpx iterates it: on every retry attempt, and
    when an OAuth token is replaced after a 401 (the auth flow then need not hold the whole body in memory)."""

    def __init__(self, make: Callable[[], Iterable[bytes]]):
        self._make = make

    def __iter__(self) -> Iterator[bytes]:
        yield from self._make()


class UnreadBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """The body of an answer that is not used: a redirect's, or a 401's answered with a fresh token. httpx reads such
    an answer whole before it sends the next request, streamed call or not; given this body it reads nothing, and
    closing it closes the connection (one with a body left unread cannot carry another request)."""

    def __init__(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream):
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        yield from ()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        return
        yield  # makes this an async generator: one that yields nothing

    def close(self) -> None:
        assert isinstance(self._stream, httpx.SyncByteStream), "httpx closes a sync client's answers only"
        self._stream.close()

    async def aclose(self) -> None:
        assert isinstance(self._stream, httpx.AsyncByteStream), "httpx acloses an async client's answers only"
        await self._stream.aclose()


def leave_unread(response: httpx.Response) -> None:
    response.stream = UnreadBody(response.stream)


class CappedBody(httpx.SyncByteStream):
    """A sync answer's body as sent, at most ``limit`` bytes of it: ``too_large()`` is raised once more comes."""

    def __init__(self, stream: httpx.SyncByteStream, limit: int, too_large: Callable[[], Exception]):
        self._stream, self._limit, self._too_large = stream, limit, too_large

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for piece in self._stream:
            seen += len(piece)
            if seen > self._limit:
                raise self._too_large()
            yield piece

    def close(self) -> None:
        self._stream.close()


def replayable(request: httpx.Request) -> bool:
    """A body that can be streamed again (``ReplayableBody``), so a resend after a 401 needs no copy in memory
    (httpx keeps the iterable given as ``content`` as its stream's ``_stream``)."""
    return isinstance(getattr(request.stream, "_stream", None), ReplayableBody)
