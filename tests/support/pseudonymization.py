"""The pseudonymizer client against the in-process fake: resources to send, a client opened on the fake, what the
fake saw, and a probe of concurrent calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from config.services import AuthSettings
from config.settings import RetrySettings, TlsSettings
from tasks.clients.http import ServiceClient, ServiceEndpoint
from tasks.clients.pseudonymizer import Pseudonymizer
from tests.conftest import TESTDATA
from tests.fakes._server import LoopbackServer
from tests.fakes.pseudonymizer import DEFAULT_SERVER_CONFIG, RecordedRequest, deidentify

OVERRIDE_DIR = TESTDATA / "pseudonymizer" / "request-override"
OVERRIDE_CONFIG = OVERRIDE_DIR / "anonymization.yaml"
FAST_RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=5)


@contextmanager
def open_service(
    pseudonymizer_fake: LoopbackServer | str,
    auth: AuthSettings | None = None,
    tls: TlsSettings | None = None,
    **options: Any,
) -> Iterator[Pseudonymizer]:
    """A client of the fake, or of the service at a URL (``tls`` for one over https, such as nginx before it)."""
    url = pseudonymizer_fake if isinstance(pseudonymizer_fake, str) else pseudonymizer_fake.base_url
    endpoint = ServiceEndpoint("pseudonymizer", url, auth or AuthSettings())
    with ServiceClient(endpoint, tls or TlsSettings(), FAST_RETRY) as client:
        yield Pseudonymizer(client, **options)


def pseudonymize(pseudonymizer_fake: LoopbackServer, resource: dict[str, Any], **options: Any):
    with open_service(pseudonymizer_fake, **options) as service:
        return service.pseudonymize(orjson.dumps(resource), resource)


def server_side(resource: dict[str, Any], pseudonymizer_fake: LoopbackServer) -> dict[str, Any]:
    """What the fake makes of ``resource`` with its own config (computed by the fake's code, not ours)."""
    return deidentify(resource, pseudonymizer_fake.state.config_for(DEFAULT_SERVER_CONFIG))


def patient(i: int, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Patient", "id": f"p{i}", "name": [{"family": f"Doe{i}"}], "gender": "female", **extra}


def observation_bundle(count: int, pad: int, bundle_id: str = "b1") -> dict[str, Any]:
    entries = [
        {
            "fullUrl": f"urn:uuid:obs-{i}",
            "resource": {
                "resourceType": "Observation",
                "id": f"o{i}",
                "valueInteger": i,
                "note": [{"text": "x" * pad}],
            },
        }
        for i in range(count)
    ]
    return {
        "resourceType": "Bundle",
        "id": bundle_id,
        "type": "collection",
        "timestamp": "2024-05-01T10:00:00Z",
        "entry": entries,
    }


class ConcurrencyProbe:
    """A fake status hook that holds each request a while (random when ``jitter``) and records how many overlap
    and in which order they finish (as indices of arrival).

    With ``fill``, the first requests are held until ``fill`` of them are in flight at once (or ``fill_timeout``
    passed), so the overlap the client allows is seen whatever the machine's load, not only when timing permits.
    """

    def __init__(
        self,
        pseudonymizer_fake: LoopbackServer,
        hold_seconds: float,
        jitter: bool = False,
        fill: int = 0,
        fill_timeout: float = 30.0,
    ):
        self._fake, self._hold, self._jitter = pseudonymizer_fake, hold_seconds, jitter
        self._fill, self._fill_timeout = fill, fill_timeout
        self._filled = threading.Event()
        self._lock = threading.Lock()
        self._current = 0
        self.most_in_flight = 0
        self.finished: list[int] = []

    def __call__(self, recorded: RecordedRequest) -> None:
        with self._lock:
            self._current += 1
            self.most_in_flight = max(self.most_in_flight, self._current)
            arrival = next(i for i, r in enumerate(self._fake.state.requests) if r is recorded)
            if self._current >= self._fill:
                self._filled.set()
        self._filled.wait(self._fill_timeout)
        time.sleep(self._hold * ((hash((arrival, 7)) % 100) / 100 if self._jitter else 1))
        with self._lock:
            self._current -= 1
            self.finished.append(arrival)
        return None


def pseudonymizer_job(pseudonymizer_fake: LoopbackServer, concurrency: int = 4) -> dict:
    """The configuration tree of a local import, then the pseudonymizer step on the fake service."""
    return {
        "pipeline": {"enabled_steps": ["local_import", "pseudonymizer"]},
        "compression": {"level": "fastest"},
        "retry": {"initial_backoff_ms": 1, "max_backoff_ms": 5},
        "services": {
            "pseudonymizer": {"url": pseudonymizer_fake.base_url, "max_concurrent_requests": concurrency},
        },
    }
