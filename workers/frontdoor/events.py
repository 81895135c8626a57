"""The live event stream of the front door: ``GET /v1/pipelines/{id}/events`` as
server-sent events, and ``GET /v1/pipelines/{id}/live``, a page that shows it.

The events, their ids and their resumption are
:mod:`aiworker.workers.client.events`' (read from Temporal, the same from any
``serve`` process); this module frames them (``id:``, ``event:``, ``data:``
lines), resumes from ``Last-Event-ID`` (the header a browser's ``EventSource``
sends when it reconnects, or ``?last_event_id=``), sends a comment line
(``: keep-alive``) when nothing was sent for ``keepalive_seconds``, and ends
the response after ``run_ended``. A reconnect after ``run_ended`` (id ``end``)
is answered ``204``, which tells an ``EventSource`` to stop.

The same tenant check as every ``/v1/pipelines`` route (another tenant's run,
or an unknown one, is 404). A browser's ``EventSource`` cannot send an
``Authorization`` header, so this route (only this one) also takes the key
as ``?access_token=`` (RFC 6750 §2.3; a URL can end up in logs and history:
prefer the header where the client can set it).

**A client that does not read.** Each stream has its own bounded queue
(:attr:`StreamLimits.buffer_events` frames, each bounded: step events are
small, a partial text is at most 2,000 characters) between the reader of
Temporal and the socket. When the client stops reading, the socket's buffers
fill, uvicorn pauses the writer, the queue fills: the reader of Temporal
stops at once (no more queries for that stream), and when a write has not
completed in :attr:`StreamLimits.send_timeout_seconds` the stream is dropped
and its connection closed. The run never waits for a stream: streams only
read. So a stream costs at most its queue plus the transport's write buffer
(uvicorn pauses above 64 KiB), and ``AIWORKER_SERVE_MAX_CONNECTIONS`` caps how
many are open. A client that reconnects with the last id it got misses nothing.

**A key that holds every connection.** A stream lives as long as its run, and a
run may wait a year, so streams are capped per API key
(:attr:`StreamLimits.max_per_key`) and per tenant (:attr:`StreamLimits.max_per_tenant`)
in this process (:class:`StreamSlots`): one more is ``429 rate_limited`` with
``Retry-After`` (when the oldest of those streams reaches its end of life), and
another tenant's requests find connections left. Each stream ends after
:attr:`StreamLimits.max_seconds`: the door finishes the response cleanly (no
``run_ended``), and the client reconnects with ``Last-Event-ID``, as an
``EventSource`` does by itself. A frame is sent whole or not at all, and a frame
the reader took from Temporal but never sent is read again on the resume (ids
are positions in the run's own numbering, not in the stream), so nothing is lost.

Our own framing rather than a library's (sse-starlette): its response has no
per-stream bound nor write deadline, which are the point here, and the format
is four lines.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Message, Receive, Scope, Send

from aiworker.schemas.errors import ErrorCode
from aiworker.workers.client.events import END_ID, POLL_SECONDS, Cursor, Event, follow
from aiworker.workers.frontdoor.auth import ApiKey
from aiworker.workers.frontdoor.http import ApiError, WorkflowId

if TYPE_CHECKING:
    from aiworker.config.settings import Settings
    from aiworker.workers.frontdoor.service import Service

log = logging.getLogger("aiworker.serve")

KEEPALIVE = b": keep-alive\n\n"
# What Cursor.parse takes, as the document states it (the server also strips spaces).
EVENT_ID_PATTERN = r"^(end|[0-9]{1,18}\.[0-9]{1,20})?$"
_bearer = HTTPBearer(auto_error=False, description="an API key (aiworker keys add)")


@dataclass(frozen=True)
class StreamLimits:
    """How each event stream behaves; the defaults are what ``aiworker serve`` uses."""

    keepalive_seconds: float = 15.0
    """A ``: keep-alive`` comment after this long without a frame (proxies close idle
    connections)."""
    buffer_events: int = 64
    """Frames waiting for the socket, per stream; past this the stream stops reading."""
    send_timeout_seconds: float = 30.0
    """A write the client has not taken in this long drops the stream."""
    poll_seconds: float = POLL_SECONDS
    """How often a running step's heartbeat (its partial text) is read."""
    max_per_key: int = 16
    """Streams one API key holds open at once (``AIWORKER_SERVE_MAX_STREAMS_PER_KEY``)."""
    max_per_tenant: int = 64
    """Streams one tenant's keys hold open at once (``AIWORKER_SERVE_MAX_STREAMS_PER_TENANT``)."""
    max_seconds: float = 600.0
    """A stream's life; then it ends and the client resumes
    (``AIWORKER_SERVE_STREAM_MAX_SECONDS``)."""

    @classmethod
    def of(cls, settings: Settings) -> StreamLimits:
        """The limits ``aiworker serve`` runs with: the defaults and the settings' caps."""
        return cls(
            max_per_key=settings.serve_max_streams_per_key,
            max_per_tenant=settings.serve_max_streams_per_tenant,
            max_seconds=settings.serve_stream_max_seconds,
        )


