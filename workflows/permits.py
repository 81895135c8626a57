"""The pipeline side of cross-process limits: ask, wait for the permit, release.

Deterministic: asking is a local activity (``limiter-acquire``), waiting is
``workflow.wait_condition`` on the ``permit`` signal, releasing a concurrency
lease is a signal to the limiter workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from schemas import names
    from schemas.limits import AcquireCall, AcquireResult, Permit, Plan, PlanCall


class PermitBook:
    """Permits a workflow has asked for and received."""

    def __init__(self) -> None:
        self.received: dict[str, Permit] = {}
        self.waiting: set[str] = set()

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

    async def acquire(self, call: AcquireCall, wait: timedelta | None) -> AcquireResult | None:
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
        self.waiting.add(call.ticket)
        try:
            await workflow.wait_condition(lambda: call.ticket in self.received, timeout=wait)
        except TimeoutError:
            if result.limiter_id is not None:
                await self.release(result.limiter_id, call.ticket)
            return None
        finally:
            self.waiting.discard(call.ticket)
        return result

    async def release(self, limiter_id: str, ticket: str) -> None:
        """Give a concurrency lease back (or withdraw a queued request)."""
        handle = workflow.get_external_workflow_handle(limiter_id)
        try:
            await handle.signal(names.LIMITER_RELEASE_SIGNAL, ticket)
        except Exception as e:
            workflow.logger.warning("cannot release %s at %s: %s", ticket, limiter_id, e)
