"""The request gate of the ``render`` tool: every request a page makes, answered or refused.

Each request Chromium's page makes reaches :func:`dispatch` (``context.route``)
and is answered by :meth:`FetchTool.fetch_resource`, which runs the checks of a
plain fetch (egress after DNS, robots.txt, breaker, politeness, redirects,
body cap), or refused (``blockedbyclient``) and counted by reason:
``egress_denied``, ``robots``, ``scheme`` (not HTTP(S)), ``method`` (not GET:
a scrape reads, it does not post forms or beacons), ``quota`` (past the
page's request quota) and ``total_bytes``. The page's document itself was
fetched before the browser started and is served from that fetch.

At most ``max_in_flight`` of a page's requests are out at once
(:attr:`PageCall.in_flight`); the others wait for one to end. Without it a page
with 150 images on distinct hosts sent 150 fetches at once and held the
process's whole fetch pool while a server that never answers kept them.

What a page asked for is kept bounded (:class:`PageCall`): the first
``max_requests`` requests are recorded, each URL cut to :data:`MAX_KEPT_URL`
characters; later ones are only counted. A page that asks for a million
megabyte-long URLs costs counters, not memory.

Playwright's driver dispatches route events from the task that started it,
so each answer runs in a copy of the calling activity's context: the tenant's
egress list (``tenant_egress``) applies to the call that asked.

:class:`Sinkhole` is the browser's proxy: it answers nothing, so whatever
escapes interception fails there and is recorded instead of reaching a host.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiworker.activities.errors import AccessDeniedError, EgressDeniedError, WorkerError
from aiworker.activities.tools.fetch import FetchResult, FetchTool

# Characters of a request URL kept in a render's record (the request itself is whole).
MAX_KEPT_URL = 2048

# Response headers that describe the wire, not the (already decoded) body.
_HOP_HEADERS = frozenset(
    {
        "content-encoding",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "set-cookie",
    }
)


class Sinkhole:
    """A proxy that answers nothing: what reaches it escaped interception."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.url: str | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._take, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def _take(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            line = await asyncio.wait_for(reader.readline(), 2)
            if len(self.seen) < 100:
                self.seen.append(line[:200].decode("latin-1").strip())
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
            self.url = None


@dataclass
class PageCall:
    """One render's state, shared by its route handlers.

    ``requests`` keeps the first ``max_requests`` requests (URLs cut to
    :data:`MAX_KEPT_URL`); ``seen`` and ``fetched`` count them all.
    """

    fetcher: FetchTool
    max_requests: int
    max_total_bytes: int
    in_flight: asyncio.Semaphore

    document: FetchResult
    deadline: float
    user_agent: str | None
    respect_robots: bool
    allow_domains: tuple[str, ...]
    context: contextvars.Context
    served_document: bool = False
    total_bytes: int = 0
    seen: int = 0
    fetched: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)
    blocked: Counter[str] = field(default_factory=Counter)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


def dispatch(route: Any, call: PageCall) -> asyncio.Task[None]:
    """Answer ``route`` in a task of its own, in (a copy of) the calling activity's
    context: its tenant egress list."""
    task = asyncio.create_task(serve(route, call), context=call.context.copy())
    call.tasks.add(task)
    task.add_done_callback(call.tasks.discard)
    return task


async def serve(route: Any, call: PageCall) -> None:
    """Answer one request of the page through the fetcher, or block it."""
    from playwright.async_api import Error as PlaywrightError

    req = route.request
    url: str = req.url
    call.seen += 1
    entry = {"method": req.method[:16], "url": url[:MAX_KEPT_URL], "outcome": ""}
    if call.seen <= call.max_requests:
        call.requests.append(entry)
    try:
        if (
            not call.served_document
            and req.is_navigation_request()
            and req.frame.parent_frame is None
        ):
            call.served_document = True
            call.fetched += 1
            entry["outcome"] = "document"
            await route.fulfill(
                status=call.document.status_code,
                headers={"content-type": call.document.content_type or "text/html"},
                body=call.document.body,
            )
            return
        reason = _refusal(req.method, url, call)
        if reason is not None:
            await _block(route, call, entry, reason)
            return
        try:
            # No deadline of its own: a wait that outlasts the render ends with it
            # (the render cancels its requests' tasks).
            async with call.in_flight:
                res = await call.fetcher.fetch_resource(
                    url,
                    timeout=max(0.001, call.deadline - time.monotonic()),
                    user_agent=call.user_agent,
                    respect_robots=call.respect_robots,
                    allow_domains=call.allow_domains,
                )
        except EgressDeniedError:
            await _block(route, call, entry, "egress_denied")
            return
        except AccessDeniedError as e:
            if getattr(e, "reason", None) == "robots":
                await _block(route, call, entry, "robots")
                return
            await _fulfil_status(route, entry, e)
            return
        except WorkerError as e:
            if isinstance(getattr(e, "status_code", None), int):
                await _fulfil_status(route, entry, e)
                return
            entry["outcome"] = f"failed:{e.code.value}"
            await route.abort("failed")
            return
        call.total_bytes += len(res.body)
        if call.total_bytes > call.max_total_bytes:
            await _block(route, call, entry, "total_bytes")
            return
        call.fetched += 1
        entry["outcome"] = "fetched"
        headers = {k: v for k, v in res.headers if k.lower() not in _HOP_HEADERS}
        await route.fulfill(status=res.status_code, headers=headers, body=res.body)
    except PlaywrightError:
        pass  # the page or its context closed while this request was out


def _refusal(method: str, url: str, call: PageCall) -> str | None:
    if urlsplit(url).scheme not in ("http", "https"):
        return "scheme"
    if method != "GET":
        return "method"
    if call.seen > call.max_requests:
        return "quota"
    return None


async def _block(route: Any, call: PageCall, entry: dict[str, str], reason: str) -> None:
    entry["outcome"] = f"blocked:{reason}"
    call.blocked[reason] += 1
    await route.abort("blockedbyclient")


async def _fulfil_status(route: Any, entry: dict[str, str], e: WorkerError) -> None:
    """Hand the page an error status the way the host sent it (a 404 image, say)."""
    status = int(getattr(e, "status_code", 0) or 502)
    entry["outcome"] = f"status:{status}"
    await route.fulfill(status=status, body=b"")


async def refuse_websocket(ws: Any) -> None:
    # Never connected to the server: no ws.connect_to_server() call.
    await ws.close(code=1008, reason="websockets are blocked by the scraper")
