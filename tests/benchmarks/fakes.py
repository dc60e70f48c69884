"""A fake service in a process of its own, so its CPU does not count against the code being measured."""

from __future__ import annotations

import importlib
import multiprocessing
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def serve(starter: str, options: dict[str, Any], ports: multiprocessing.Queue) -> None:
    """Child process: start the fake ``module:function`` with ``options``, report its port, serve until ended."""
    module, function = starter.split(":")
    server = getattr(importlib.import_module(module), function)(**options)
    ports.put(server.port)
    while True:
        time.sleep(3600)


@contextmanager
def fake_in_own_process(starter: str, **options: Any) -> Iterator[str]:
    """The base URL of the fake ``starter`` (e.g. ``tests.fakes.validator:start_validator``) run in a child."""
    context = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = context.Queue()
    process = context.Process(target=serve, args=(starter, options, ports), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{ports.get(timeout=60)}"
    finally:
        process.terminate()
        process.join(10)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
