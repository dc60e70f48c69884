"""Where a secret could have gone: its forms as bytes, and every text of a Prefect SQLite database."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path


def forms(value: str) -> list[bytes]:
    """``value`` as it may leak: raw, base64 and URL-safe base64 (unpadded, so padded forms match too)."""
    raw = value.encode()
    return [raw, base64.b64encode(raw).rstrip(b"="), base64.urlsafe_b64encode(raw).rstrip(b"=")]


def database_texts(database: Path) -> bytes:
    """Every text and blob column of every row of every table, as bytes."""
    found = []
    with sqlite3.connect(database) as connection:
        tables = [row[0] for row in connection.execute("select name from sqlite_master where type='table'")]
        for table in tables:
            for row in connection.execute(f'select * from "{table}"'):
                found += [v.encode() if isinstance(v, str) else v for v in row if isinstance(v, str | bytes)]
    return b"\n".join(found)
