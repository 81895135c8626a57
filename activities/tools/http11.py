"""The HTTP/1.1 transport of the fetch tool and the webhook poster: httpx's requests
and responses, h11's protocol, asyncio's own sockets, and every connection vetted
by the egress policy.

Why not httpx's default transport (httpcore): httpcore sends each request's pool
lock, cancellation shield, event and socket read through anyio, which asks
sniffio for the running loop and enters a cancel scope each time. In a crawl
worker that machinery was about a fifth of a page's CPU (py-spy on
``bench/crawl.py``: httpcore and anyio 21% of the worker, their loop lookups
alone 10%). This transport keeps what matters of httpcore and drops the rest:

- **the protocol is h11**, as in httpcore, with its head limit (100 KiB): h11
  frames bodies (``Content-Length``, chunked, close-delimited), refuses CR/LF in
  header values, and answers a malformed response with a protocol error;
- **connections are asyncio protocols**: bytes land in h11 as they arrive, a
  wait is a future with a timer, reading pauses past 256 KiB unread;
- **the pool keeps httpcore's limits**: at most ``max_connections`` open (the
  rest wait up to the pool timeout), idle ones kept per origin up to
  ``max_keepalive`` and ``keepalive_expiry`` seconds, reused newest first, never
  reused when the server closed it, sent anything while it was idle, or sent
  more than its response; a response not read to its end closes its connection.
  A kept-alive connection the server closed as a request went out (before a
  byte of the answer) is a race no client can avoid: a ``GET``, ``HEAD`` or
  ``OPTIONS`` without a body is then sent once more on a new connection, as
  browsers and urllib3 do; anything else fails as it did;
- **egress**: every host is resolved and every address vetted by
  :meth:`EgressPolicy.resolve` before a connection opens, as the guarded httpcore
  backend did; denials raise ``EgressDeniedError`` unchanged;
- **errors are httpx's**: ``ConnectError``/``ConnectTimeout``, ``ReadTimeout``,
  ``WriteTimeout``, ``PoolTimeout``, ``ReadError``/``WriteError``,
  ``RemoteProtocolError`` (with httpcore's wording for a server that closed
  before it answered), ``LocalProtocolError``, ``UnsupportedProtocol``.

HTTP/1.1 only, no proxies (the clients run with ``trust_env=False``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpcore
import httpx

from aiworker.activities.tools.egress import EgressPolicy, connect_first

# httpcore's limit on a response head (status line and headers) h11 buffers.
MAX_HEAD_BYTES = 100 * 1024
# Unread bytes past which the socket stops being read until the reader catches up.
READ_HIGH_WATER = 256 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_Key = tuple[str, str, int]
# Methods sent again on a new connection when a kept-alive one was closed under them.
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: h11's state, fed by asyncio as bytes arrive."""

    def __init__(self, key: _Key, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.closed = False  # the socket is gone (either side)
        self.eof = False  # the server closed its side
        self.idle = False  # in the pool, between requests
        self.spoiled = False  # sent something while idle: never reused
        self.served = 0  # responses read to their end on this connection
        self.heard = False  # bytes received for the current request
        self.idle_since = 0.0
        self.lost: Exception | None = None  # what broke the connection, if anything did
        self._unread = 0
        self._reading_paused = False
        self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # ---------------------------------------------------------- asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.idle:
            self.spoiled = True  # a response nobody asked for, or a close about to come
        self.heard = True
        self.h11.receive_data(data)
        self._unread += len(data)
        if self._unread > READ_HIGH_WATER and not self._reading_paused and self.transport:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc
        self.closed = True
        self.eof = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---------------------------------------------------------- the request's side

    def usable(self, oldest: float) -> bool:
        """Whether this idle connection may carry another request."""
        return not (self.closed or self.eof or self.spoiled) and self.idle_since >= oldest

    async def send(self, event: Any, timeout: float | None) -> None:  # noqa: ASYNC109 - httpx's per-phase timeout
        """Write one h11 event, waiting (up to ``timeout``) while the socket's buffer is full."""
        try:
            data = self.h11.send(event)
        except h11.LocalProtocolError as e:
            raise httpx.LocalProtocolError(str(e)) from None
        if self.closed or self.transport is None or self.transport.is_closing():
            raise httpx.WriteError("the connection is closed")
        if data:
            self.transport.write(data)
        if self._writing_paused:
            self._drained = self.loop.create_future()
            await self._wait_for(self._drained, timeout, httpx.WriteTimeout)
            if self.closed:
                raise httpx.WriteError("the connection closed while writing")

    async def next_event(self, timeout: float | None) -> Any:  # noqa: ASYNC109 - httpx's per-phase timeout
        """The next h11 event from the server, waiting up to ``timeout`` for bytes."""
        h = self.h11
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as e:
                raise httpx.RemoteProtocolError(str(e)) from None
            if event is not h11.NEED_DATA:
                return event
            self._unread = 0
            if self._reading_paused and self.transport is not None:
                self._reading_paused = False
                self.transport.resume_reading()
            if self.eof:
                if self.lost is not None:
                    raise httpx.ReadError(str(self.lost) or type(self.lost).__name__)
                if h.their_state is h11.SEND_RESPONSE:
                    # h11 would say "can't handle ConnectionClosed"; say what happened
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                h.receive_data(b"")  # the close, once no bytes wait before it
                continue
            self._waiter = self.loop.create_future()
            try:
                await self._wait_for(self._waiter, timeout, httpx.ReadTimeout)
            finally:
                self._waiter = None

    async def _wait_for(
        self,
        future: asyncio.Future[None],
        timeout: float | None,  # noqa: ASYNC109 - httpx's per-phase timeout
        error: type[httpx.TimeoutException],
    ) -> None:
        if timeout is None:
            await future
            return
        timer = self.loop.call_later(timeout, _expire, future, error)
        try:
            await future
        finally:
            timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _replayable(request: httpx.Request) -> bool:
    """A request that may go out twice: a method that changes nothing, without a body."""
    return request.method in _REPLAYABLE and not (
        request.headers.get("content-length") or request.headers.get("transfer-encoding")
    )


def _expire(future: asyncio.Future[None], error: type[httpx.TimeoutException]) -> None:
    if not future.done():
        future.set_exception(error("timed out"))


class _Body(httpx.AsyncByteStream):
    """A response body as h11 frames it; the connection goes back to the pool at
    its end, and is closed if the reader stops before it."""

    def __init__(self, pool: H11Transport, conn: _Connection, timeout: float | None) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        try:
            while True:
                event = await conn.next_event(self._timeout)
                if type(event) is h11.Data:
                    yield bytes(event.data)
                elif type(event) is h11.EndOfMessage:
                    self._conn = None
                    self._pool._release(conn)
                    return
                else:  # ConnectionClosed is only ever after EndOfMessage
                    raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")
        except BaseException:  # an error, or the reader left early: the connection goes
            self._drop()
            raise

    async def aclose(self) -> None:
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._discard(conn)


class H11Transport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only where ``policy`` allows (see the module doc).

    Args:
        policy: vets every address a host resolves to before connecting.
        ssl_context: for ``https`` (httpx's default context, ALPN ``http/1.1``).
        max_connections: open connections at most; more requests wait for one.
        max_keepalive: idle connections kept at most.
        keepalive_expiry: seconds an idle connection is kept.
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 100,
        max_keepalive: int = 20,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self.policy = policy
        if ssl_context is None:
            ssl_context = httpx.create_ssl_context()
            ssl_context.set_alpn_protocols(["http/1.1"])
        self._ssl = ssl_context
        self._max = max_connections
        self._max_idle = max_keepalive
        self._expiry = keepalive_expiry
        self._idle: dict[_Key, list[_Connection]] = {}
        self._n_idle = 0
        self._open = 0  # connections open or opening, idle ones included
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme}://'."
            )
        if not url.raw_host:
            raise httpx.UnsupportedProtocol("Request URL is missing a host.")
        key = (scheme, url.raw_host.decode("ascii"), url.port or _DEFAULT_PORTS[scheme])
        try:  # h11 checks the head (a CR/LF in a header value, say) before any connection
            head = h11.Request(
                method=request.method, target=url.raw_path, headers=request.headers.raw
            )
        except h11.LocalProtocolError as e:
            raise httpx.LocalProtocolError(str(e)) from None
        timeouts = request.extensions.get("timeout", {})
        read, write = timeouts.get("read"), timeouts.get("write")
        for fresh in (False, True):
            conn = await self._acquire(key, timeouts.get("pool"), timeouts.get("connect"), fresh)
            try:
                await conn.send(head, write)
                async for chunk in request.stream:  # type: ignore[union-attr]
                    if chunk:
                        await conn.send(h11.Data(data=chunk), write)
                await conn.send(h11.EndOfMessage(), write)
                while True:
                    event = await conn.next_event(read)
                    if type(event) is h11.Response:
                        break
                    if type(event) is not h11.InformationalResponse:
                        raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                self._discard(conn)
                # A kept-alive connection the server closed as this request went out
                # (its close not seen yet): once more on a new one, as browsers and
                # urllib3 do, for a request without a body that changes nothing.
                if not fresh and conn.served and not conn.heard and _replayable(request):
                    continue
                raise
            except BaseException:
                self._discard(conn)
                raise
            return httpx.Response(
                status_code=event.status_code,
                headers=event.headers.raw_items(),
                stream=_Body(self, conn, read),
                extensions={
                    "http_version": b"HTTP/" + event.http_version,
                    "reason_phrase": event.reason,
                },
            )
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._open -= self._n_idle
        self._idle.clear()
        self._n_idle = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(httpx.PoolTimeout("the transport is closed"))

    # ---------------------------------------------------------------- the pool

    async def _acquire(
        self,
        key: _Key,
        pool_timeout: float | None,
        connect_timeout: float | None,
        fresh: bool = False,
    ) -> _Connection:
        """An idle connection to ``key`` (unless ``fresh``), else a new one once there is room."""
        while True:
            if self._closed:
                raise httpx.PoolTimeout("the transport is closed")
            oldest = time.monotonic() - self._expiry
            idle = None if fresh else self._idle.get(key)
            while idle:
                conn = idle.pop()  # the newest: the likeliest still open
                self._n_idle -= 1
                if conn.usable(oldest):
                    conn.idle = False
                    return conn
                self._discard(conn)
            if self._open < self._max or self._close_oldest_idle():
                break
            await self._wait_for_room(pool_timeout)
        self._open += 1
        try:
            return await self._connect(key, connect_timeout)
        except BaseException:
            self._open -= 1
            self._room()
            raise

    async def _connect(self, key: _Key, timeout: float | None) -> _Connection:  # noqa: ASYNC109 - httpx's connect timeout
        """A new connection to ``key``: resolved, every address vetted, the first that
        answers taken, all within ``timeout``."""
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self._ssl if scheme == "https" else None

        async def connect(addr: str) -> _Connection:
            _, conn = await loop.create_connection(
                lambda: _Connection(key, loop),
                addr,
                port,
                ssl=tls,
                server_hostname=host if tls is not None else None,
            )
            return conn

        try:
            async with asyncio.timeout(timeout):
                addrs = await self.policy.resolve(host, port)
                return await connect_first(addrs, connect, OSError)
        except httpcore.ConnectError as e:  # resolve's own error (shared with MCP's stack)
            raise httpx.ConnectError(str(e)) from None
        except TimeoutError:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as e:
            raise httpx.ConnectError(str(e) or type(e).__name__) from None

    async def _wait_for_room(self, timeout: float | None) -> None:  # noqa: ASYNC109 - httpx's pool timeout
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            raise httpx.PoolTimeout("timed out waiting for a connection") from None
        finally:
            if not waiter.done():
                waiter.cancel()

    def _room(self) -> None:
        """A connection closed or went idle: wake one waiting request (which takes
        the idle one, or closes the oldest idle to open its own)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, conn: _Connection) -> None:
        """A response read to its end: keep its connection idle if it can serve again."""
        h = conn.h11
        if (
            self._closed
            or conn.closed
            or conn.eof
            or h.our_state is not h11.DONE
            or h.their_state is not h11.DONE
            or h.trailing_data[0]
        ):
            self._discard(conn)
            return
        h.start_next_cycle()
        conn.served += 1
        conn.heard = False
        if self._n_idle >= self._max_idle and not self._close_oldest_idle():
            self._discard(conn)
            return
        conn.idle = True
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        self._n_idle += 1
        self._room()

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._room()

    def _close_oldest_idle(self) -> bool:
        oldest: _Connection | None = None
        for conns in self._idle.values():
            if conns and (oldest is None or conns[0].idle_since < oldest.idle_since):
                oldest = conns[0]
        if oldest is None:
            return False
        self._idle[oldest.key].pop(0)
        self._n_idle -= 1
        self._discard(oldest)
        return True
