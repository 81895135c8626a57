"""The ``publish`` worker: the pipeline's side effect, exactly once per key.

Sinks: ``{"file": <path under <data dir>/sinks/<tenant>>}`` appends one JSON
line ``{"idempotency_key", "tenant", "published_at", "record"}``;
``{"webhook": <url>}`` POSTs the record with an ``Idempotency-Key`` header.
A file sink names a file: a name that holds NUL, is longer than
:data:`MAX_SINK_BYTES` (or one component longer than
:data:`MAX_SINK_COMPONENT_BYTES`), leaves the tenant's directory, or is a
directory is ``invalid_input``.

Exactly once rests on a ledger (SQLite under ``<data dir>/publish``) keyed by
the request's tenant and idempotency key, guarded by an exclusive file lock so
that processes on one host agree. A key is claimed (``pending``) before the
write and marked ``done`` after it. A retry, replay or redrive that finds
``done`` returns ``duplicate: true`` without writing, with a ``duplicate``
warning that says so: starting a pipeline again under the same workflow id
(``aiworker run --id X`` after X ended) is such a call too, and publishes
nothing. A crash between the
write and ``done`` leaves ``pending``: for a file sink the sink itself is then
searched for the key, so the line is never appended twice; for a webhook the
POST is repeated with the same ``Idempotency-Key``, which is the receiver's
cue to drop it (the contract every idempotent HTTP API documents).

The ledger stores each key's sink: one key is one side effect, so a publish
that names another sink for a key already claimed (``pending`` or ``done``)
is ``invalid_input`` naming both sinks, never a second write. A redrive that
must publish somewhere else needs a new key (a renamed step).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

import aiohttp

from aiworker.activities.bodies import BodyMeter, read_body
from aiworker.activities.errors import (
    AccessDeniedError,
    FetchFailedError,
    InvalidInputError,
    NotFoundError,
    RateLimitedError,
)
from aiworker.activities.publish_ledger import Entry, Ledger, now_iso
from aiworker.activities.retry_after import parse_retry_after
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.http_client import (
    client_session,
    map_http_errors,
    request_timeout,
)
from aiworker.config.catalog import builtin_spec
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import WarningInfo

# A webhook's reply is never used: read this much of it at most.
REPLY_MAX_BYTES = 64 * 1024

# Bounds of a file sink's name, in UTF-8 bytes: the common file system limits
# (NAME_MAX, and a total well under PATH_MAX once the data directory is added).
MAX_SINK_BYTES = 1024
MAX_SINK_COMPONENT_BYTES = 255
_SINK_FIELD = "input.sink.file"


def sinks_root(settings: Settings, tenant: str) -> Path:
    """The directory of ``tenant``'s file sinks: ``<data dir>/sinks/<tenant>``."""
    return (settings.data_dir / "sinks" / tenant).resolve()


