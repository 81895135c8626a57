"""robots.txt rules and per-host politeness, shared by every activity in a process.

:class:`RobotsCache` fetches ``/robots.txt`` once per origin (one fetch even
when many activities ask at once) and keeps the parsed rules for a TTL.
Following RFC 9309: a 4xx robots.txt means no rules (allow all); a 5xx or a
network failure is not cached and fails the fetch as retryable, so a site in
trouble is not mistaken for an open one. Matching uses the user agent that
the page request itself sends. Rules are parsed and matched by Scrapy's
``protego``, which follows RFC 9309 where ``urllib.robotparser`` does not:
``*`` and ``$`` wildcards, the longest matching rule wins, ``Allow`` wins a
tie, paths are compared percent-encoded.

:class:`Politeness` bounds concurrent requests per host and keeps a minimum
delay between request starts to the same host (the larger of the configured
delay and the site's ``Crawl-delay``); with an :class:`AutoThrottle` that delay
follows the host's latency and errors (``activities/tools/autothrottle.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiworker.activities.tools.autothrottle import AutoThrottle

if TYPE_CHECKING:  # protego comes with the 'scrape' extra: imported where rules are parsed
    from protego import Protego

# (url) -> (status_code, body text); raises WorkerError subclasses on failure.
RobotsLoader = Callable[[str], Awaitable[tuple[int, str]]]


@dataclass
class _Entry:
    parser: Protego
    expires: float


class RobotsCache:
    """Parsed robots.txt per origin (``scheme://host:port``) with a TTL."""

    def __init__(self, ttl_seconds: float = 3600.0, max_entries: int = 10000) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0

    async def rules(self, origin: str, load: RobotsLoader) -> Protego:
        """The rules of ``origin``, loading them with ``load`` when stale."""
        entry = self._entries.get(origin)
        if entry is not None and entry.expires > time.monotonic():
            return entry.parser
        lock = self._locks.setdefault(origin, asyncio.Lock())
        async with lock:
            entry = self._entries.get(origin)
            if entry is not None and entry.expires > time.monotonic():
                return entry.parser
            self.fetches += 1
            status, text = await load(origin + "/robots.txt")
            from protego import Protego

            parser = Protego.parse("" if 400 <= status < 500 else text)
            if len(self._entries) >= self.max_entries:
                oldest = next(iter(self._entries))
                self._entries.pop(oldest)
                lock_of_oldest = self._locks.get(oldest)
                if lock_of_oldest is not None and not lock_of_oldest.locked():
                    del self._locks[oldest]
            self._entries[origin] = _Entry(parser, time.monotonic() + self.ttl_seconds)
            return parser

    async def allowed(
        self, origin: str, url: str, user_agent: str, load: RobotsLoader
    ) -> tuple[bool, float | None]:
        """Whether ``user_agent`` may fetch ``url``, and the site's crawl delay."""
        parser = await self.rules(origin, load)
        return parser.can_fetch(url, user_agent), crawl_delay(parser.crawl_delay(user_agent))


# The longest Crawl-delay honoured: a site's ``Crawl-delay: 1000000000`` must
# not stall every fetch of its host until each one's deadline.
MAX_CRAWL_DELAY_SECONDS = 60.0


def crawl_delay(value: float | None) -> float | None:
    """A site's Crawl-delay as honoured: None when absent, negative or not a
    number, at most :data:`MAX_CRAWL_DELAY_SECONDS`."""
    if value is None:
        return None
    delay = float(value)
    if math.isnan(delay) or delay < 0:
        return None
    return min(delay, MAX_CRAWL_DELAY_SECONDS)


class Politeness:
    """At most ``max_concurrent`` requests per host and a delay between their starts.

    The delay is ``min_delay_seconds`` and the site's Crawl-delay, or, with a
    ``throttle``, what the throttle says for the host (which includes both).
    """

    def __init__(
        self,
        max_concurrent: int = 8,
        min_delay_seconds: float = 0.0,
        throttle: AutoThrottle | None = None,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.min_delay_seconds = min_delay_seconds
        self.throttle = throttle
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._last_start: dict[str, float] = {}
        self._users: dict[str, int] = {}

    def observe(
        self, host: str, latency: float | None, status: int | None, retry_after: float | None
    ) -> None:
        """Tell the throttle (if any) how ``host`` answered."""
        if self.throttle is not None:
            self.throttle.observe(host, latency, status, retry_after)

    @contextlib.asynccontextmanager
    async def slot(self, host: str, crawl_delay: float | None = None) -> AsyncIterator[None]:
        """Hold one of ``host``'s request slots, after its delay."""
        sem = self._slots.setdefault(host, asyncio.Semaphore(self.max_concurrent))
        self._users[host] = self._users.get(host, 0) + 1
        try:
            async with sem:
                delay = self._delay(host, crawl_delay)
                hold = self.throttle.hold(host) if self.throttle is not None else 0.0
                if delay > 0 or hold > 0:
                    now = time.monotonic()
                    # The delay as it is now, counted from the last start: a delay the
                    # throttle raised meanwhile applies to the next request already.
                    start = max(now + hold, self._last_start.get(host, -math.inf) + delay)
                    # Reserve the start time before sleeping so concurrent waiters queue up.
                    self._last_start[host] = start
                    if start > now:
                        await asyncio.sleep(start - now)
                else:
                    self._last_start[host] = time.monotonic()
                yield
        finally:
            # Forget idle hosts so a long-running process does not grow per host seen
            # (the throttle keeps its own bounded memory of each host's delay).
            self._users[host] -= 1
            if self._users[host] == 0:
                del self._users[host]
                del self._slots[host]
                last = self._last_start.get(host)
                if last is not None and last + self._delay(host, crawl_delay) <= time.monotonic():
                    del self._last_start[host]

    def _delay(self, host: str, crawl_delay: float | None) -> float:
        if self.throttle is not None:
            return max(self.min_delay_seconds, self.throttle.delay(host, crawl_delay))
        return max(self.min_delay_seconds, crawl_delay or 0.0)
