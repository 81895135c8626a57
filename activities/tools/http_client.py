"""The HTTP client of the fetch tool and the webhook poster: aiohttp, held to the egress
policy, with every response head bounded.

One :func:`client_session` builds what both use, an ``aiohttp.ClientSession``:

- **egress**: a host name is resolved by :class:`EgressResolver` (an
  ``aiohttp.abc.AbstractResolver``), which vets every address it returns with
  :meth:`EgressPolicy.resolve` (one bad answer denies the host); then every
  address, IP literals included (aiohttp never resolves those), is vetted
  again by the connector's ``socket_factory`` just before its socket is
  dialled. The connection goes to the vetted address itself, so a DNS answer
  that changes between check and connect cannot slip through. No DNS cache:
  each new connection resolves and vets afresh, as before. Denials raise
  ``EgressDeniedError`` unchanged;
- **the pool**: at most ``max_connections`` open, ``per_host`` to one
  ``(scheme, host, port)``, idle ones kept 5 s (the fetch tool divides it
  among tenants: :mod:`~aiworker.activities.tools.shares`); a response not read to its end
  closes its connection, and so do bytes past the end of a response (aiohttp
  closes a connection that sent more than its response; one that sends bytes
  while idle is closed by :class:`_BoundedHandler`, where aiohttp would have
  read them as the answer to the next request on it);
- **nothing carried across calls**: no cookie jar (``DummyCookieJar``: the
  tools serve every tenant of a process), no environment (``trust_env=False``:
  no proxy, no netrc), no decompression (``auto_decompress=False``:
  :mod:`~aiworker.activities.bodies` decodes with bounded output), redirects
  never followed here (the fetch tool follows them hop by hop, each hop
  checked; a webhook is not redirected). aiohttp has no retry policy; the one
  resend it makes is RFC 9112's for an idempotent request (our ``GET``)
  whose connection closed before any answer; a ``POST`` is never sent twice;
- **bounded heads, interim responses included**: aiohttp's parser bounds each
  header line (``max_field_size``) and the count of headers, but
  ``ClientResponse.start`` reads ``1xx`` interim responses in a loop with no
  bound, each parsed as a new head: a server sending ``102 Processing`` heads
  forever was read for as long as it sent them. :class:`_BoundedHandler`, the
  connection's protocol (the connector's protocol factory, the one place
  where bytes arrive), counts the bytes of every head of a response, interim
  ones and the final one, and the interim responses; past ``max_head_bytes``
  or :data:`MAX_INTERIM` responses it drops the connection and the request
  fails with :class:`ResponseHeadError` (``fetch_failed``). A byte counter
  there, not a ``response_class`` or a trace hook: the loop lives inside
  ``ClientResponse.start`` (a subclass would copy it) and no trace signal
  fires per interim response; the protocol sees each byte before it is parsed.

Errors are mapped to the stable codes in one table, :data:`ERROR_TABLE`
(httpx's ``map_exceptions`` is the model), by :func:`map_http_errors`.

Measured against the h11 transport it replaced (alternating runs in one
session, docs/benchmarks.md "aiohttp in place of the transport"): a fetch of
the crawl's site costs 0.70 of the CPU it did, and a crawl page's worker CPU
0.89 of Scrapy's own against 0.95 before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler

from aiworker.activities.errors import (
    FetchFailedError,
    FetchTimeoutError,
    InvalidInputError,
    WorkerError,
)
from aiworker.activities.tools.egress import EgressPolicy

# The bytes of all heads of one response (its interim 1xx heads and the final head):
# h11's limit on one head before, now on all of them together.
MAX_HEAD_BYTES = 100 * 1024
# Interim (1xx) responses before the final one: 100 Continue and 103 Early Hints are
# one or two in practice; 102 Processing every few seconds of a long request.
MAX_INTERIM = 32
# Connections kept idle this long (httpx's keep-alive expiry, kept).
KEEPALIVE_SECONDS = 5.0
# Connections to one origin at once: twice the politeness slots of a host, so that for
# a fetch politeness binds first; it bounds a webhook receiver (which has no slots).
PER_HOST = 16


class ResponseHeadError(aiohttp.ClientError):
    """A response whose heads (interim ones included) passed their byte or count bound.

    Attributes:
        limit: the byte bound of the heads.
        received: bytes received before the connection was dropped (those past
            ``limit`` arrived in the last read and were never parsed).
        interim: interim (1xx) responses received.
    """

    def __init__(self, message: str, *, limit: int, received: int, interim: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.received = received
        self.interim = interim


class _BoundedHandler(ResponseHandler):
    """aiohttp's protocol, counting the head bytes and interim responses of each
    response until its final head is parsed (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_head_bytes: int) -> None:
        super().__init__(loop)
        self._max_head = max_head_bytes
        self._head_bytes = 0
        self._interim = 0
        self._final = True  # no request yet: bytes now are not a head we bound

    def set_response_params(self, **kwargs: Any) -> None:
        """A request goes out on this connection: its response's heads are counted anew."""
        self._head_bytes = 0
        self._interim = 0
        self._final = False
        super().set_response_params(**kwargs)

    def feed_data(self, data: Any, size: int = 0) -> None:
        code = data[0].code
        if 100 <= code < 200 and code != 101:
            self._interim += 1
        else:
            self._final = True
        super().feed_data(data, size)

    def data_received(self, data: bytes) -> None:
        if self._final:
            if data and (self._payload is None or self._payload.is_eof()):
                # Bytes nobody asked for: the last response is whole and the next request
                # has not gone out. aiohttp would parse them as a response and hand it to
                # the next request on this connection; it is closed instead.
                if self.transport is not None:
                    self.transport.close()
                return
            super().data_received(data)
            return
        room = self._max_head - self._head_bytes
        self._head_bytes += len(data)
        if len(data) <= room:
            super().data_received(data)
        else:
            # Only the bytes within the bound are parsed: the final head must end there.
            super().data_received(data[:room])
            if self._final:
                super().data_received(data[room:])
                return
        if not self._final and (self._head_bytes > self._max_head or self._interim > MAX_INTERIM):
            self._refuse()

    def _refuse(self) -> None:
        what = (
            f"{self._interim} interim (1xx) responses, more than {MAX_INTERIM}"
            if self._interim > MAX_INTERIM
            else f"response heads over {self._max_head} bytes "
            f"({self._interim} interim responses among them)"
        )
        self._final = True  # nothing more is counted; the connection is going
        self.set_exception(
            ResponseHeadError(
                what, limit=self._max_head, received=self._head_bytes, interim=self._interim
            )
        )
        if self.transport is not None:
            self.transport.abort()


