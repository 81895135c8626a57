"""Limits on the activity side: the cross-process limiter's activity and each
provider endpoint's own request and token rates. The limiter's workflow is
``workflows/limits.py``, its models ``schemas/limits.py``.

1. The ``limiter-acquire`` activities (:class:`LimiterActivities`).
   They hand a permit request to the key's limiter. They run in a worker
   process, where the settings live: they work out which limit
   applies (the worker spec's ``rate_limit`` per tenant, overridden by
   ``AIWORKER_RATE_LIMITS`` rules ``worker:tenant`` then ``worker:*``; a
   tenant registry's rate ceiling holds on top: the tighter wins), and
   signal-with-start the ``LimiterWorkflow`` for that key on the process's own
   task queue. The pipeline then waits for the ``permit`` signal; nothing is
   dropped and nothing is held in a process.

2. :class:`EndpointRateLimiter`, a client-side limit per model endpoint.
   Requests and tokens per minute, per provider endpoint.
   Every call in the process reserves one request and its estimated tokens
   (prompt estimate + ``max_tokens``) in a sliding 60-second window before it
   goes out; when the provider reports the real usage the reservation is
   corrected. A call that would pass either limit is refused at once with
   ``rate_limited`` and the time until enough of the window has expired as its
   retry delay, so Temporal waits instead of a coroutine holding a slot. A call
   that alone needs more tokens than the per-minute limit can never pass and is
   ``budget_exceeded``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import AutoUpgradeVersioningOverride, Priority, WorkflowIDConflictPolicy

from aiworker.activities.errors import BudgetExceededError, RateLimitedError
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.limits import (
    AcquireBatch,
    AcquireCall,
    AcquireRequest,
    AcquireResult,
    AcquireResults,
    BlockGrant,
    BlockRequest,
    ConcurrencyCall,
    LimiterState,
)
from aiworker.schemas.spec import WorkerSpec, parse_rate
from aiworker.schemas.tenants import tighter_rate

WINDOW_SECONDS = 60.0

# Leased blocks of rate permits (:class:`PermitPool`): a block is valid this long
# at most, a tenth of the period at most (the limiter counts it over its whole
# validity, so a short one wastes little of the window) ...
BLOCK_TTL_SECONDS = 5.0
# ... holds at most this many permits, half what the limit allows in its validity
BLOCK_MAX = 1000
# ... and blocks are leased only when one would hold at least this many, for a limit
# of at least this many permits a second: a tighter limit (10/min, 100/min) queues
# every request at the limiter, in exact arrival order.
BLOCK_MIN = 4
BLOCK_MIN_RATE = 5.0
# A refused process queues its requests this long before it asks for a block again.
REFUSED_SECONDS = 0.1
# Leases one request may wait for when other requests took the new block first.
LEASE_TRIES = 3

log = logging.getLogger(__name__)
# A limiter's workflow tasks go first in a backlogged queue (Temporal's task priority):
# they are small, and every request waiting at the key waits for them.
LIMITER_PRIORITY = Priority(priority_key=names.PRIORITY_HIGHEST)

# What the live worker registry publishes, by worker id (the worker process
# supplies the reader: activities never import the process side).
LiveSpecs = Callable[[], Awaitable[Mapping[str, WorkerSpec]]]


def rate_limit_for(
    settings: Settings, specs: Mapping[str, WorkerSpec], worker_id: str, tenant: str
) -> tuple[int, float] | None:
    """(limit, period seconds) for ``worker_id`` and ``tenant``, or None for no limit.

    The operator's rule (``AIWORKER_RATE_LIMITS``, else the worker spec's
    ``rate_limit``), held under the tenant registry's ceiling: the tighter wins.
    """
    policy = settings.tenants.policy(tenant) if settings.tenants is not None else None
    ceiling = policy.rate(worker_id) if policy is not None else None
    return tighter_rate(_configured_rate(settings, specs, worker_id, tenant), ceiling)


def _configured_rate(
    settings: Settings, specs: Mapping[str, WorkerSpec], worker_id: str, tenant: str
) -> tuple[int, float] | None:
    for rule_tenant in (tenant, "*"):
        for rule in settings.rate_limits:
            if rule.worker_id == worker_id and rule.tenant == rule_tenant:
                return rule.limit, rule.period_seconds
    spec = specs.get(worker_id)
    if spec is not None and spec.constraints.rate_limit:
        return parse_rate(spec.constraints.rate_limit)
    return None


def block_size(limit: int, period_seconds: float) -> tuple[int, float]:
    """(permits per leased block, validity in seconds) for a rate limit of ``limit``
    per ``period_seconds``; ``(0, 0.0)`` when the limit is too tight for blocks."""
    if limit / period_seconds < BLOCK_MIN_RATE:
        return (0, 0.0)
    ttl = min(BLOCK_TTL_SECONDS, period_seconds / 10)
    count = min(BLOCK_MAX, int(limit / period_seconds * ttl / 2))
    return (count, ttl) if count >= BLOCK_MIN else (0, 0.0)


@dataclass
class _Keyed:
    """One key's leased blocks in this process: ``[permits left, valid until]`` each
    (monotonic clock), oldest first."""

    blocks: deque[list[float]] = field(default_factory=deque)
    leasing: asyncio.Task[None] | None = None
    refused_until: float = 0.0  # monotonic: the limiter refused, queue until then

    def take(self) -> bool:
        now = time.monotonic()
        while self.blocks:
            block = self.blocks[0]
            if block[0] > 0 and now < block[1]:
                block[0] -= 1
                return True
            self.blocks.popleft()  # used up, or past its validity: dropped
        return False

    def left(self) -> float:
        now = time.monotonic()
        return sum(b[0] for b in self.blocks if now < b[1])

    def valid_for(self) -> float:
        """Seconds until the last block held ends."""
        return max((b[1] for b in self.blocks), default=0.0) - time.monotonic()


class PermitPool:
    """Rate permits a worker process leased from the keys' limiters, in blocks.

    Our own mechanism (Temporal has no cross-process rate limit that holds
    exactly over an arbitrary window and per tenant; task-queue rate limits are
    per queue and approximate): asking the limiter workflow for every permit
    costs a signal each way and a workflow task per grant, which caps one key
    at tens of permits a second. With a block, the ``limiter-acquire`` local
    activity answers from memory at once; its answer is recorded in the
    requester's history, so the workflow stays deterministic. The next block is
    leased when half of the current one is used or half its validity has
    passed, so a steady stream of requests never waits for the limiter.

    Exact across processes: the limiter counts a block of ``k`` granted at its
    time ``t`` as ``k`` permits used anywhere in ``[t, t + ttl]``, and grants
    only what keeps every window within the limit (``workflows/limits._used``).
    The process uses a block's permits only until ``sent + ttl`` (``sent``: when
    it sent the request, on its own monotonic clock, never later than ``t``),
    and drops what is left then. The limiter refuses a block while requests
    wait in its queue (they go first) or the window is full; the process then
    queues its requests for ``ttl`` as before.
    """

    def __init__(self) -> None:
        self._keys: dict[str, _Keyed] = {}

    async def take(
        self,
        client: Client,
        limiter_id: str,
        start: Callable[[], WithStartWorkflowOperation[Any, Any]],
        limit: int,
        period_seconds: float,
    ) -> bool:
        """One permit from the pool (leasing a new block if needed); False: queue it."""
        count, ttl = block_size(limit, period_seconds)
        if count == 0:
            return False
        keyed = self._keys.setdefault(limiter_id, _Keyed())
        if keyed.take():
            # lease the next block before this one is used up or ends
            if keyed.left() < count / 2 or keyed.valid_for() < ttl / 2:
                self._lease(keyed, client, limiter_id, start, count, ttl, limit, period_seconds)
            return True
        for _ in range(LEASE_TRIES):
            if time.monotonic() < keyed.refused_until:
                return False
            task = self._lease(keyed, client, limiter_id, start, count, ttl, limit, period_seconds)
            await asyncio.shield(task)
            if keyed.take():
                return True
        return False

    def _lease(
        self,
        keyed: _Keyed,
        client: Client,
        limiter_id: str,
        start: Callable[[], WithStartWorkflowOperation[Any, Any]],
        count: int,
        ttl: float,
        limit: int,
        period_seconds: float,
    ) -> asyncio.Task[None]:
        """The key's one lease in flight (started now if there is none)."""
        if keyed.leasing is not None and not keyed.leasing.done():
            return keyed.leasing

        async def lease() -> None:
            sent = time.monotonic()
            try:
                grant: BlockGrant = await client.execute_update_with_start_workflow(
                    names.LIMITER_BLOCK_UPDATE,
                    BlockRequest(
                        count=count, ttl_seconds=ttl, limit=limit, period_seconds=period_seconds
                    ),
                    start_workflow_operation=start(),
                    result_type=BlockGrant,
                    rpc_timeout=timedelta(seconds=10),
                )
            except Exception as e:  # refused, or the limiter is continuing-as-new
                log.debug("no block from %s: %r", limiter_id, getattr(e, "cause", e))
                keyed.refused_until = time.monotonic() + min(ttl, REFUSED_SECONDS)
                return
            keyed.blocks.append([grant.count, sent + grant.ttl_seconds])

        keyed.leasing = asyncio.get_running_loop().create_task(lease())
        return keyed.leasing


