"""Per-host delay that follows the server: Scrapy's AutoThrottle, shared per process.

The model is Scrapy's ``scrapy/extensions/throttle.py``: if a server needs
``latency`` seconds to answer, sending a request every ``latency / N``
seconds keeps about ``N`` requests in flight at that server (``N`` is the
target concurrency). After each reply the host's delay moves halfway from
its previous value toward that target, and straight to the target when the
target is higher (a slowing server is followed at once, a recovering one
gradually). As in Scrapy, an error reply never lowers the delay: error pages
are small and fast, and following their latency down would speed up exactly
when the site asks for less.

Beyond Scrapy: a ``429`` or ``503`` reply doubles the delay (at least
:data:`ERROR_STEP_SECONDS`), and its ``Retry-After`` holds every request to
that host until the time it names. Every delay stays between the configured
floor (and the site's robots.txt ``Crawl-delay``, which is the site's own
floor) and the configured ceiling; a Retry-After hold is capped by the
ceiling too, since the activity's own retry already waits the full time.

One :class:`AutoThrottle` per process (built in :func:`~aiworker.activities.tools.scrape_tools`)
is shared by every activity through the politeness slots, so two scrapes of
one site in one process see one delay. The first request to a host waits
nothing beyond the floor: a step that fetches one page pays nothing for this.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

# The smallest delay an error reply sets: doubling a delay of zero stays zero.
ERROR_STEP_SECONDS = 0.1
# Statuses that mean "too fast": the host's delay doubles and Retry-After is held.
SLOW_DOWN = frozenset({429, 503})


@dataclass
class _Host:
    delay: float
    hold_until: float = 0.0


class AutoThrottle:
    """Per-host delays adjusted by latency and errors, between a floor and a ceiling.

    Args:
        target_concurrency: requests the delay aims to keep in flight per host
            (Scrapy's ``AUTOTHROTTLE_TARGET_CONCURRENCY``); must be above 0.
        floor_seconds: the least delay between request starts to one host.
        ceiling_seconds: the most delay the throttle sets (a robots.txt
            ``Crawl-delay`` above it still wins: that is the site's rule).
        enabled: False keeps the floor and Crawl-delay only (no adaptation).
        max_hosts: hosts remembered; the least recently used is forgotten first.
    """

    def __init__(
        self,
        *,
        target_concurrency: float = 4.0,
        floor_seconds: float = 0.0,
        ceiling_seconds: float = 30.0,
        enabled: bool = True,
        max_hosts: int = 10_000,
    ) -> None:
        if target_concurrency <= 0:
            raise ValueError("target_concurrency must be above 0")
        self.target_concurrency = target_concurrency
        self.floor_seconds = max(0.0, floor_seconds)
        self.ceiling_seconds = max(self.floor_seconds, ceiling_seconds)
        self.enabled = enabled
        self.max_hosts = max_hosts
        self._hosts: OrderedDict[str, _Host] = OrderedDict()

    def delay(self, host: str, crawl_delay: float | None = None) -> float:
        """The delay between request starts to ``host`` now (floor and Crawl-delay included)."""
        state = self._hosts.get(host)
        adaptive = state.delay if state is not None and self.enabled else 0.0
        return max(self.floor_seconds, crawl_delay or 0.0, adaptive)

    def hold(self, host: str) -> float:
        """Seconds to wait before any request to ``host`` (a Retry-After still running)."""
        state = self._hosts.get(host)
        if state is None or not self.enabled:
            return 0.0
        return max(0.0, state.hold_until - time.monotonic())

    def observe(
        self,
        host: str,
        latency: float | None,
        status: int | None,
        retry_after: float | None = None,
    ) -> None:
        """Adjust ``host``'s delay after a reply (``status`` None: no reply, a network error).

        Args:
            host: the politeness key (``host:port``).
            latency: seconds from sending the request to its response headers.
            status: the reply's status code; None when none came.
            retry_after: the reply's ``Retry-After`` in seconds, if any.
        """
        if not self.enabled:
            return
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _Host(self.floor_seconds)
            if len(self._hosts) > self.max_hosts:
                self._hosts.popitem(last=False)
        else:
            self._hosts.move_to_end(host)
        old = state.delay
        target = (latency or 0.0) / self.target_concurrency
        if status in SLOW_DOWN:
            new = max(2 * old, target, ERROR_STEP_SECONDS)
            if retry_after is not None and retry_after > 0:
                hold = min(retry_after, self.ceiling_seconds)
                state.hold_until = max(state.hold_until, time.monotonic() + hold)
        else:
            # Scrapy's rule: halfway toward the target, or the target when it is higher.
            new = max(target, (old + target) / 2)
            if status != 200 and new <= old:
                return  # an error page's short latency never lowers the delay
        state.delay = min(max(self.floor_seconds, new), self.ceiling_seconds)

    def snapshot(self) -> dict[str, float]:
        """Each remembered host's adaptive delay in seconds (for tests and logs)."""
        return {host: s.delay for host, s in self._hosts.items()}
