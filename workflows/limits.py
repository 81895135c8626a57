"""Limits on the workflow side: the limiter workflow that owns a limit key, and
the pipeline's way of asking it for permits.

Long on purpose (about 700 lines): both ends of one protocol (acquire, permit,
release, lease-check signals, the lease-block update) live here, so that a
change to one end is made beside the other.

1. :class:`LimiterWorkflow`: one limit key, shared by every worker process.

   Rate limits (N per period) and concurrency limits (N leases at once) must
   hold however many worker pods run, survive restarts and never drop a
   request. So the state lives in Temporal itself, not in a process or a second
   datastore: one long-running workflow per key (id
   ``aiworker-limiter/<key>``) receives ``acquire`` signals (sent with
   signal-with-start, so the first request creates it), grants permits in
   arrival order by signalling the requesting workflow, and receives
   ``release`` signals for concurrency leases. When a lease's ``lease_seconds``
   pass, the limiter asks its holder (a ``lease-check`` signal): a holder that
   is gone cannot be signalled and loses the slot, a live one keeps it for
   another period and gives it back itself if it no longer holds it. So a
   vanished requester cannot hold a slot forever, and a long one (a pipeline
   waiting days for review) is never overrun.
   One workflow task grants every request the window allows and signals them
   all at once. For a rate limit high for its period, worker processes lease
   blocks of permits (the ``lease-block`` update, answered at once or refused)
   and hand them out from memory (``activities/limits.PermitPool``); a block
   counts as used over its whole validity, so every window stays within the
   limit (:func:`_used`). History stays bounded with continue-as-new; an idle
   limiter completes once nothing it granted counts in the window, and the
   next request starts a fresh one.

2. :class:`PermitBook`, the requesting side (a pipeline or a for_each chunk): ask,
   wait for the permit, release. :class:`CallLimits` builds the rate and
   concurrency requests of one worker call, :class:`PermitSignals` answers the
   limiter's signals; both serve every workflow that asks for permits.

   Deterministic: asking is a local activity (``limiter-acquire``; a for_each
   chunk asks for the permits of one workflow task with one
   ``limiter-acquire-many``), whose answer may be a permit from the process's
   leased block (``pooled``: no wait), waiting is
   ``workflow.wait_condition`` on the ``permit`` signal, releasing a concurrency
   lease is a signal to the limiter workflow. A limiter that finds a lease past
   its time asks the holder (``lease-check``); a lease this workflow no longer
   holds is released again, a held one is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
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
        LeaseCheck,
        LimiterState,
        Permit,
        RateCall,
    )

from aiworker.workflows.runs import in_run, this_run

# Continue-as-new well before histories get large.
_MAX_HISTORY_EVENTS = 2000
_MAX_ROUNDS = 500
_IDLE_SECONDS = 300.0
# LimiterWorkflow auto-upgrades (a run moves to the current build at its next
# task), so its changes are patched; each patch ends as samples-python's
# ``patching/`` ends one (docs/replay.md, "Patches and their plans"):
#   stage 3 -- build 0.3.0, not before 2027-01-04: ``workflow.deprecate_patch``
#     replaces ``workflow.patched`` and the old branch is deleted, once
#     ``aiworker replay --query "WorkflowType = 'LimiterWorkflow' AND
#     ExecutionStatus = 'Running'"`` passes on it (a limiter run lives at most
#     _MAX_ROUNDS rounds or _MAX_HISTORY_EVENTS events before it continues as new
#     on the current build, so every run by then recorded the marker);
#   stage 4 -- build 0.4.0, not before 2027-02-01: the deprecate_patch call and the
#     id go, once no limiter run started on a build before 0.3.0 is running.
# Replay: limiters that ran before lease checks existed took expired leases back at once.
_LEASE_CHECK_PATCH = "lease-check"
# Grants of one round are signalled together (limiters before awaited each in turn:
# one permit per workflow task, about 10 a second).
_BATCH_PATCH = "limiter-batch-grants"
# A limiter stays while grants or leased blocks are inside the window (limiters
# before could complete idle with grants of a period longer than the idle time).
_WINDOW_PATCH = "limiter-window-idle"

Lease = tuple[str, str]  # (limiter workflow id, ticket)


def _record_wait(kind: str, seconds: float) -> None:
    """``aiworker_limiter_wait_seconds{kind}``: how long granted requests waited
    (the SDK's replay-safe meter: a replayed grant is not counted twice)."""
    workflow.metric_meter().create_histogram_float(
        names.LIMITER_WAIT_METRIC, "Time a permit request waited at its limiter.", "s"
    ).record(seconds, {"kind": kind})


@workflow.defn(name=names.LIMITER_WORKFLOW)
class LimiterWorkflow:
    """Grants permits for one key, in arrival order, across all processes."""

    @workflow.init
    def __init__(self, state: LimiterState) -> None:
        """The window the previous run carried over (grants, blocks), in place
        before any update of this run is handled: a ``lease-block`` delivered with
        the start must count them. The queue and the leases are merged in
        :meth:`run`, after the signals delivered with the start, as always."""
        self._s = state
        self._waiters: list[tuple[AcquireRequest, float]] = []
        self._holders: dict[str, float] = {}
        self._leases: dict[str, AcquireRequest] = {}
        self._grants: list[float] = list(state.grants)
        # (granted at, permits, ttl) of the blocks leased to worker processes
        self._blocks: list[tuple[float, int, float]] = list(state.blocks)
        self._sending: set[asyncio.Task[None]] = set()
        self._batch = False
        self._changed = False

    def _now(self) -> float:
        return workflow.now().timestamp()

    @workflow.signal(name=names.LIMITER_ACQUIRE_SIGNAL)
    def acquire(self, request: AcquireRequest) -> None:
        """Queue a request; it is granted when the limit allows."""
        if any(w.ticket == request.ticket for w, _ in self._waiters) or (
            request.ticket in self._holders
        ):
            return  # a retried acquire of the same ticket: already queued or held
        self._waiters.append((request, self._now()))
        self._changed = True

    @workflow.signal(name=names.LIMITER_RELEASE_SIGNAL)
    def release(self, ticket: str) -> None:
        """End a concurrency lease (or withdraw a queued request)."""
        self._holders.pop(ticket, None)
        self._leases.pop(ticket, None)
        self._waiters = [(w, t) for w, t in self._waiters if w.ticket != ticket]
        self._changed = True

    @workflow.update(name=names.LIMITER_BLOCK_UPDATE)
    def lease_block(self, request: BlockRequest) -> BlockGrant:
        """Lease a block of rate permits to a worker process's pool (see
        ``activities/limits.py``): granted at once or refused by the validator,
        never queued. The block counts as used anywhere in ``[now, now + ttl]``,
        so the window check in :meth:`_rate_used` stays exact."""
        self._s = self._s.model_copy(
            update={
                "kind": "rate",
                "limit": request.limit,
                "period_seconds": request.period_seconds,
            }
        )
        now = self._now()
        count = min(request.count, self._s.limit - self._rate_used(now))
        self._blocks.append((now, count, request.ttl_seconds))
        self._s = self._s.model_copy(update={"granted_total": self._s.granted_total + count})
        self._changed = True  # keeps the limiter from completing idle meanwhile
        return BlockGrant(count=count, ttl_seconds=request.ttl_seconds)

    @lease_block.validator
    def _check_block(self, request: BlockRequest) -> None:
        """Refuse (nothing in history) when requests wait in the queue, which go
        first in arrival order, or when no permit is left in the window."""
        now = self._now()
        used = _used(self._grants, self._blocks, now - request.period_seconds)
        if self._waiters:
            raise ApplicationError("requests are queued", type="limiter_busy")
        if used >= request.limit:
            raise ApplicationError("no permit left in the window", type="limiter_busy")

    def _rate_used(self, now: float) -> int:
        """Permits counted in the window ending now (expired entries dropped): single
        grants at their time, blocks over their whole validity."""
        start = now - self._s.period_seconds
        self._grants = [t for t in self._grants if t > start]
        self._blocks = [b for b in self._blocks if b[0] + b[2] > start]
        return _used(self._grants, self._blocks, start)

    @workflow.query(name="state")
    def state(self) -> dict[str, object]:
        """Holders, queue length and recent grants, for operators."""
        return {
            "key": self._s.key,
            "kind": self._s.kind,
            "limit": self._s.limit,
            "period_seconds": self._s.period_seconds,
            "holders": sorted(self._holders),
            "waiting": [w.ticket for w, _ in self._waiters],
            "recent_grants": len(self._grants),
            "leased_blocks": len(self._blocks),
            "granted_total": self._s.granted_total,
        }

    @workflow.run
    async def run(self, state: LimiterState) -> LimiterState:
        """Serve the key until idle; continue-as-new to keep history bounded (the
        window in ``state`` is taken over in ``__init__``)."""
        # carry over what the previous run held; signals may already have queued more
        self._waiters = [*state.waiters, *self._waiters]
        self._holders = {**state.holders, **self._holders}
        self._leases = {**state.leases, **self._leases}
        self._batch = workflow.patched(_BATCH_PATCH)
        idle_since = self._now()
        for _ in range(_MAX_ROUNDS):
            # reset before granting: a signal that lands while grants are being
            # sent must wake the next round, not wait for the timer
            self._changed = False
            await self._grant_ready()
            if self._waiters or self._holders or self._in_window():
                idle_since = self._now()
            elif self._now() - idle_since >= _IDLE_SECONDS:
                await workflow.wait_condition(lambda: not self._sending)
                return self._snapshot()
            if workflow.info().get_current_history_length() > _MAX_HISTORY_EVENTS:
                break
            wake, why = self._next_wake(idle_since)
            try:
                await workflow.wait_condition(
                    lambda: self._changed,
                    timeout=timedelta(seconds=max(0.05, wake)),
                    timeout_summary=f"limiter {self._s.key} ({self._limit_text()}): {why}",
                )
            except TimeoutError:
                pass
        await workflow.wait_condition(lambda: not self._sending)
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._snapshot())

    def _in_window(self) -> bool:
        """Whether grants or blocks still count in the window (a limiter that
        completed now would forget them)."""
        if not self._grants and not self._blocks:
            return False
        if _used(self._grants, self._blocks, self._now() - self._s.period_seconds) == 0:
            return False
        return workflow.patched(_WINDOW_PATCH)

    def _snapshot(self) -> LimiterState:
        return self._s.model_copy(
            update={
                "waiters": list(self._waiters),
                "holders": dict(self._holders),
                "leases": {t: r for t, r in self._leases.items() if t in self._holders},
                "grants": list(self._grants),
                "blocks": list(self._blocks),
            }
        )

    def _limit_text(self) -> str:
        return per_text(self._s.limit, self._s.period_seconds if self._s.kind == "rate" else None)

    def _next_wake(self, idle_since: float) -> tuple[float, str]:
        """Seconds until the next thing to do when no signal comes first, and what
        it is (the timer's summary in the UI)."""
        now = self._now()
        queued = f"{len(self._waiters)} queued"
        candidates = [(idle_since + _IDLE_SECONDS - now, "end when still idle")]
        if self._waiters and self._s.kind == "rate" and self._grants:
            candidates.append(
                (self._grants[0] + self._s.period_seconds - now, f"window frees a permit, {queued}")
            )
        if self._waiters and self._s.kind == "rate" and self._blocks:
            candidates.append(
                (
                    min(t + ttl for t, _, ttl in self._blocks) + self._s.period_seconds - now,
                    f"leased block leaves the window, {queued}",
                )
            )
        if self._holders:
            candidates.append((min(self._holders.values()) - now, "check a lease past its time"))
        wake, why = min(candidates, key=lambda c: c[0])
        return max(0.05, wake), why

    async def _expire(self, ticket: str, now: float) -> None:
        """An expired lease: keep it while its holder lives, else take it back."""
        request = self._leases.get(ticket)
        if request is not None and workflow.patched(_LEASE_CHECK_PATCH):
            check = LeaseCheck(ticket=ticket, limiter_id=workflow.info().workflow_id)
            try:
                await workflow.get_external_workflow_handle(request.requester).signal(
                    names.LEASE_CHECK_SIGNAL, check
                )
            except FailureError as e:  # the server could not deliver it: the holder is gone
                workflow.logger.warning(
                    "limiter %s: lease %s taken back, holder %s is gone: %s",
                    self._s.key,
                    ticket,
                    request.requester,
                    e,
                )
            else:
                if ticket in self._holders:  # not released while the signal was on its way
                    self._holders[ticket] = now + request.lease_seconds
                return
        else:
            workflow.logger.warning("limiter %s: lease %s expired", self._s.key, ticket)
        self._holders.pop(ticket, None)
        self._leases.pop(ticket, None)

    async def _grant_ready(self) -> None:
        now = self._now()
        for ticket, end in list(self._holders.items()):
            if end <= now:
                await self._expire(ticket, now)
        # a bounded number of grants per round
        for _ in range(len(self._waiters)):
            if not self._waiters:
                return
            request, queued_at = self._waiters[0]
            # the newest request's limits win: operators change them in settings
            self._s = self._s.model_copy(
                update={
                    "kind": request.kind,
                    "limit": request.limit,
                    "period_seconds": request.period_seconds,
                }
            )
            if request.kind == "rate":
                if self._rate_used(now) >= self._s.limit:
                    return
                self._grants.append(now)
            else:
                if len(self._holders) >= self._s.limit:
                    return
                self._holders[request.ticket] = now + request.lease_seconds
                self._leases[request.ticket] = request
            self._waiters.pop(0)
            self._s = self._s.model_copy(update={"granted_total": self._s.granted_total + 1})
            _record_wait(request.kind, now - queued_at)
            permit = Permit(
                ticket=request.ticket, key=self._s.key, waited_seconds=round(now - queued_at, 3)
            )
            if self._batch:
                # sent without waiting: one workflow task grants the whole round
                permit = permit.model_copy(update={"granted_at": now})
                task = asyncio.create_task(self._deliver(request, permit))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
                continue
            try:
                await workflow.get_external_workflow_handle(request.requester).signal(
                    names.PERMIT_SIGNAL, permit
                )
            except ApplicationError:
                # the requester is gone: free its slot again
                self._holders.pop(request.ticket, None)
                self._leases.pop(request.ticket, None)
            except FailureError as e:  # any other refusal by the server: free it too
                workflow.logger.warning(
                    "limiter %s: cannot signal %s: %s", self._s.key, request.requester, e
                )
                self._holders.pop(request.ticket, None)
                self._leases.pop(request.ticket, None)

    async def _deliver(self, request: AcquireRequest, permit: Permit) -> None:
        """Signal one permit; a requester that cannot be signalled frees its slot
        (a rate grant stays counted: never more than the limit)."""
        try:
            await workflow.get_external_workflow_handle(request.requester).signal(
                names.PERMIT_SIGNAL, permit
            )
        except FailureError as e:  # the server could not deliver it: the requester is gone
            workflow.logger.warning(
                "limiter %s: cannot signal %s: %s", self._s.key, request.requester, e
            )
            self._holders.pop(request.ticket, None)
            self._leases.pop(request.ticket, None)
            self._changed = True


