"""A PostgreSQL server of Debian's packages for the tests of Prefect on PostgreSQL: its data in a temporary folder,
its own port on 127.0.0.1, run as an unprivileged user when the tests run as root (PostgreSQL refuses root),
stopped and removed at the end of the module."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port

NOBODY = 65534


def postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise pytest.UsageError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does it)")
    return found[-1].parent


def as_server_user(*command: str | Path) -> None:
    prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    subprocess.run([*prefix, *map(str, command)], check=True, capture_output=True, timeout=120)


@dataclass(frozen=True)
class Postgres:
    """A running server: its ``url``, and ``stop``/``start`` to take it away from the clients and give it back."""

    url: str
    data: Path
    log: Path
    options: str

    def stop(self) -> None:
        """As a crash or an operator's immediate shutdown does: the clients' connections end at once."""
        as_server_user(postgres_bin() / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def start(self) -> None:
        as_server_user(postgres_bin() / "pg_ctl", "-D", self.data, "-o", self.options, "-l", self.log, "-w", "start")


@contextmanager
def running_postgres() -> Iterator[Postgres]:
    """A fresh server (trust on 127.0.0.1 only) at ``postgresql+asyncpg://prefect@127.0.0.1:PORT/prefect``."""
    binaries, root, port = postgres_bin(), Path(tempfile.mkdtemp(prefix="dupflow-postgres-")), free_port()
    if os.geteuid() == 0:
        os.chown(root, NOBODY, NOBODY)
    data = root / "data"
    as_server_user(binaries / "initdb", "-D", data, "-U", "prefect", "-A", "trust", "--no-sync", "-E", "UTF8")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    server = Postgres(f"postgresql+asyncpg://prefect@127.0.0.1:{port}/prefect", data, root / "postgres.log", options)
    server.start()
    try:
        as_server_user(binaries / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "prefect")
        yield server
    finally:
        with suppress(subprocess.CalledProcessError):  # a test may have left it stopped
            as_server_user(binaries / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def postgres_url(postgres: Postgres) -> str:
    return postgres.url


def query(url: str, sql: str, *arguments: Any) -> list[tuple]:
    """The rows of one query, read with asyncpg (Prefect's own driver for PostgreSQL)."""
    import asyncpg

    async def fetch() -> list[tuple]:
        connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return [tuple(row) for row in await connection.fetch(sql, *arguments)]
        finally:
            await connection.close()

    return asyncio.run(fetch())