@dataclass
class StreamStats:
    """What the front door's streams did (for the log, the tests and the bench)."""

    open: int = 0
    opened: int = 0
    ended: int = 0
    expired: int = 0
    dropped: int = 0
    gone: int = 0
    drops: list[str] = field(default_factory=list)


class StreamSlots:
    """The open streams of each API key and tenant in this process (the caps of
    :class:`StreamLimits`): :meth:`take` one before a stream starts, release it
    when the stream ends, whichever way."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        # start times (monotonic) of the open streams, per key and per tenant
        self._keys: dict[str, list[float]] = {}
        self._tenants: dict[str, list[float]] = {}

    def take(self, key: ApiKey) -> Callable[[], None]:
        """A slot for one stream of ``key``; call the result once when it ends.

        Raises:
            ApiError: 429 ``rate_limited``: the key or its tenant holds its cap.
        """
        limits, now = self.limits, time.monotonic()
        for opened, cap, who in (
            (self._keys.get(key.name, []), limits.max_per_key, "this API key"),
            (self._tenants.get(key.tenant, []), limits.max_per_tenant, "this tenant"),
        ):
            if len(opened) >= cap:
                # a slot frees at the latest when the oldest stream reaches its end of life
                raise ApiError.rate_limited(
                    f"{who} holds {cap} open event streams (the cap); close one or wait",
                    min(opened) + limits.max_seconds - now,
                )
        self._keys.setdefault(key.name, []).append(now)
        self._tenants.setdefault(key.tenant, []).append(now)
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            for table, name in ((self._keys, key.name), (self._tenants, key.tenant)):
                opened = table[name]
                opened.remove(now)
                if not opened:
                    del table[name]

        return release

    def open(self, key: ApiKey) -> int:
        """How many streams ``key`` holds open now."""
        return len(self._keys.get(key.name, ()))


def frame(event: Event) -> bytes:
    """One server-sent event: ``id``, ``event`` and one ``data`` line of JSON."""
    data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n".encode()


class EventStream(Response):
    """A ``text/event-stream`` response over ``events``, bounded per stream (see the
    module docstring): a queue of ``limits.buffer_events`` frames, a write deadline,
    keep-alives, and the end when ``events`` ends or the client leaves."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncIterator[Event],
        limits: StreamLimits,
        stats: StreamStats,
        name: str,
        release: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(status_code=200)
        # no content-length (Response's init would say 0): the body streams, chunked
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        self.events, self.limits, self.stats, self.name = events, limits, stats, name
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stats = self.stats
        stats.open += 1
        stats.opened += 1
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(self.limits.buffer_events)
        full = asyncio.Event()

        async def produce() -> None:
            try:
                async for event in self.events:
                    try:
                        queue.put_nowait(frame(event))
                    except asyncio.QueueFull:
                        full.set()  # the client does not read: stop reading Temporal for it
                        return
            except Exception as e:  # Temporal did not answer: end; the client resumes
                log.warning("event stream of %s ended early: %r", self.name, e)
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
                return
            full.set()

        async def left() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    return

        producer = asyncio.create_task(produce())
        leaving = asyncio.create_task(left())
        writer = asyncio.create_task(self._write(send, queue, full))
        try:
            done, _ = await asyncio.wait((writer, leaving), return_when=asyncio.FIRST_COMPLETED)
            if writer in done:
                outcome = writer.result()
            else:
                outcome = "gone"
        finally:
            stats.open -= 1
            if self.release is not None:
                self.release()
            for task in (producer, leaving, writer):
                task.cancel()
            for task in (producer, leaving, writer):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # a producer that stopped at a full buffer left the reader open: close it
            # now (its history long-poll with it), not when it is garbage-collected
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        if outcome == "ended":
            stats.ended += 1
        elif outcome == "expired":
            stats.expired += 1
        elif outcome == "gone":
            stats.gone += 1
        else:
            stats.dropped += 1
            stats.drops = [*stats.drops[-99:], self.name]
            log.warning("dropped the event stream of %s: %s", self.name, outcome)

    async def _write(
        self, send: Send, queue: asyncio.Queue[bytes | None], full: asyncio.Event
    ) -> str:
        """Send frames until the end: ``ended``, or why the stream was dropped."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        end_of_life = loop.time() + limits.max_seconds
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        for _ in range(10**9):  # bounded by max_seconds and the deadlines below
            left = end_of_life - loop.time()
            if left <= 0:
                # a clean end: the client resumes after the last id it got
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return "expired"
            try:
                chunk = await asyncio.wait_for(queue.get(), min(limits.keepalive_seconds, left))
            except TimeoutError:
                if full.is_set():
                    return "its buffer filled"
                if end_of_life - loop.time() <= 0:
                    continue
                chunk = KEEPALIVE
            if chunk is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return "ended"
            try:
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": chunk, "more_body": True}),
                    limits.send_timeout_seconds,
                )
            except TimeoutError:
                # uvicorn closes the connection of a response left unfinished
                return f"the client took no data for {limits.send_timeout_seconds:g}s"
            if full.is_set() and queue.empty():
                return "its buffer filled"
        return "too long"  # not reached: max_seconds ends it first


def _cursor(request: Request, given: str | None) -> str | None:
    header = request.headers.get("last-event-id")
    last = header if header is not None else given
    try:
        Cursor.parse(last)
    except ValueError as e:
        raise ApiError(400, ErrorCode.INVALID_INPUT, f"Last-Event-ID: {e}") from None
    return last


async def _stream_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    access_token: Annotated[
        str | None,
        Query(description="the API key, for clients that cannot send headers (EventSource)"),
    ] = None,
) -> ApiKey:
    """The caller's key, from the header or ``?access_token=`` (401 without one), after
    its rate (429), as every other route's."""
    service: Service = request.app.state.service
    token = credentials.credentials if credentials else access_token
    return service.caller(token, "Authorization: Bearer <key>, or ?access_token=")


