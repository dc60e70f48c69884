"""Free ports on 127.0.0.1 for the tests' fakes and servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Any free port on 127.0.0.1, chosen by the kernel."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
