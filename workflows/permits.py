"""The pipeline side of cross-process limits: ask, wait for the permit, release.

Deterministic: asking is a local activity (``limiter-acquire``), waiting is
``workflow.wait_condition`` on the ``permit`` signal, releasing a concurrency
lease is a signal to the limiter workflow. A limiter that finds a lease past
its time asks the holder (``lease-check``); a lease this workflow no longer
holds is released again, a held one is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.limits import (
        AcquireCall,
        AcquireResult,
        LeaseCheck,
        Permit,
        Plan,
        PlanCall,
    )

Lease = tuple[str, str]  # (limiter workflow id, ticket)


class PermitWaitExpired(Exception):
    """The deadline passed before the limiter granted ``call``."""

    def __init__(self, call: AcquireCall) -> None:
        super().__init__(call.ticket)
        self.call = call

    @property
    def what(self) -> str:
        return "a concurrency slot" if self.call.key is not None else "the rate limit"


class PermitBook:
    """Permits a workflow has asked for and received, and the leases it holds."""

    def __init__(self) -> None:
        self.received: dict[str, Permit] = {}
        # ticket -> (who waits: a step id, or "" for the pipeline; "rate" or "concurrency")
        self.waiting: dict[str, tuple[str, str]] = {}
        self.held: dict[str, str] = {}  # ticket -> limiter workflow id

    async def plan(self, tenant: str, workers: list[str]) -> set[str]:
        """The workers whose calls must wait for a rate-limit permit (one local activity)."""
        plan: Plan = await workflow.execute_local_activity(
            names.LIMITER_PLAN,
            PlanCall(tenant=tenant, workers=sorted(set(workers))),
            result_type=Plan,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
        )
        return set(plan.rate_limited)

    def on_permit(self, permit: Permit) -> None:
        self.received[permit.ticket] = permit

    async def on_lease_check(self, check: LeaseCheck) -> None:
        """The limiter asks about a lease past its time: give back one not held."""
        if check.ticket not in self.held and check.ticket not in self.waiting:
            await self._signal_release(check.limiter_id, check.ticket)

    def waiting_for(self) -> dict[str, str]:
        """Who waits for a permit now: step id (or "") -> ``rate`` or ``concurrency``."""
        return dict(self.waiting.values())

    async def acquire(
        self, call: AcquireCall, wait: timedelta | None, who: str = ""
    ) -> AcquireResult | None:
        """Wait for a permit; the limiter's answer, or None if ``wait`` passed first."""
        result: AcquireResult = await workflow.execute_local_activity(
            names.LIMITER_ACQUIRE,
            call,
            result_type=AcquireResult,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5)),
        )
        if not result.limited:
            return result
        self.waiting[call.ticket] = (who, "concurrency" if call.key is not None else "rate")
        try:
            await workflow.wait_condition(lambda: call.ticket in self.received, timeout=wait)
        except TimeoutError:
            if result.limiter_id is not None:
                await self._signal_release(result.limiter_id, call.ticket)
            return None
        finally:
            self.waiting.pop(call.ticket, None)
        if call.key is not None and result.limiter_id is not None:
            self.held[call.ticket] = result.limiter_id
        return result

    async def acquire_all(
        self,
        calls: Sequence[AcquireCall],
        wait: Callable[[], timedelta | None],
        who: str = "",
    ) -> list[Lease]:
        """Every permit in order; the concurrency leases to give back after the call.

        Raises:
            PermitWaitExpired: ``wait()`` passed first; leases taken so far are released.
        """
        leases: list[Lease] = []
        for call in calls:
            result = await self.acquire(call, wait(), who)
            if result is None:
                await self.release_all(leases)
                raise PermitWaitExpired(call)
            if call.ticket in self.held:
                leases.append((self.held[call.ticket], call.ticket))
        return leases

    async def release_all(self, leases: Sequence[Lease]) -> None:
        for limiter_id, ticket in leases:
            await self.release(limiter_id, ticket)

    async def release(self, limiter_id: str, ticket: str) -> None:
        """Give a concurrency lease back (or withdraw a queued request)."""
        self.held.pop(ticket, None)
        await self._signal_release(limiter_id, ticket)

    async def _signal_release(self, limiter_id: str, ticket: str) -> None:
        handle = workflow.get_external_workflow_handle(limiter_id)
        try:
            await handle.signal(names.LIMITER_RELEASE_SIGNAL, ticket)
        except Exception as e:
            workflow.logger.warning("cannot release %s at %s: %s", ticket, limiter_id, e)
