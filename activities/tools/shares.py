"""Each tenant's share of a process's fetch pool.

The fetch tool is one per process and serves every tenant's calls through one
connection pool (:mod:`~aiworker.activities.tools.http_client`, ``AIWORKER_FETCH_MAX_CONNECTIONS``).
Without shares, one tenant's requests could hold every connection (a page whose
150 images point at a server that never answers took all 100), and another
tenant's fetch waited for one until its own deadline. :class:`ConnectionShares`
lets one tenant hold at most ``per_tenant`` connections at once
(``AIWORKER_FETCH_TENANT_SHARE`` of the pool), so the rest stays free for the
others.

A hop of a fetch holds its tenant's share from just before its request until its
response is released (its connection back in the pool, or closed). A request
waiting for its tenant's share waits only for its own tenant's requests, within
its own deadline; one that gets no share in time is ``fetch_timeout`` with
``reason: tenant_share``.

The tenant comes from the call: the worker runtime sets it around each call
(:func:`tenant_share`), and tasks a call starts (the browser's request handlers)
inherit it. Fetches outside any call (tests, tools used directly) share the
unnamed tenant ``""``.

A robots.txt load is a hop like any other, under the share of the call that
asked first: other tenants' fetches to that origin wait for that one load (the
robots cache loads an origin once), at most until that call's deadline, and
then load it themselves.

Simple on purpose: a fixed share, no borrowing. With ``share`` at 0.5, two tenants
that both fill their share fill the pool; fairness among many busy tenants of one
process is Temporal's (its fairness keys) and the limiter's, not the pool's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Iterator

from aiworker.activities.errors import FetchTimeoutError

_TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("aiworker_pool_tenant", default="")


@contextlib.contextmanager
def tenant_share(tenant: str) -> Iterator[None]:
    """Count every fetch in this context (and the tasks it starts) against ``tenant``'s
    share of the pool."""
    token = _TENANT.set(tenant)
    try:
        yield
    finally:
        _TENANT.reset(token)


def current_tenant() -> str:
    """The tenant whose share this context's fetches use ("" outside any call)."""
    return _TENANT.get()


class ConnectionShares:
    """At most ``per_tenant`` connections held at once by one tenant's requests.

    Args:
        per_tenant: connections one tenant holds at once (at least 1).
    """

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = max(1, per_tenant)
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, url: str, deadline: float) -> AsyncIterator[None]:
        """Hold one of the current tenant's connections for the block, waiting for one
        until ``deadline`` (``time.monotonic()``); then ``fetch_timeout``
        (``reason: tenant_share``)."""
        tenant = _TENANT.get()
        sem = self._slots.setdefault(tenant, asyncio.Semaphore(self.per_tenant))
        self._users[tenant] = self._users.get(tenant, 0) + 1
        try:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await sem.acquire()
            except TimeoutError:
                raise share_timeout(url, tenant, self.per_tenant) from None
            try:
                yield
            finally:
                sem.release()
        finally:
            # Forget idle tenants, so a process does not grow with every tenant it served.
            self._users[tenant] -= 1
            if self._users[tenant] == 0:
                del self._users[tenant]
                del self._slots[tenant]


def share_timeout(url: str, tenant: str, per_tenant: int) -> FetchTimeoutError:
    """The error of a request that got none of its tenant's connections in time."""
    who = f"tenant {tenant!r}" if tenant else "this process's calls without a tenant"
    return FetchTimeoutError(
        f"fetching {url}: no connection came free in time; {who} already held all "
        f"{per_tenant} connections of its share of the fetch pool (AIWORKER_FETCH_TENANT_SHARE)",
        url=url,
        reason="tenant_share",
        tenant=tenant,
        connections=per_tenant,
    )
