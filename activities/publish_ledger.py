"""The publish worker's ledger: which idempotency keys each tenant published,
and to which sink (SQLite under ``<data dir>/publish``, one exclusive file lock
per host so that processes agree). See :mod:`aiworker.activities.publish`."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from aiworker.activities.errors import InvalidInputError

# Keyed by tenant and key. The key-only table of earlier versions
# (``publications``) is left as it was and not read.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenant_publications (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    sink TEXT NOT NULL,
    state TEXT NOT NULL,
    status_code INTEGER,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
)
"""


class Entry(NamedTuple):
    """What the ledger knows of one key."""

    state: str
    status_code: int | None
    sink: str


class Ledger:
    """Which idempotency keys each tenant published, and where; shared by every
    process on a host."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.db_path = folder / "ledger.sqlite3"
        self.lock_path = folder / "ledger.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """An exclusive lock over the ledger (and the file sinks) with a connection."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
            try:
                conn.execute(_SCHEMA)
                yield conn
            finally:
                conn.close()
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def state(conn: sqlite3.Connection, tenant: str, key: str, sink: str) -> Entry | None:
        """The entry of ``(tenant, key)``; ``invalid_input`` if it names another sink."""
        row = conn.execute(
            "SELECT state, status_code, sink FROM tenant_publications WHERE tenant = ? AND key = ?",
            (tenant, key),
        ).fetchone()
        if row is None:
            return None
        entry = Entry(str(row[0]), row[1], str(row[2]))
        if entry.sink != sink:
            raise InvalidInputError(
                f"idempotency key {key!r} was published to {entry.sink} ({entry.state}); "
                f"this call names {sink}: a key publishes to one sink only",
                field="input.sink",
            )
        return entry

    @staticmethod
    def mark(
        conn: sqlite3.Connection,
        tenant: str,
        key: str,
        sink: str,
        state: str,
        status_code: int | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO tenant_publications "
            "(tenant, key, sink, state, status_code, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(tenant, key) DO UPDATE SET "
            "state = excluded.state, status_code = excluded.status_code, "
            "updated_at = excluded.updated_at",
            (tenant, key, sink, state, status_code, now_iso()),
        )


def now_iso() -> str:
    """Now, UTC, ISO 8601 to the millisecond."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
