"""The ``publish`` worker: the pipeline's side effect, exactly once per key.

Sinks: ``{"file": <path under <data dir>/sinks>}`` appends one JSON line
``{"idempotency_key", "tenant", "published_at", "record"}``;
``{"webhook": <url>}`` POSTs the record with an ``Idempotency-Key`` header.

Exactly once rests on a ledger (SQLite under ``<data dir>/publish``) keyed by
the request's idempotency key, guarded by an exclusive file lock so that
processes on one host agree. A key is claimed (``pending``) before the write
and marked ``done`` after it. A retry, replay or redrive that finds ``done``
returns ``duplicate: true`` without writing. A crash between the write and
``done`` leaves ``pending``: for a file sink the sink itself is then searched
for the key, so the line is never appended twice; for a webhook the POST is
repeated with the same ``Idempotency-Key``, which is the receiver's cue to
drop it (the contract every idempotent HTTP API documents).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from aiworker.activities.bodies import BodyMeter, read_body
from aiworker.activities.errors import (
    AccessDeniedError,
    FetchFailedError,
    FetchTimeoutError,
    InvalidInputError,
    NotFoundError,
    RateLimitedError,
)
from aiworker.activities.retry_after import parse_retry_after
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.fetch import guarded_transport
from aiworker.schemas.catalog import builtin_spec
from aiworker.schemas.settings import Settings

# A webhook's reply is never used: read this much of it at most.
REPLY_MAX_BYTES = 64 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS publications (
    key TEXT PRIMARY KEY,
    sink TEXT NOT NULL,
    state TEXT NOT NULL,
    status_code INTEGER,
    updated_at TEXT NOT NULL
)
"""


class Ledger:
    """Which idempotency keys were published, shared by every process on a host."""

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
    def state(conn: sqlite3.Connection, key: str) -> tuple[str, int | None] | None:
        row = conn.execute(
            "SELECT state, status_code FROM publications WHERE key = ?", (key,)
        ).fetchone()
        return (str(row[0]), row[1]) if row else None

    @staticmethod
    def mark(
        conn: sqlite3.Connection, key: str, sink: str, state: str, status_code: int | None = None
    ) -> None:
        conn.execute(
            "INSERT INTO publications (key, sink, state, status_code, updated_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
            "state = excluded.state, status_code = excluded.status_code, "
            "updated_at = excluded.updated_at",
            (key, sink, state, status_code, _now()),
        )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def sink_path(settings: Settings, relative: str) -> Path:
    """The file sink ``relative`` under ``<data dir>/sinks``; ``invalid_input`` outside it."""
    root = (settings.data_dir / "sinks").resolve()
    target = (root / relative).resolve()
    if target == root or not target.is_relative_to(root):
        raise InvalidInputError(
            f"sink file {relative!r} is outside the sinks directory", field="input.sink.file"
        )
    return target


def _line_has_key(path: Path, key: str) -> bool:
    if not path.exists():
        return False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if key in line:
                with contextlib.suppress(json.JSONDecodeError):
                    if json.loads(line).get("idempotency_key") == key:
                        return True
    return False


class WebhookPoster:
    """The ``http_post`` tool: one POST, no library retries (Temporal retries).

    Egress follows the shared policy (``activities.tools.egress``): the URL is
    checked first, every connection address after DNS resolution; redirects
    are not followed. ``meter`` counts the bytes of the replies read.
    """

    def __init__(
        self,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        meter: BodyMeter | None = None,
    ):
        self._policy = EgressPolicy.from_settings(settings)
        self.meter = meter
        self._client = httpx.AsyncClient(
            transport=transport or guarded_transport(self._policy),
            follow_redirects=False,
        )

    async def post(
        self, url: str, body: Any, headers: dict[str, str], timeout_s: float
    ) -> httpx.Response:
        """POST ``body`` as JSON; the response's status and headers (its body is not kept).

        The reply body is drained raw up to :data:`REPLY_MAX_BYTES`, only so that
        the connection can be reused; a longer one is cut off with its connection.
        """
        self._policy.check_url(url)
        try:
            async with (
                asyncio.timeout(timeout_s),
                self._client.stream(
                    "POST", url, json=body, headers=headers, timeout=timeout_s
                ) as resp,
            ):
                await read_body(
                    resp, REPLY_MAX_BYTES, truncate=True, decode=False, meter=self.meter
                )
                return resp
        except (TimeoutError, httpx.TimeoutException) as e:
            raise FetchTimeoutError(f"webhook {url} timed out: {e!r}", url=url) from None
        except httpx.LocalProtocolError as e:
            # Refused here before anything was sent: a header the caller gave is not HTTP.
            raise InvalidInputError(
                f"the request to webhook {url} is not valid HTTP: {e}", field="input.sink"
            ) from None
        except httpx.HTTPError as e:
            raise FetchFailedError(f"webhook {url} failed: {e!r}", url=url) from None

    async def aclose(self) -> None:
        await self._client.aclose()