class LimiterActivities:
    """Activities of the cross-process limiter."""

    def __init__(
        self,
        settings: Settings,
        specs: Mapping[str, WorkerSpec],
        live_specs: LiveSpecs | None = None,
    ) -> None:
        """``specs``: this process's catalog, for the workers' own ``rate_limit``.
        ``live_specs``: what the live worker registry knows, read for a worker this
        process does not serve (its published ``rate_limit``)."""
        self._settings = settings
        self._specs = specs
        self._live_specs = live_specs
        self.pool = PermitPool()

    @activity.defn(name=names.LIMITER_ACQUIRE)
    async def acquire(self, call: AcquireCall) -> AcquireResult:
        """Queue a permit request at the key's limiter (created on first use)."""
        return await self._acquire(call)

    @activity.defn(name=names.LIMITER_ACQUIRE_MANY)
    async def acquire_many(self, batch: AcquireBatch) -> AcquireResults:
        """Every request of one workflow task of a for_each chunk (one local activity
        instead of one per item): each answered as :meth:`acquire` would, in order."""
        results = await asyncio.gather(*(self._acquire(c) for c in batch.calls))
        return AcquireResults(results=list(results))

    async def _acquire(self, call: AcquireCall) -> AcquireResult:
        asked_at = time.time()
        if isinstance(call, ConcurrencyCall):
            # A tenant's own lease has a key no spec can spell.
            key = f"tenant:{call.key}" if call.scope == "tenant" else f"concurrency:{call.key}"
            request = AcquireRequest(
                requester=call.requester,
                ticket=call.ticket,
                kind="concurrency",
                limit=call.limit,
                lease_seconds=call.lease_seconds,
            )
            result = AcquireResult(limited=True, key=key, limit=call.limit)
        else:
            specs = self._specs
            if call.worker_id not in specs and self._live_specs is not None:
                specs = await self._live_specs()  # served by another process: its published spec
            rate = rate_limit_for(self._settings, specs, call.worker_id, call.tenant)
            if rate is None:
                return AcquireResult(limited=False)
            limit, period = rate
            key = f"rate:{call.worker_id}:{call.tenant}"
            request = AcquireRequest(
                requester=call.requester,
                ticket=call.ticket,
                kind="rate",
                limit=limit,
                period_seconds=period,
            )
            result = AcquireResult(limited=True, key=key, limit=limit, period_seconds=period)
        queue = activity.info().task_queue
        limiter_id = names.limiter_workflow_id(key, names.queue_suffix_of(queue))
        client = activity.client()
        state = LimiterState(
            key=key,
            kind=request.kind,
            limit=request.limit,
            period_seconds=request.period_seconds,
        )
        # How the key's limiter starts when it is not running, by either road below.
        # Long-lived: on a versioned worker it follows the current build (pipelines
        # are pinned); unversioned workers ignore it (workers/process/deployments.py).
        started: dict[str, Any] = {
            "id": limiter_id,
            "task_queue": queue,
            "static_summary": f"limiter {key}",
            "versioning_override": AutoUpgradeVersioningOverride(),
            "priority": LIMITER_PRIORITY,
        }
        if request.kind == "rate":

            def start() -> WithStartWorkflowOperation[Any, Any]:
                """The limiter's start, if it is not running (one per request sent)."""
                return WithStartWorkflowOperation(
                    names.LIMITER_WORKFLOW,
                    state,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    **started,
                )

            if await self.pool.take(client, limiter_id, start, request.limit, period):
                return result.model_copy(
                    update={
                        "limited": False,
                        "limiter_id": limiter_id,
                        "pooled": True,
                        "asked_at": asked_at,
                        "granted_at": time.time(),
                    }
                )
        await client.start_workflow(
            names.LIMITER_WORKFLOW,
            state,
            start_signal=names.LIMITER_ACQUIRE_SIGNAL,
            start_signal_args=[request],
            **started,
        )
        return result.model_copy(update={"limiter_id": limiter_id, "asked_at": asked_at})