def _used(grants: list[float], blocks: list[tuple[float, int, float]], start: float) -> int:
    """Permits that count in a window starting at ``start``: a grant inside it, and a
    block whose validity (granted at + ttl) reaches into it, with all its permits.

    Exact across processes: a block granted at t_j, and any earlier block or grant
    i that reaches into a window W that t_j's block also reaches into, was inside
    the window ending at t_j when j was granted (t_i + ttl_i > start of W >
    t_j - period); so every window holds at most what one grant decision counted.
    """
    return sum(1 for t in grants if t > start) + sum(k for t, k, ttl in blocks if t + ttl > start)


def per_text(limit: int | None, period_seconds: float | None) -> str:
    """A rate as people read it: ``600/min``, ``3 per 2s``, ``2 at once``."""
    if not period_seconds:
        return f"{limit} at once"
    unit = {1.0: "s", 60.0: "min", 3600.0: "h", 86400.0: "day"}.get(float(period_seconds))
    return f"{limit}/{unit}" if unit else f"{limit} per {period_seconds:g}s"


def ask_summary(call: AcquireCall, who: str) -> str:
    """The summary of the local activity that asks a limiter for ``call`` (what the
    UI shows instead of the bare ``limiter-acquire``)."""
    if isinstance(call, RateCall):
        return f"ask for a {call.worker_id} permit (tenant {call.tenant}) for {who}"
    if call.scope == "tenant":
        return f"ask for a pipeline slot of tenant {call.key} (limit {call.limit} at once)"
    return f"ask for a concurrency slot of {call.key} (limit {call.limit} at once) for {who}"