class EgressResolver(AbstractResolver):
    """aiohttp's resolver hook: every address of a host vetted by ``policy``."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[ResolveResult]:
        """Every address of ``host``, each allowed by the policy (or ``EgressDeniedError``)."""
        out: list[ResolveResult] = []
        for addr in await self.policy.resolve(host, port):
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            if family not in (socket.AF_UNSPEC, fam):
                continue
            out.append(
                {
                    "hostname": host,
                    "host": addr,
                    "port": port,
                    "family": fam,
                    "proto": socket.IPPROTO_TCP,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        return out

    async def close(self) -> None:
        """Nothing to release: the policy's resolver holds no resources."""


def _vetted_socket(policy: EgressPolicy, addr_info: Any) -> socket.socket:
    """The socket for one address about to be dialled, once the policy allows it."""
    family, type_, proto, _, sockaddr = addr_info
    policy.check_address(str(sockaddr[0]), int(sockaddr[1]))
    return socket.socket(family=family, type=type_, proto=proto)


class _EgressConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector whose connections count their heads (:class:`_BoundedHandler`)."""

    def __init__(self, *, max_head_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # aiohttp's protocol factory (BaseConnector._factory, a partial of
        # ResponseHandler since aiohttp 1): the one hook on every byte received.
        self._factory = functools.partial(  # type: ignore[assignment]
            _BoundedHandler, loop=self._loop, max_head_bytes=max_head_bytes
        )


def client_session(
    policy: EgressPolicy,
    *,
    max_connections: int = 100,
    per_host: int = PER_HOST,
    max_head_bytes: int = MAX_HEAD_BYTES,
    ssl_context: ssl.SSLContext | None = None,
) -> aiohttp.ClientSession:
    """An aiohttp session whose connections go only where ``policy`` allows (module doc).

    Call it inside the event loop that will use it.

    Args:
        policy: vets every address before it is dialled.
        max_connections: open connections at most; more requests wait for one.
        per_host: open connections to one origin at most.
        max_head_bytes: the bytes of one response's heads, interim ones included.
        ssl_context: for ``https``; the default verifies against the system's CAs.
    """
    connector = _EgressConnector(
        max_head_bytes=max_head_bytes,
        resolver=EgressResolver(policy),
        use_dns_cache=False,
        limit=max_connections,
        limit_per_host=per_host,
        keepalive_timeout=KEEPALIVE_SECONDS,
        # one address after another, in the resolver's order (no parallel attempts):
        # a denial from the socket factory then ends the connect as it is raised
        happy_eyeballs_delay=None,
        socket_factory=functools.partial(_vetted_socket, policy),
        ssl=ssl_context if ssl_context is not None else True,
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=False,
        # The total of all heads is bounded by the protocol; one line may use all of it.
        max_line_size=max_head_bytes,
        max_field_size=max_head_bytes,
        timeout=aiohttp.ClientTimeout(total=None),
    )


def request_timeout(connect: float, read: float, pool: float) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts of one request: ``pool`` seconds to get a connection (waiting
    for room and connecting), ``connect`` to connect, ``read`` between reads."""
    return aiohttp.ClientTimeout(total=None, connect=pool, sock_connect=connect, sock_read=read)