StreamCaller = Annotated[ApiKey, Depends(_stream_caller)]


def install_event_routes(app: FastAPI, service: Service, limits: StreamLimits) -> StreamStats:
    """Add the event stream and the live page to ``app``; the streams' stats."""
    stats = StreamStats()
    slots = StreamSlots(limits)
    app.state.event_streams = stats
    app.state.stream_slots = slots

    @app.get(
        "/v1/pipelines/{workflow_id}/events",
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "the events"},
            204: {"description": "resumed after run_ended: nothing more"},
            400: {"description": "invalid_input"},
            401: {"description": "access_denied"},
            404: {"description": "not_found"},
            429: {
                "description": "rate_limited: the key's rate, or the key or its tenant holds "
                "its cap of open streams (Retry-After)"
            },
        },
        response_class=Response,
        summary="The run's live events (server-sent events; Last-Event-ID resumes)",
    )
    async def events(
        workflow_id: WorkflowId,
        request: Request,
        key: StreamCaller,
        last_event_id: Annotated[
            str | None,
            Query(
                description="resume after this id (as the Last-Event-ID header): an event's "
                "id, `end`, or empty (from the start)",
                pattern=EVENT_ID_PATTERN,
            ),
        ] = None,
    ) -> Response:
        last = _cursor(request, last_event_id)
        desc = await service.owned(workflow_id, key)
        if last is not None and last.strip() == END_ID:
            return Response(status_code=204)
        release = slots.take(key)
        source = follow(
            service.door.pipelines.temporal,
            workflow_id,
            desc.run_id,
            last_event_id=last,
            poll_seconds=limits.poll_seconds,
        )
        return EventStream(source, limits, stats, workflow_id, release)

    @app.get(
        "/v1/pipelines/{workflow_id}/live",
        response_class=HTMLResponse,
        summary="A page that shows the run live (the key goes in the URL's #fragment)",
    )
    async def live(workflow_id: WorkflowId) -> HTMLResponse:
        # Static: the page holds no data; its script reads the key from the
        # fragment (never sent to the server) and opens the event stream.
        html = live_page()
        return HTMLResponse(html, headers=page_headers(html))

    return stats


def live_page() -> str:
    """The live page's HTML (``workers/frontdoor/live.html``)."""
    return (files("aiworker.workers.frontdoor") / "live.html").read_text(encoding="utf-8")


def page_headers(html: str) -> dict[str, str]:
    """The page's headers: it runs only its own inline script (named by its hash,
    so an injected one would not run) and connects only to this origin."""
    script = re.search(r"<script>(.*?)</script>", html, re.S)
    digest = base64.b64encode(hashlib.sha256(script[1].encode() if script else b"").digest())
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src 'sha256-{digest.decode()}'; "
            "style-src 'unsafe-inline'; connect-src 'self'"
        ),
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
    }


__all__ = [
    "EventStream",
    "StreamLimits",
    "StreamSlots",
    "StreamStats",
    "frame",
    "install_event_routes",
    "live_page",
    "page_headers",
]