def wait_summary(call: AcquireCall, result: AcquireResult, who: str) -> str:
    """The summary of the timer that bounds the wait for ``call``'s permit: what it
    waits for, with the limit the limiter answered."""
    rate = per_text(result.limit, result.period_seconds)
    if isinstance(call, RateCall):
        return f"wait for a {call.worker_id} permit (tenant {call.tenant}, limit {rate}) for {who}"
    if call.scope == "tenant":
        return f"wait for a pipeline slot of tenant {call.key} (limit {rate})"
    return f"wait for a concurrency slot of {call.key} (limit {rate}) for {who}"


def limit_text(result: AcquireResult) -> str:
    """Which limit a request waits for and its configured rate, as people read it:
    ``rate:web-scrape:acme (10 per 60s)``, ``concurrency:c1 (2 at once)``."""
    if result.period_seconds:
        return f"{result.key} ({result.limit} per {result.period_seconds:g}s)"
    return f"{result.key} ({result.limit} at once)"


@dataclass(frozen=True)
class WaitExpired:
    """The deadline passed before the limiter granted ``call``; nothing is held."""

    call: AcquireCall

    @property
    def message(self) -> str:
        what = "a concurrency slot" if self.call.kind == "concurrency" else "the rate limit"
        return f"the pipeline deadline passed while waiting for {what}"