def sink_path(settings: Settings, tenant: str, relative: str) -> Path:
    """The file sink ``relative`` under ``<data dir>/sinks/<tenant>``.

    Raises:
        InvalidInputError: the name holds NUL, is too long, leaves the
            tenant's sinks directory, or is a directory.
    """
    if "\x00" in relative:
        raise InvalidInputError("sink file name holds a NUL byte", field=_SINK_FIELD)
    try:
        size = len(relative.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInputError("sink file name is not valid Unicode", field=_SINK_FIELD) from None
    if size > MAX_SINK_BYTES:
        raise InvalidInputError(
            f"sink file name is {size} bytes; at most {MAX_SINK_BYTES}", field=_SINK_FIELD
        )
    longest = max(len(p.encode("utf-8")) for p in relative.split("/"))
    if longest > MAX_SINK_COMPONENT_BYTES:
        raise InvalidInputError(
            f"sink file name has a {longest}-byte component; at most "
            f"{MAX_SINK_COMPONENT_BYTES} bytes each",
            field=_SINK_FIELD,
        )
    root = sinks_root(settings, tenant)
    target = (root / relative).resolve()
    if target == root or not target.is_relative_to(root):
        raise InvalidInputError(
            f"sink file {relative!r} is outside the tenant's sinks directory", field=_SINK_FIELD
        )
    if relative.endswith("/") or target.is_dir():
        raise InvalidInputError(f"sink file {relative!r} is a directory", field=_SINK_FIELD)
    return target


# What opening a checked sink can still meet that is the name's fault, not the host's
# (EEXIST: mkdir of a folder that is a file).
_NAME_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.EEXIST})


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

    Sent with the fetch tool's HTTP client (``activities.tools.http_client``,
    aiohttp): the URL is checked against the egress policy first, every address
    before it is dialled; redirects are not followed; no cookie is kept. The
    reply's heads, interim ``1xx`` responses included, are held to
    :data:`REPLY_MAX_BYTES` as its body is. ``meter`` counts the bytes of the
    replies read.
    """

    def __init__(self, settings: Settings, meter: BodyMeter | None = None):
        self._policy = EgressPolicy.from_settings(settings)
        self.meter = meter
        # Made on first use, inside the event loop that uses it (aiohttp binds to it).
        self._session: aiohttp.ClientSession | None = None

    async def post(
        self, url: str, body: Any, headers: dict[str, str], timeout_s: float
    ) -> aiohttp.ClientResponse:
        """POST ``body`` as JSON; the response, for its status and headers (its body is
        not kept).

        The reply body is drained raw up to :data:`REPLY_MAX_BYTES`, only so that
        the connection can be reused; a longer one is cut off with its connection.
        """
        self._policy.check_url(url)
        # httpx's JSON encoding, which webhooks received before
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        if self._session is None:
            self._session = client_session(self._policy, max_head_bytes=REPLY_MAX_BYTES)
        with map_http_errors(url, "webhook"):
            async with (
                asyncio.timeout(timeout_s),
                self._session.post(
                    url,
                    data=data.encode(),
                    headers={"Content-Type": "application/json", **headers},
                    allow_redirects=False,
                    timeout=request_timeout(timeout_s, timeout_s, timeout_s),
                ) as resp,
            ):
                await read_body(
                    resp, REPLY_MAX_BYTES, truncate=True, decode=False, meter=self.meter
                )
                return resp
        raise AssertionError("unreachable: the block returns or raises")

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class Publish(Worker):
    """Appends a record to a file sink or POSTs it to a webhook, once per key."""

    spec = builtin_spec("publish")

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        key = ctx.request.idempotency_key
        ledger = Ledger(ctx.settings.data_dir / "publish")
        sink = input["sink"]
        if "file" in sink:
            path = sink_path(ctx.settings, ctx.tenant, sink["file"])
            line = json.dumps(
                {
                    "idempotency_key": key,
                    "tenant": ctx.request.tenant,
                    "published_at": now_iso(),
                    "record": input["record"],
                },
                ensure_ascii=False,
                separators=(",", ":"),
            )
            # the ledger's name of the sink: one spelling per file
            name = f"file:{path.relative_to(sinks_root(ctx.settings, ctx.tenant))}"
            wrote = await asyncio.to_thread(
                self._append_once, ledger, ctx.tenant, key, name, path, line
            )
            return WorkerResult(
                outputs={
                    "published": wrote,
                    "duplicate": not wrote,
                    "idempotency_key": key,
                    "sink": f"file:{sink['file']}",
                },
                warnings=[] if wrote else [duplicate_warning(key, f"file:{sink['file']}")],
                log_fields={"sink": "file", "duplicate": not wrote},
            )
        return await self._webhook(ctx, ledger, key, sink["webhook"], input["record"])

    @staticmethod
    def _append_once(
        ledger: Ledger, tenant: str, key: str, sink: str, path: Path, line: str
    ) -> bool:
        with ledger.locked() as conn:
            state = Ledger.state(conn, tenant, key, sink)
            if state is not None and state.state == "done":
                return False
            if state is not None and _line_has_key(path, key):
                # The last attempt appended and died before it could say so.
                Ledger.mark(conn, tenant, key, sink, "done")
                return False
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                f = open(path, "a", encoding="utf-8")  # closed by the with below
            except OSError as e:
                if e.errno not in _NAME_ERRNOS:
                    raise
                raise InvalidInputError(
                    f"sink {sink} cannot be a file: {e.strerror}", field=_SINK_FIELD
                ) from None
            with f:
                Ledger.mark(conn, tenant, key, sink, "pending")
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            Ledger.mark(conn, tenant, key, sink, "done")
            return True

    async def _webhook(
        self, ctx: WorkerContext, ledger: Ledger, key: str, url: str, record: Any
    ) -> WorkerResult:
        tenant = ctx.tenant

        def claim() -> Entry | None:
            with ledger.locked() as conn:
                state = Ledger.state(conn, tenant, key, url)
                if state is None or state.state != "done":
                    Ledger.mark(conn, tenant, key, url, "pending")
                return state

        state = await asyncio.to_thread(claim)
        if state is not None and state.state == "done":
            return WorkerResult(
                outputs={
                    "published": False,
                    "duplicate": True,
                    "idempotency_key": key,
                    "sink": url,
                    **({"status_code": state.status_code} if state.status_code is not None else {}),
                },
                warnings=[duplicate_warning(key, url)],
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
                Ledger.mark(conn, tenant, key, url, "done", resp.status)

        await asyncio.to_thread(done)
        return WorkerResult(
            outputs={
                "published": True,
                "duplicate": False,
                "idempotency_key": key,
                "sink": url,
                "status_code": resp.status,
            },
            log_fields={"sink": "webhook", "status_code": resp.status},
        )


def duplicate_warning(key: str, sink: str) -> WarningInfo:
    """The ``duplicate`` warning of a publish that found its key already done."""
    return WarningInfo(
        code="duplicate",
        message=(
            f"idempotency key {key!r} was already published to {sink}; nothing was "
            "written this time (a retry, a redrive or a run started again with the same "
            "workflow id publishes once; a new workflow id publishes again)"
        ),
        field="idempotency_key",
    )


def _raise_for_status(resp: aiohttp.ClientResponse, url: str) -> None:
    code = resp.status
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
