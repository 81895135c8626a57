"""A pipeline's limits: which of its workers are rate limited, its own
concurrency slot, and the permits each step's call waits for.

The permit protocol itself (asking, waiting for the ``permit`` signal,
releasing, answering lease checks) is :mod:`aiworker.workflows.limits`, shared
with the for_each chunks; this module decides what a pipeline asks for.
Every wait ends at the pipeline's deadline (a :class:`Deadline`).
Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.limits import ConcurrencyCall, Plan
    from aiworker.schemas.options import lease_seconds
    from aiworker.schemas.pipeline import PipelineSpec, Step
    from aiworker.schemas.refs import ReferenceError_, resolve
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Deadline
from aiworker.workflows.calls import invalid_input
from aiworker.workflows.limits import CallLimits, Lease, PermitBook, WaitExpired

# A pipeline's own concurrency lease: checked with the pipeline when it runs out,
# kept while the pipeline lives; with a deadline it lasts the deadline and a margin.
PIPELINE_LEASE_SECONDS = 3600.0
PIPELINE_LEASE_MARGIN = 60.0


def step_max_attempts(step: Step) -> int | None:
    """The step's own cap on its worker's attempts (None: the spec's retries)."""
    return step.retry.max_attempts if step.retry else None


@dataclass
class PipelineLimits:
    """The limits of one pipeline run and the permits it holds."""

    permits: PermitBook
    requester: str  # the pipeline's workflow id: permits are signalled to it
    tenant: str
    deadline: Deadline
    # The workers whose calls wait for a rate-limit permit; None until planned: all.
    rate_limited: set[str] | None = None
    # What the limiter-plan activity answered; None until planned.
    planned: Plan | None = None

    async def plan(self, spec: PipelineSpec) -> Plan:
        """Ask once which of the pipeline's workers are rate limited, not per step."""
        workers = [s.worker for s in spec.steps] + [s.fallback for s in spec.steps if s.fallback]
        self.planned = await self.permits.plan(spec.tenant, workers)
        self.rate_limited = set(self.planned.rate_limited)
        return self.planned

    def is_rate_limited(self, worker_id: str) -> bool:
        return self.rate_limited is None or worker_id in self.rate_limited

    async def pipeline_slot(self, spec: PipelineSpec) -> list[Lease] | str:
        """Wait for the pipeline's own concurrency slot (``concurrency`` on the pipeline).

        Returns the lease to give back at the end, or, when the deadline passed
        while it waited, why nothing ran.
        """
        if spec.concurrency is None:
            return []
        try:
            key = str(resolve(spec.concurrency.key, {"inputs": spec.inputs}))
        except ReferenceError_ as e:
            raise invalid_input(f"pipeline: field 'concurrency.key': {e}") from None
        seconds = spec.budget.deadline_seconds
        call = ConcurrencyCall(
            key=key,
            limit=spec.concurrency.limit,
            requester=self.requester,
            ticket=f"{self.requester}/{workflow.uuid4().hex[:8]}/pipeline",
            # renewed by the limiter's lease checks for as long as this pipeline lives
            lease_seconds=(
                PIPELINE_LEASE_SECONDS if seconds is None else seconds + PIPELINE_LEASE_MARGIN
            ),
        )
        leases = await self.permits.acquire_all([call], self.deadline.wait)
        if isinstance(leases, WaitExpired):
            return f"{leases.message} ({key})"
        return leases

    def ticket(self, step_id: str) -> str:
        """A fresh ticket base for one call of ``step_id``. Drawn for every call,
        limited or not: the ids drawn after it must not shift on replay."""
        return f"{self.requester}/{step_id}/{workflow.uuid4().hex[:8]}"

    def for_worker(
        self, worker: WorkerSpec, step: Step, concurrency_key: str | None = None
    ) -> CallLimits:
        """What a call of ``worker`` in ``step`` waits for (the key resolved by the caller)."""
        return CallLimits(
            requester=self.requester,
            worker_id=worker.worker_id,
            tenant=self.tenant,
            rate_limited=self.is_rate_limited(worker.worker_id),
            concurrency_key=concurrency_key,
            concurrency_limit=step.concurrency.limit if step.concurrency else 1,
            lease_seconds=lease_seconds(worker, step.timeout_seconds, step_max_attempts(step)),
        )

    async def for_call(
        self, limits: CallLimits, ticket: str, step_id: str
    ) -> list[Lease] | WaitExpired:
        """Wait for a step call's permits; the concurrency leases to give back after it."""
        calls = limits.calls(ticket, rate_suffix="/rate")
        return await self.permits.acquire_all(calls, self.deadline.wait, who=step_id)