@dataclass(frozen=True)
class CallLimits:
    """What one worker call waits for: its worker's per-tenant rate limit and, with
    a resolved concurrency key, a lease on that key."""

    requester: str  # the workflow that receives the permits
    worker_id: str = ""
    tenant: str = "default"
    rate_limited: bool = False
    concurrency_key: str | None = None
    concurrency_limit: int = 1
    lease_seconds: float = 3600.0

    @property
    def any(self) -> bool:
        return self.rate_limited or self.concurrency_key is not None

    def calls(self, ticket: str, rate_suffix: str = "") -> list[AcquireCall]:
        """The acquire calls, rate first; tickets ``{ticket}{rate_suffix}`` and
        ``{ticket}/concurrency``. The two callers spell their rate ticket differently
        (a pipeline step adds ``/rate``); a ticket must not change under a running
        workflow, whose permit is addressed to it."""
        calls: list[AcquireCall] = []
        if self.rate_limited:
            calls.append(
                RateCall(
                    worker_id=self.worker_id,
                    tenant=self.tenant,
                    requester=self.requester,
                    ticket=f"{ticket}{rate_suffix}",
                )
            )
        if self.concurrency_key is not None:
            calls.append(
                ConcurrencyCall(
                    key=self.concurrency_key,
                    limit=self.concurrency_limit,
                    requester=self.requester,
                    ticket=f"{ticket}/concurrency",
                    lease_seconds=self.lease_seconds,
                )
            )
        return calls


