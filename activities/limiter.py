"""The ``limiter-acquire`` activity: hand a permit request to the key's limiter.

Runs in a worker process, where the settings live: it works out which limit
applies (the worker spec's ``rate_limit`` per tenant, overridden by
``AIWORKER_RATE_LIMITS`` rules ``worker:tenant`` then ``worker:*``), and
signal-with-starts the ``LimiterWorkflow`` for that key on the process's own
task queue. The pipeline then waits for the ``permit`` signal; nothing is
dropped and nothing is held in a process.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import activity

from aiworker.schemas import names
from aiworker.schemas.limits import (
    AcquireCall,
    AcquireRequest,
    AcquireResult,
    LimiterState,
    Plan,
    PlanCall,
)
from aiworker.schemas.settings import Settings
from aiworker.schemas.spec import WorkerSpec, parse_rate


def rate_limit_for(
    settings: Settings, specs: Mapping[str, WorkerSpec], worker_id: str, tenant: str
) -> tuple[int, float] | None:
    """(limit, period seconds) for ``worker_id`` and ``tenant``, or None for no limit."""
    for rule_tenant in (tenant, "*"):
        for rule in settings.rate_limits:
            if rule.worker_id == worker_id and rule.tenant == rule_tenant:
                return rule.limit, rule.period_seconds
    spec = specs.get(worker_id)
    if spec is not None and spec.constraints.rate_limit:
        return parse_rate(spec.constraints.rate_limit)
    return None


class LimiterActivities:
    """Activities of the cross-process limiter."""

    def __init__(self, settings: Settings, specs: Mapping[str, WorkerSpec]) -> None:
        self._settings = settings
        self._specs = specs

    @activity.defn(name=names.LIMITER_PLAN)
    async def plan(self, call: PlanCall) -> Plan:
        """Which of a pipeline's workers have a rate limit for its tenant (asked once)."""
        return Plan(
            rate_limited=sorted(
                w
                for w in set(call.workers)
                if rate_limit_for(self._settings, self._specs, w, call.tenant) is not None
            )
        )

    @activity.defn(name=names.LIMITER_ACQUIRE)
    async def acquire(self, call: AcquireCall) -> AcquireResult:
        """Queue a permit request at the key's limiter (created on first use)."""
        if call.key is not None and call.limit is not None:
            key = f"concurrency:{call.key}"
            request = AcquireRequest(
                requester=call.requester,
                ticket=call.ticket,
                kind="concurrency",
                limit=call.limit,
                lease_seconds=call.lease_seconds,
            )
            result = AcquireResult(limited=True, key=key, limit=call.limit)
        elif call.worker_id is not None:
            rate = rate_limit_for(
                self._settings, self._specs, call.worker_id, call.tenant or "default"
            )
            if rate is None:
                return AcquireResult(limited=False)
            limit, period = rate
            key = f"rate:{call.worker_id}:{call.tenant or 'default'}"
            request = AcquireRequest(
                requester=call.requester,
                ticket=call.ticket,
                kind="rate",
                limit=limit,
                period_seconds=period,
            )
            result = AcquireResult(limited=True, key=key, limit=limit, period_seconds=period)
        else:
            return AcquireResult(limited=False)
        queue = activity.info().task_queue
        limiter_id = names.limiter_workflow_id(key, names.queue_suffix_of(queue))
        client = activity.client()
        await client.start_workflow(
            names.LIMITER_WORKFLOW,
            LimiterState(
                key=key,
                kind=request.kind,
                limit=request.limit,
                period_seconds=request.period_seconds,
            ),
            id=limiter_id,
            task_queue=queue,
            start_signal=names.LIMITER_ACQUIRE_SIGNAL,
            start_signal_args=[request],
            static_summary=f"limiter {key}",
        )
        return result.model_copy(update={"limiter_id": limiter_id})
