"""Request bodies that can be sent more than once, for the auth flow (``tasks.clients.auth``) and the clients.

Below both ``auth`` and ``http``: each imports it downward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


class ReplayableBody:
    """A request body streamed from a function, afresh each time httpx iterates it: on every retry attempt, and
    when an OAuth token is replaced after a 401 (the auth flow then need not hold the whole body in memory)."""

    def __init__(self, make: Callable[[], Iterable[bytes]]):
        self._make = make

    def __iter__(self) -> Iterator[bytes]:
        yield from self._make()