# The one table from what aiohttp raises to the stable codes, first match wins:
# (exception type, error class, what it means). Timeouts first (aiohttp's are
# asyncio.TimeoutError subclasses and ClientErrors at once).
ERROR_TABLE: tuple[tuple[type[BaseException], type[WorkerError], str], ...] = (
    (TimeoutError, FetchTimeoutError, "timed out"),
    (aiohttp.InvalidURL, InvalidInputError, "not a URL this client can request"),
    (aiohttp.ClientConnectorCertificateError, FetchFailedError, "certificate refused"),
    (aiohttp.ClientConnectorDNSError, FetchFailedError, "cannot resolve"),
    (aiohttp.ClientConnectorError, FetchFailedError, "cannot connect"),
    (ResponseHeadError, FetchFailedError, "response heads refused"),
    (aiohttp.ServerDisconnectedError, FetchFailedError, "the server disconnected"),
    (aiohttp.ClientResponseError, FetchFailedError, "not a valid HTTP response"),
    (aiohttp.ClientPayloadError, FetchFailedError, "broken response body"),
    (aiohttp.ClientError, FetchFailedError, "network error"),
)


@contextlib.contextmanager
def map_http_errors(url: str, what: str = "fetching") -> Iterator[None]:
    """Raise what aiohttp raises in the block as the worker error :data:`ERROR_TABLE`
    names, with ``what`` and ``url`` in its message; anything else passes unchanged.

    A header value aiohttp refuses to send (a control character such as CR/LF: its
    writer raises ``ValueError`` before a byte goes out) is ``invalid_input``: the
    caller's, not the host's.
    """
    try:
        yield
    except WorkerError:
        raise
    except (aiohttp.ClientError, TimeoutError) as e:
        for kind, error, meaning in ERROR_TABLE:
            if isinstance(e, kind):
                context: dict[str, Any] = {"url": url}
                if isinstance(e, ResponseHeadError):
                    context.update(
                        reason="response_head",
                        limit_bytes=e.limit,
                        received_bytes=e.received,
                        interim=e.interim,
                    )
                detail = str(e) or type(e).__name__
                raise error(
                    f"{what} {url}: {meaning} ({type(e).__name__}: {detail})",
                    field="input.url" if error is InvalidInputError else None,
                    **context,
                ) from None
        raise  # unreachable: aiohttp.ClientError ends the table
    except ValueError as e:
        if "control character" in str(e):
            raise InvalidInputError(
                f"the request to {url} is not valid HTTP: {e}", field="input", url=url
            ) from None
        raise
