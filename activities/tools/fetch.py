"""The ``fetch_url`` tool: one polite, bounded, policy-checked page fetch.

Long on purpose: one hop-by-hop fetch whose checks (header values, egress,
robots.txt, breaker, politeness, status, bounded body) are read in the order
they run, and each maps its failure to a stable code here.

Every hop (redirects included) passes the egress policy, robots.txt (for the
user agent actually sent), the host's circuit breaker and its politeness slot,
and holds one of its tenant's connections of the pool (``activities/tools/shares.py``).
The HTTP client is aiohttp's (:mod:`~aiworker.activities.tools.http_client`:
every address vetted before it is dialled, response heads bounded, interim
ones included), with no retries of its own and redirects handled here, so
that each hop is checked; Temporal owns retries. The body is read raw and decoded with
bounded output (``activities.bodies``), abandoned as soon as it passes the cap;
decoded text honours the charset of the HTTP header, then ``<meta charset>``,
then detection. The user agent is checked as a header value before anything
is sent.

Failures raise the worker-protocol errors, mapped to the stable codes of ``schemas/errors.py``:
robots/401/403 -> ``access_denied``, 404/410 -> ``not_found``, 429 ->
``rate_limited`` (``Retry-After`` as the next retry delay), 5xx and network
errors and corrupt or cut-short compressed bodies -> ``fetch_failed``, timeouts
-> ``fetch_timeout`` (also no connection of the tenant's share within the
deadline: ``reason: tenant_share``; aiohttp's exceptions by ``http_client.ERROR_TABLE``: a
response whose heads pass their bound, or that sends too many interim ``1xx``
responses, is ``fetch_failed``), body over the cap, stacked (``gzip, gzip``) or
unknown ``Content-Encoding`` -> ``payload_too_large``, policy ->
``egress_denied``, a user agent with control characters -> ``invalid_input``
(no request, no breaker failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict, Unpack
from urllib.parse import urljoin, urlsplit

import aiohttp

from aiworker.activities import bodies
from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.errors import (
    AccessDeniedError,
    EgressDeniedError,
    FetchFailedError,
    FetchTimeoutError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
)
from aiworker.activities.retry_after import parse_retry_after
from aiworker.activities.tools.charset import decode_body
from aiworker.activities.tools.egress import EgressPolicy
from aiworker.activities.tools.http_client import (
    client_session,
    map_http_errors,
    request_timeout,
)
from aiworker.activities.tools.robots import Politeness, RobotsCache
from aiworker.activities.tools.shares import ConnectionShares, current_tenant, share_timeout

if TYPE_CHECKING:  # protego comes with the 'scrape' extra (publish imports this module)
    from protego import Protego

DEFAULT_USER_AGENT = "aiworker-scrape/0.1 (+https://github.com/aiworker/aiworker)"
HTML_TYPES = frozenset(
    {"text/html", "application/xhtml+xml", "text/plain", "text/xml", "application/xml"}
)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class FetchLimits:
    """Bounds of one fetch."""

    max_bytes: int = 5 * 1024 * 1024
    max_redirects: int = 10
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    robots_max_bytes: int = 512 * 1024
    content_types: frozenset[str] = HTML_TYPES


@dataclass
class FetchResult:
    """A fetched page: decoded text, raw bytes and where they came from."""

    url: str
    final_url: str
    status_code: int
    content_type: str
    encoding: str
    body: bytes
    text: str
    fetched_at: str
    elapsed_ms: float
    sha256: str
    redirects: list[str] = field(default_factory=list)
    # The validators the final response carried, as sent (revalidate.py bounds them).
    etag: str | None = None
    last_modified: str | None = None

    def source(self) -> dict[str, Any]:
        """The ``source`` block of the web-scrape output."""
        return {
            "url": self.url,
            "final_url": self.final_url,
            "status_code": self.status_code,
            "fetched_at": self.fetched_at,
            "content_type": self.content_type,
            "encoding": self.encoding,
            "bytes": len(self.body),
            "sha256": self.sha256,
            "elapsed_ms": self.elapsed_ms,
        }


class FetchOptions(TypedDict, total=False):
    """What a fetch takes besides its URL and timeout."""

    user_agent: str | None
    respect_robots: bool
    allow_domains: Iterable[str] | None


@dataclass(frozen=True)
class Resource:
    """A fetched sub-resource: where it ended up, its status, headers and decoded body."""

    final_url: str
    status_code: int
    headers: list[tuple[str, str]]
    body: bytes


def _origin(url: str) -> tuple[str, str]:
    """``(scheme://host:port, host:port)`` of a URL."""
    p = urlsplit(url)
    host = (p.hostname or "").lower()
    port = p.port or (443 if p.scheme == "https" else 80)
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{p.scheme}://{hostport}", hostport


class FetchTool:
    """Fetches pages for workers; one instance per process, shared by activities.

    Args:
        egress: the egress policy every hop and connection passes.
        limits: body cap, redirect limit, timeouts, accepted content types.
        robots: the robots.txt cache (shared per process).
        politeness: per-host concurrency and delay (shared per process).
        breakers: per-host circuit breakers (shared per process).
        user_agent: the default ``User-Agent``; requests may override it.
        meter: counts the bytes every body read received and produced.
        max_connections: connections of the process's pool open at once.
        tenant_share: the part of them one tenant's requests hold at once
            (``activities/tools/shares.py``).
    """

    def __init__(
        self,
        egress: EgressPolicy,
        *,
        limits: FetchLimits | None = None,
        robots: RobotsCache | None = None,
        politeness: Politeness | None = None,
        breakers: BreakerRegistry | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
        meter: bodies.BodyMeter | None = None,
        max_connections: int = 100,
        tenant_share: float = 0.5,
    ) -> None:
        self.egress = egress
        self.limits = limits or FetchLimits()
        self.robots = robots or RobotsCache()
        self.politeness = politeness or Politeness()
        self.breakers = breakers
        self.user_agent = user_agent
        self.meter = meter
        self.max_connections = max_connections
        self.shares = ConnectionShares(int(max_connections * tenant_share))
        # Made on first use, inside the event loop that uses it (aiohttp binds to it).
        self._session: aiohttp.ClientSession | None = None
        self._headers = {
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "Accept-Encoding": bodies.ACCEPT_ENCODING,
        }

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def fetch(
        self,
        url: str,
        *,
        timeout: float,  # noqa: ASYNC109 - a budget handed to aiohttp and asyncio.timeout
        user_agent: str | None = None,
        respect_robots: bool = True,
        allow_domains: Iterable[str] | None = None,
        conditional: tuple[str, Mapping[str, str]] | None = None,
    ) -> FetchResult:
        """Fetch ``url`` within ``timeout`` seconds (connect, redirects, body and all).

        ``conditional`` is ``(hop_url, headers)``: the validator headers
        (``If-None-Match``, ``If-Modified-Since``) go on the hop to ``hop_url``
        only, the URL that issued them; a ``304`` there is a result with
        ``status_code`` 304 and no body (``activities.tools.revalidate``). Any
        other ``304`` is ``fetch_failed``.
        """
        started = time.monotonic()
        fetched_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        resp, final_url, redirects, body = await self._get(
            url,
            timeout,
            user_agent,
            respect_robots,
            allow_domains,
            check_type=True,
            conditional=conditional,
        )
        text, encoding = decode_body(body, resp.charset)
        return FetchResult(
            url=url,
            final_url=final_url,
            status_code=resp.status,
            content_type=resp.headers.get("content-type", ""),
            encoding=encoding,
            body=body,
            text=text,
            fetched_at=fetched_at,
            elapsed_ms=round((time.monotonic() - started) * 1000, 3),
            sha256=hashlib.sha256(body).hexdigest(),
            redirects=redirects,
            etag=resp.headers.get("etag"),
            last_modified=resp.headers.get("last-modified"),
        )

    async def fetch_resource(
        self,
        url: str,
        *,
        timeout: float,  # noqa: ASYNC109 - a budget handed to aiohttp and asyncio.timeout
        **options: Unpack[FetchOptions],
    ) -> Resource:
        """One GET of any content type (a browser's script, style or image).

        The same hops, egress, robots.txt, breaker, politeness and body cap as
        :meth:`fetch` (``options`` as there); the body is returned as bytes,
        never decoded to text.
        """
        resp, final_url, _redirects, body = await self._get(
            url,
            timeout,
            options.get("user_agent"),
            options.get("respect_robots", True),
            options.get("allow_domains"),
            check_type=False,
        )
        return Resource(final_url, resp.status, list(resp.headers.items()), body)

    async def _get(
        self,
        url: str,
        timeout: float,  # noqa: ASYNC109 - a budget handed to aiohttp and asyncio.timeout
        user_agent: str | None,
        respect_robots: bool,
        allow_domains: Iterable[str] | None,
        *,
        check_type: bool,
        conditional: tuple[str, Mapping[str, str]] | None = None,
    ) -> tuple[aiohttp.ClientResponse, str, list[str], bytes]:
        """The final response, its URL, the redirects and the capped body, within
        ``timeout`` (a conditional ``304``: no body, see :meth:`fetch`)."""
        ua = user_agent or self.user_agent
        check_header_value(ua, "input.user_agent")
        domains = tuple(allow_domains or ())
        deadline = time.monotonic() + timeout
        waiting: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                async with self._open(
                    url,
                    ua,
                    domains,
                    deadline,
                    respect_robots,
                    conditional=conditional,
                    waiting=waiting,
                ) as (resp, final_url, redirects):
                    if resp.status == 304:
                        body = b""  # Not Modified: no body, whatever it says
                    else:
                        if check_type:
                            self._check_content_type(resp, final_url)
                        body = await self._read(resp, final_url, self.limits.max_bytes)
        except TimeoutError:
            if waiting:  # the deadline passed while a hop waited for its tenant's share
                raise share_timeout(waiting[-1], current_tenant(), self.shares.per_tenant) from None
            raise FetchTimeoutError(
                f"fetching {url} took longer than {timeout:.3g}s", url=url
            ) from None
        return resp, final_url, redirects, body

    @contextlib.asynccontextmanager
    async def _open(
        self,
        url: str,
        ua: str,
        domains: tuple[str, ...],
        deadline: float,
        respect_robots: bool,
        max_redirects: int | None = None,
        conditional: tuple[str, Mapping[str, str]] | None = None,
        waiting: list[str] | None = None,
    ) -> AsyncIterator[tuple[aiohttp.ClientResponse, str, list[str]]]:
        """Follow redirects hop by hop; yield the final, still streaming response.

        Each hop holds one of its tenant's connections (:class:`ConnectionShares`)
        until its response is released; ``waiting`` holds the hop's URL while it
        waits for one, so a caller whose own deadline ends that wait can say so.
        """
        current = url
        visited = {url}
        redirects: list[str] = []
        hops = self.limits.max_redirects if max_redirects is None else max_redirects
        for _ in range(hops + 1):
            self.egress.check_url(current, domains)
            origin, hostport = _origin(current)
            crawl_delay = None
            if respect_robots:
                allowed, crawl_delay = await self.robots.allowed(
                    origin,
                    current,
                    ua,
                    lambda robots_url: self._load_robots(robots_url, ua, domains, deadline),
                )
                if not allowed:
                    raise AccessDeniedError(
                        f"robots.txt of {origin} disallows {current} for user agent {ua!r}",
                        url=current,
                        reason="robots",
                    )
            extra = conditional[1] if conditional and conditional[0] == current else None
            async with (
                self._share(current, deadline, waiting),
                self.politeness.slot(hostport, crawl_delay),
            ):
                resp = await self._send(current, ua, hostport, deadline, extra)
                try:
                    location = resp.headers.get("location")
                    if resp.status in _REDIRECTS and location:
                        nxt = urljoin(current, location.strip())
                        if nxt in visited:
                            raise FetchFailedError(
                                f"redirect loop at {current} -> {nxt}",
                                url=url,
                                redirects=[*redirects, nxt],
                                reason="redirect_loop",
                            )
                        visited.add(nxt)
                        redirects.append(nxt)
                        current = nxt
                        continue
                    if not (extra and resp.status == 304):
                        _raise_for_status(resp, current)
                    yield resp, current, redirects
                    return
                finally:
                    # back to the pool if read to its end, else its connection closes
                    resp.release()
        raise FetchFailedError(
            f"more than {hops} redirects from {url}",
            url=url,
            redirects=redirects,
            reason="too_many_redirects",
        )

    @contextlib.asynccontextmanager
    async def _share(
        self, url: str, deadline: float, waiting: list[str] | None
    ) -> AsyncIterator[None]:
        """One of the current tenant's connections, held for the block."""
        if waiting is not None:
            waiting.append(url)
        async with self.shares.hold(url, deadline):
            if waiting is not None:
                waiting.pop()
            yield

    async def _send(
        self,
        url: str,
        ua: str,
        hostport: str,
        deadline: float,
        extra: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """One request; the host's breaker sees its outcome."""
        if self.breakers is not None:
            await self.breakers.acheck(hostport)
        remaining = max(0.001, deadline - time.monotonic())
        timeout = request_timeout(
            connect=min(self.limits.connect_timeout, remaining),
            read=min(self.limits.read_timeout, remaining),
            pool=remaining,
        )
        if self._session is None:
            self._session = client_session(self.egress, max_connections=self.max_connections)
        healthy = False
        try:
            sent = time.monotonic()
            with map_http_errors(url):
                resp = await self._session.get(
                    url,
                    headers={**self._headers, "User-Agent": ua, **(extra or {})},
                    allow_redirects=False,
                    timeout=timeout,
                )
            healthy = resp.status < 500
            retry_after = resp.headers.get("retry-after")
            self.politeness.observe(
                hostport,
                time.monotonic() - sent,
                resp.status,
                parse_retry_after(retry_after) if retry_after else None,
            )
            return resp
        except (EgressDeniedError, InvalidInputError):
            # the policy said no, or the request was refused here: not the host's doing
            healthy = True
            raise
        finally:
            if self.breakers is not None:
                if healthy:
                    self.breakers.record_success(hostport)
                else:
                    self.breakers.record_failure(hostport)

    async def _read(
        self, resp: aiohttp.ClientResponse, url: str, cap: int, truncate: bool = False
    ) -> bytes:
        """The decoded body, streamed raw and decoded with bounded output (``bodies``)."""
        with _body_errors(url, cap):
            return await bodies.read_body(resp, cap, truncate=truncate, meter=self.meter)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        url: str,
        *,
        deadline: float,
        user_agent: str | None = None,
        respect_robots: bool = True,
        allow_domains: Iterable[str] | None = None,
    ) -> AsyncIterator[tuple[aiohttp.ClientResponse, str]]:
        """Open ``url`` with every check of :meth:`fetch` and yield the still streaming
        response and its final URL; read it with :meth:`iter_body`. Any content type.

        Args:
            url: what to open.
            deadline: ``time.monotonic()`` by which connecting and redirects end.
            user_agent: as for :meth:`fetch`.
            respect_robots: as for :meth:`fetch`.
            allow_domains: as for :meth:`fetch`.
        """
        ua = user_agent or self.user_agent
        check_header_value(ua, "input.user_agent")
        domains = tuple(allow_domains or ())
        async with self._open(url, ua, domains, deadline, respect_robots) as (resp, final, _r):
            yield resp, final

    async def iter_body(
        self, resp: aiohttp.ClientResponse, url: str, cap: int
    ) -> AsyncGenerator[bytes, None]:
        """The decoded body of a :meth:`stream` response as it arrives, at most ``cap``
        bytes; failures carry the codes :meth:`fetch` gives them."""
        with _body_errors(url, cap):
            async with contextlib.aclosing(bodies.iter_body(resp, cap, meter=self.meter)) as it:
                async for piece in it:
                    yield piece

    async def robots_rules(
        self,
        url: str,
        *,
        deadline: float,
        user_agent: str | None = None,
        allow_domains: Iterable[str] | None = None,
    ) -> Protego:
        """The robots.txt rules of ``url``'s origin (cached per process, as fetches use them)."""
        ua = user_agent or self.user_agent
        domains = tuple(allow_domains or ())
        self.egress.check_url(url, domains)
        origin, _ = _origin(url)
        return await self.robots.rules(
            origin, lambda robots_url: self._load_robots(robots_url, ua, domains, deadline)
        )

    def _check_content_type(self, resp: aiohttp.ClientResponse, url: str) -> None:
        mime = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if mime and mime not in self.limits.content_types:
            raise InvalidInputError(
                f"{url} serves {mime}, not a page this worker can parse "
                f"({', '.join(sorted(self.limits.content_types))})",
                field="input.url",
                url=url,
                content_type=mime,
            )

    async def _load_robots(
        self, robots_url: str, ua: str, domains: tuple[str, ...], deadline: float
    ) -> tuple[int, str]:
        """Status and text of a robots.txt; 5xx and network errors raise (retryable)."""
        try:
            async with self._open(robots_url, ua, domains, deadline, False, 5) as (resp, _, _r):
                body = await self._read(resp, robots_url, self.limits.robots_max_bytes, True)
                return resp.status, body.decode("utf-8", errors="replace")
        except (NotFoundError, AccessDeniedError) as e:
            # RFC 9309: any 4xx robots.txt means no rules apply.
            return int(getattr(e, "status_code", 404)), ""
        except (FetchFailedError, PayloadTooLargeError) as e:
            # An undecodable robots.txt is treated as an unreachable one (RFC 9309
            # 2.3.1.4: assume complete disallow), retryable like a 5xx.
            status = int(getattr(e, "status_code", 0) or 0)
            if 400 <= status < 500:
                return status, ""
            raise FetchFailedError(
                f"robots.txt of {robots_url} unavailable: {e.message}",
                url=robots_url,
                status_code=getattr(e, "status_code", None),
            ) from None


@contextlib.contextmanager
def _body_errors(url: str, cap: int) -> Iterator[None]:
    """Map what reading a body raised to the stable codes."""
    try:
        with map_http_errors(url, "reading"):
            yield
    except bodies.BodyTooLargeError as e:
        raise PayloadTooLargeError(f"{url} {e}", url=url, limit_bytes=cap) from None
    except bodies.UnsupportedEncodingError as e:
        # Not retried: the same server sends the same coding again, and a body
        # this worker will not decode is one it will not read, like one over the cap.
        raise PayloadTooLargeError(
            f"{url}: {e}",
            url=url,
            limit_bytes=cap,
            reason=e.reason,
            content_encoding=e.encoding,
        ) from None
    except bodies.CorruptBodyError as e:
        raise FetchFailedError(f"cannot decode the body of {url}: {e}", url=url) from None


_HEADER_VALUE_MAX = 1024


def check_header_value(value: str, field: str) -> None:
    """``invalid_input`` naming ``field`` unless ``value`` is a safe HTTP header value.

    Printable ASCII and tabs only: CR/LF would split the header (aiohttp refuses it
    only at send time, once connected, which looked like a failing host to the breaker), other
    control characters are refused by servers, and values go out as ASCII.
    """
    if len(value) > _HEADER_VALUE_MAX:
        raise InvalidInputError(
            f"{field} is longer than {_HEADER_VALUE_MAX} characters", field=field
        )
    bad = next((c for c in value if not (" " <= c <= "~" or c == "\t")), None)
    if bad is not None:
        raise InvalidInputError(
            f"{field} holds {bad!r}: a header value takes printable ASCII only", field=field
        )


def _raise_for_status(resp: aiohttp.ClientResponse, url: str) -> None:
    s = resp.status
    if 200 <= s < 300:
        return
    if s in (401, 403):
        raise AccessDeniedError(f"{url} answered {s}", url=url, status_code=s)
    if s in (404, 410):
        raise NotFoundError(f"{url} answered {s}", url=url, status_code=s)
    if s == 429:
        raise RateLimitedError(
            f"{url} answered 429 (Retry-After {resp.headers.get('retry-after')!r})",
            retry_after=parse_retry_after(resp.headers.get("retry-after")),
            url=url,
            status_code=s,
        )
    if s == 304:
        raise FetchFailedError(
            f"{url} answered 304 Not Modified to a request that asked no condition",
            url=url,
            status_code=s,
            reason="unexpected_not_modified",
        )
    retry_after = parse_retry_after(resp.headers.get("retry-after")) if s == 503 else None
    raise FetchFailedError(f"{url} answered {s}", url=url, status_code=s, retry_after=retry_after)
