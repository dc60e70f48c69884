"""The one retry policy of every outgoing call (tenacity is the engine).

See docs/development.md#service-clients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, Unpack

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from tasks.clients.errors import Call, ServiceError, is_transient_network_error, network_error
from tasks.streams.fanout import Sleep, pause, raise_if_cancelled

if TYPE_CHECKING:
    from config.settings import RetrySettings

log = logging.getLogger("dupflow.clients")

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    return exc.transient if isinstance(exc, ServiceError) else is_transient_network_error(exc)


def call_with_retry(
    attempt: Callable[[], T],
    retry: RetrySettings,
    *,
    sleep: Sleep = pause,
    **where: Unpack[Call],
) -> T:
    max_backoff = retry.max_backoff_ms / 1000
    backoff = wait_exponential(multiplier=retry.initial_backoff_ms / 1000, max=max_backoff)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = exc.retry_after if isinstance(exc, ServiceError) else None
        return backoff(state) if retry_after is None else min(retry_after, max_backoff)

    def log_retry(state: RetryCallState) -> None:
        # a cancelled fan-out's call (its client closed under it) is not retried
        raise_if_cancelled()
        who = f"{where['service']}: " if where["service"] else ""
        failed = f"{who}{where['operation']} failed"
        assert state.outcome is not None, "tenacity calls before_sleep once an attempt has failed"
        exc = state.outcome.exception()
        said = str(exc) or type(exc).__name__  # many network errors have no text
        # a ServiceError of this call says it
        shown = said if said.startswith(failed) else f"{failed} ({said})"
        log.warning(
            "%s; attempt %d of %d, retrying in %.1f s",
            shown,
            state.attempt_number,
            retry.max_attempts,
            state.upcoming_sleep,  # the wait's answer, as tenacity is about to sleep it
        )

    retrying = Retrying(
        sleep=sleep,
        stop=stop_after_attempt(retry.max_attempts),
        wait=wait,
        retry=retry_if_exception(is_transient),
        before_sleep=log_retry,
        reraise=True,
    )
    return call_once(lambda: retrying(attempt), **where)


def call_once(attempt: Callable[[], T], **where: Unpack[Call]) -> T:
    """Make exactly one attempt, its network error raised as a ``ServiceError``."""
    try:
        return attempt()
    except httpx.TransportError as exc:
        raise network_error(exc, **where) from exc