@dataclass(eq=False)
class _Entry:
    at: float
    tokens: int


@dataclass
class _Window:
    entries: deque[_Entry] = field(default_factory=deque)
    tokens: int = 0


class Reservation:
    """One admitted call; :meth:`settle` replaces its estimate by real usage."""

    def __init__(
        self, limiter: EndpointRateLimiter, window: _Window | None, entry: _Entry | None
    ) -> None:
        self._limiter = limiter
        self._window = window
        self._entry = entry

    def release(self) -> None:
        """Give the reservation back: the call never went out."""
        if self._window is None or self._entry is None:
            return
        with self._limiter._lock:
            if self._entry in self._window.entries:
                self._window.entries.remove(self._entry)
                self._window.tokens -= self._entry.tokens
        self._entry = None

    def settle(self, tokens: int) -> None:
        if self._window is None or self._entry is None:
            return
        with self._limiter._lock:
            if self._entry in self._window.entries:
                self._window.tokens += tokens - self._entry.tokens
            self._entry.tokens = tokens


class EndpointRateLimiter:
    """Sliding-window limits keyed by target; one per process, thread-safe."""

    def __init__(
        self,
        limits: dict[str, tuple[int | None, int | None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def acquire(self, target: str, tokens: int) -> Reservation:
        """Admit one call of about ``tokens`` tokens or raise ``RateLimitedError``."""
        rpm, tpm = self.limits.get(target, (None, None))
        if rpm is None and tpm is None:
            return Reservation(self, None, None)
        if tpm is not None and tokens > tpm:
            raise BudgetExceededError(
                f"the call needs about {tokens} tokens; the client-side limit of {target} "
                f"is {tpm} tokens/min",
                resource="tokens_per_minute",
                limit=tpm,
                target=target,
            )
        with self._lock:
            now = self.clock()
            w = self._windows.setdefault(target, _Window())
            while w.entries and w.entries[0].at <= now - WINDOW_SECONDS:
                w.tokens -= w.entries.popleft().tokens
            wait = 0.0
            if rpm is not None and len(w.entries) + 1 > rpm:
                wait = w.entries[len(w.entries) - rpm].at + WINDOW_SECONDS - now
            if tpm is not None and w.tokens + tokens > tpm:
                # Wait until enough of the oldest reservations have left the window.
                freed = 0
                for e in w.entries:
                    freed += e.tokens
                    if w.tokens - freed + tokens <= tpm:
                        wait = max(wait, e.at + WINDOW_SECONDS - now)
                        break
            if wait > 0:
                which = "requests" if rpm is not None and len(w.entries) + 1 > rpm else "tokens"
                raise RateLimitedError(
                    f"client-side {which}/min limit of {target} reached; retry in {wait:.1f}s",
                    retry_after=round(max(wait, 0.1), 3),
                    target=target,
                    limit=rpm if which == "requests" else tpm,
                )
            entry = _Entry(now, tokens)
            w.entries.append(entry)
            w.tokens += tokens
            return Reservation(self, w, entry)
