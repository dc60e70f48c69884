"""Free ports on 127.0.0.1 for the tests' fakes and servers.

A server the tests start binds its port seconds after the port was found free (a Prefect server imports first). A
port from the kernel's ephemeral range (``ip_local_port_range``, 32768-60999 here) may meanwhile become the local port
of any client connection on the machine (CI saw one take the port above a taken one), so the ports come from below
that range, a block of its own for each pytest-xdist worker, in turn: no other worker, connection or earlier server of
this one (still in TIME_WAIT) is handed the same port. Each process begins at a random place in its block, so two
suites on one machine rarely walk the same ports at the same time.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

FIRST, BLOCK, BLOCKS = 20000, 1500, 8  # 20000-31999, below the ephemeral range


def worker_block() -> range:
    """This process's ports: the block of its xdist worker (``gw3`` → the fourth), the first block otherwise."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = FIRST + (int(worker) if worker.isdigit() else 0) % BLOCKS * BLOCK
    return range(start, start + BLOCK)


_block = worker_block()
_candidates = itertools.islice(itertools.cycle(_block), random.randrange(BLOCK), None)


def free_port() -> int:
    """A port of this worker's block that nothing holds now (no listener, no connection, none in TIME_WAIT)."""
    for _ in range(BLOCK):
        port = next(_candidates)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {_block} on 127.0.0.1")