class PermitBook:
    """Permits a workflow has asked for and received, and the leases it holds.

    The first wait of each step (and kind) that lasted a second or more is
    logged at INFO when its permit comes (at the latest one period after it
    began, for a rate limit), so a worker's log says why a run stood still
    without a timer or event more in its history; ``step`` names the one step
    a for_each chunk's book serves (its waiters are items).
    """

    def __init__(self, step: str | None = None, batch: bool = False) -> None:
        """``batch``: ask for the permits requested in one workflow task together
        (one ``limiter-acquire-many``), as a for_each chunk's items do."""
        self.received: dict[str, Permit] = {}
        # ticket -> (who waits: a step id, or "" for the pipeline; "rate" or "concurrency")
        self.waiting: dict[str, tuple[str, str]] = {}
        self.held: dict[str, str] = {}  # ticket -> limiter workflow id
        # ticket -> which limit it waits for and its configured rate (limit_text)
        self.limits: dict[str, str] = {}
        self.step = step
        self._told: set[tuple[str, str]] = set()
        self.run_id = this_run()  # releases act only inside this run (workflows.runs)
        self._batch = batch
        self._asks: list[tuple[AcquireCall, asyncio.Future[AcquireResult], str]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def on_permit(self, permit: Permit) -> None:
        self.received[permit.ticket] = permit

    async def on_lease_check(self, check: LeaseCheck) -> None:
        """The limiter asks about a lease past its time: give back one not held."""
        if check.ticket not in self.held and check.ticket not in self.waiting:
            await self._signal_release(check.limiter_id, check.ticket)

    def waiting_for(self) -> dict[str, str]:
        """Who waits for a permit now: step id (or "") -> ``rate`` or ``concurrency``."""
        return dict(self.waiting.values())

    def _who(self, who: str) -> str:
        """Who a permit is for, in a summary: ``step read``, ``each[3]`` (an item of
        this chunk's step), or ``the pipeline``."""
        if self.step is not None:
            return f"{self.step}[{who}]" if who else f"step {self.step}"
        return f"step {who}" if who else "the pipeline"

    def waiting_limits(self) -> dict[str, str]:
        """Who waits for a permit now -> the limit it waits for, with its configured
        rate (``rate:validator:acme, 5 per 20s``): what ``aiworker run`` says."""
        return {self.waiting[t][0]: text for t, text in self.limits.items() if t in self.waiting}

    async def acquire(
        self, call: AcquireCall, wait: timedelta | None, who: str = ""
    ) -> AcquireResult | None:
        """Wait for a permit; the limiter's answer, or None if ``wait`` passed first."""
        result = await self._ask(call, who)
        if not result.limited:
            return result
        self.waiting[call.ticket] = (who, call.kind)
        self.limits[call.ticket] = limit_text(result)
        try:
            await workflow.wait_condition(
                lambda: call.ticket in self.received,
                timeout=wait,
                timeout_summary=wait_summary(call, result, self._who(who)),
            )
        except TimeoutError:
            if result.limiter_id is not None:
                await self._signal_release(result.limiter_id, call.ticket)
            return None
        finally:
            self.waiting.pop(call.ticket, None)
            self.limits.pop(call.ticket, None)
        self._tell_wait(who, call.kind, result, self.received[call.ticket].waited_seconds)
        if call.kind == "concurrency" and result.limiter_id is not None:
            self.held[call.ticket] = result.limiter_id
        return result

    async def _ask(self, call: AcquireCall, who: str = "") -> AcquireResult:
        """The limiter's answer to ``call``: one local activity per call, or with
        ``batch`` the calls of one workflow task together (:meth:`_ask_together`)."""
        if self._batch:
            answer: asyncio.Future[AcquireResult] = asyncio.get_running_loop().create_future()
            self._asks.append((call, answer, who))
            if len(self._asks) == 1:  # the first ask of this task sends them all
                task = asyncio.create_task(self._ask_together())
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            return await answer
        result: AcquireResult = await workflow.execute_local_activity(
            names.LIMITER_ACQUIRE,
            call,
            result_type=AcquireResult,
            summary=ask_summary(call, self._who(who)),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
        )
        return result

    async def _ask_together(self) -> None:
        """Send every ask made so far in this workflow task as one local activity
        (it runs after the coroutines already woken in this task have asked)."""
        asks, self._asks = self._asks, []
        try:
            answers: AcquireResults = await workflow.execute_local_activity(
                names.LIMITER_ACQUIRE_MANY,
                AcquireBatch(calls=[c for c, _, _ in asks]),
                result_type=AcquireResults,
                summary=self._asks_summary(asks),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
            )
        except asyncio.CancelledError:
            for _, answer, _ in asks:
                answer.cancel()
            raise
        except Exception as e:
            # Not a catch-all: every ask awaits its answer, so each raises what this
            # raised where it waits; an activity that failed on every attempt fails
            # the asks, a bug here fails the workflow task there (a task nobody
            # awaits would swallow it and leave the asks waiting for ever).
            for _, answer, _ in asks:
                if not answer.done():
                    answer.set_exception(e)
            return
        for (_, answer, _), result in zip(asks, answers.results, strict=True):
            if not answer.done():
                answer.set_result(result)

    def _asks_summary(
        self, asks: Sequence[tuple[AcquireCall, asyncio.Future[AcquireResult], str]]
    ) -> str:
        """One ``limiter-acquire-many``'s summary: how many permits, of which
        workers and keys, for which items (``ask for 4 validator permits (tenant
        acme) for each[0..3]``)."""
        if len(asks) == 1:
            call, _, who = asks[0]
            return ask_summary(call, self._who(who))
        what = sorted(
            {
                f"{c.worker_id} permits (tenant {c.tenant})"
                if isinstance(c, RateCall)
                else f"concurrency slots of {c.key}"
                for c, _, _ in asks
            }
        )
        whos = [w for _, _, w in asks]
        span = f"{whos[0]}..{whos[-1]}" if whos[0] != whos[-1] else whos[0]
        return f"ask for {len(asks)} {' and '.join(what)} for {self._who(span)}"

    def _tell_wait(self, who: str, kind: str, result: AcquireResult, waited: float) -> None:
        """Log a step's first wait of a second or more at a limiter
        (``workflow.logger``: not again on replay)."""
        step = self.step if self.step is not None else who
        if waited < 1.0 or (step, kind) in self._told:
            return
        self._told.add((step, kind))
        what = f"step {step!r}" + (" (for_each items)" if self.step is not None else "")
        workflow.logger.info(
            "%s waited %.1fs for a %s permit of %s",
            what if step else "the pipeline",
            waited,
            kind,
            limit_text(result),
        )

    async def acquire_all(
        self,
        calls: Sequence[AcquireCall],
        wait: Callable[[], timedelta | None],
        who: str = "",
    ) -> list[Lease] | WaitExpired:
        """Every permit in order: the concurrency leases to give back after the call,
        or, when ``wait()`` passed first, which call expired (leases taken so far are
        released)."""
        leases: list[Lease] = []
        for call in calls:
            result = await self.acquire(call, wait(), who)
            if result is None:
                await self.release_all(leases)
                return WaitExpired(call)
            if call.ticket in self.held:
                leases.append((self.held[call.ticket], call.ticket))
        return leases

    async def release_all(self, leases: Sequence[Lease]) -> None:
        """Give every lease back. Called from ``finally`` blocks, so also when the
        garbage collector closes the coroutines of a run a stopped worker dropped,
        outside any workflow or inside another run's task (:mod:`workflows.runs`):
        nothing may be sent there, and nothing needs to be, since the run goes on
        (replayed) wherever its next task runs."""
        if not in_run(self.run_id):
            return
        for limiter_id, ticket in leases:
            await self.release(limiter_id, ticket)

    async def release(self, limiter_id: str, ticket: str) -> None:
        """Give a concurrency lease back (or withdraw a queued request)."""
        self.held.pop(ticket, None)
        await self._signal_release(limiter_id, ticket)

    async def _signal_release(self, limiter_id: str, ticket: str) -> None:
        if not in_run(self.run_id):
            return
        handle = workflow.get_external_workflow_handle(limiter_id)
        try:
            await handle.signal(names.LIMITER_RELEASE_SIGNAL, ticket)
        except FailureError as e:  # the limiter is gone: nothing left to release
            workflow.logger.warning("cannot release %s at %s: %s", ticket, limiter_id, e)


class PermitSignals:
    """The limiter's two signals, for every workflow that asks for permits (a mixin:
    the SDK registers handlers a workflow class inherits)."""

    _permits: PermitBook

    @workflow.signal(name=names.PERMIT_SIGNAL)
    def permit(self, permit: Permit) -> None:
        """A limiter granted a permit this workflow asked for."""
        self._permits.on_permit(permit)

    @workflow.signal(name=names.LEASE_CHECK_SIGNAL)
    async def lease_check(self, check: LeaseCheck) -> None:
        """A limiter asks about a lease past its time (see ``LimiterWorkflow``)."""
        await self._permits.on_lease_check(check)