class Publish(Worker):
    """Appends a record to a file sink or POSTs it to a webhook, once per key."""

    spec = builtin_spec("publish")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        key = ctx.request.idempotency_key
        ledger = Ledger(ctx.settings.data_dir / "publish")
        sink = input["sink"]
        if "file" in sink:
            path = sink_path(ctx.settings, sink["file"])
            line = json.dumps(
                {
                    "idempotency_key": key,
                    "tenant": ctx.request.tenant,
                    "published_at": _now(),
                    "record": input["record"],
                },
                ensure_ascii=False,
                separators=(",", ":"),
            )
            wrote = await asyncio.to_thread(self._append_once, ledger, key, path, line)
            return WorkerResult(
                outputs={
                    "published": wrote,
                    "duplicate": not wrote,
                    "idempotency_key": key,
                    "sink": f"file:{sink['file']}",
                },
                log_fields={"sink": "file", "duplicate": not wrote},
            )
        return await self._webhook(ctx, ledger, key, sink["webhook"], input["record"])

    @staticmethod
    def _append_once(ledger: Ledger, key: str, path: Path, line: str) -> bool:
        with ledger.locked() as conn:
            state = Ledger.state(conn, key)
            if state is not None and state[0] == "done":
                return False
            if state is not None and _line_has_key(path, key):
                # The last attempt appended and died before it could say so.
                Ledger.mark(conn, key, f"file:{path}", "done")
                return False
            Ledger.mark(conn, key, f"file:{path}", "pending")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            Ledger.mark(conn, key, f"file:{path}", "done")
            return True

    async def _webhook(
        self, ctx: WorkerContext, ledger: Ledger, key: str, url: str, record: Any
    ) -> WorkerResult:
        def claim() -> tuple[str, int | None] | None:
            with ledger.locked() as conn:
                state = Ledger.state(conn, key)
                if state is None or state[0] != "done":
                    Ledger.mark(conn, key, url, "pending")
                return state

        state = await asyncio.to_thread(claim)
        if state is not None and state[0] == "done":
            return WorkerResult(
                outputs={
                    "published": False,
                    "duplicate": True,
                    "idempotency_key": key,
                    "sink": url,
                    **({"status_code": state[1]} if state[1] is not None else {}),
                },
                log_fields={"sink": "webhook", "duplicate": True},
            )
        poster: WebhookPoster = ctx.tools.use("http_post")
        resp = await poster.post(
            url,
            {"idempotency_key": key, "tenant": ctx.request.tenant, "record": record},
            {"Idempotency-Key": key},
            timeout_s=max(0.1, ctx.remaining()),
        )
        _raise_for_status(resp, url)

        def done() -> None:
            with ledger.locked() as conn:
                Ledger.mark(conn, key, url, "done", resp.status_code)

        await asyncio.to_thread(done)
        return WorkerResult(
            outputs={
                "published": True,
                "duplicate": False,
                "idempotency_key": key,
                "sink": url,
                "status_code": resp.status_code,
            },
            log_fields={"sink": "webhook", "status_code": resp.status_code},
        )


def _raise_for_status(resp: httpx.Response, url: str) -> None:
    code = resp.status_code
    if code < 300:
        return
    if code == 429:
        raise RateLimitedError(
            f"webhook {url} said 429",
            url=url,
            status_code=code,
            retry_after=parse_retry_after(resp.headers.get("retry-after")),
        )
    if code in (401, 403):
        raise AccessDeniedError(f"webhook {url} said {code}", url=url, status_code=code)
    if code in (404, 410):
        raise NotFoundError(f"webhook {url} said {code}", url=url, status_code=code)
    if code >= 500 or code == 408:
        raise FetchFailedError(f"webhook {url} said {code}", url=url, status_code=code)
    raise InvalidInputError(
        f"webhook {url} rejected the record with {code}", field="input.record", status_code=code
    )
