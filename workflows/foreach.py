"""``PipelineForEachWorkflow``: one bounded chunk of a pipeline's for_each.

The pipeline splits a for_each list into chunks of ``chunk_size`` items and
runs each chunk as a child workflow, so no history grows with the list: the
parent records one child per chunk, a child at most ``chunk_size`` activities.
Inside a chunk at most ``max_parallel`` items run at once. Each item's
idempotency key is ``{key_prefix}/{item_index}``; its budget share comes from
the parent as an allowance, spent item by item through the same ledger.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import catalog, names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import AcquireCall, LeaseCheck, Permit
    from aiworker.schemas.pipeline import Budget, ChunkInput, ChunkItem, ChunkResult, ItemResult
    from aiworker.schemas.protocol import Usage

from aiworker.workflows.budget import BudgetRefused, Ledger
from aiworker.workflows.calls import call_worker
from aiworker.workflows.limits import PermitBook, PermitWaitExpired


@workflow.defn(name=names.FOREACH_WORKFLOW)
class PipelineForEachWorkflow:
    """Runs one chunk of a for_each step with bounded concurrency."""

    def __init__(self) -> None:
        self._done = 0
        self._permits = PermitBook()

    @workflow.signal(name=names.PERMIT_SIGNAL)
    def permit(self, permit: Permit) -> None:
        """A limiter granted a permit an item asked for."""
        self._permits.on_permit(permit)

    @workflow.signal(name=names.LEASE_CHECK_SIGNAL)
    async def lease_check(self, check: LeaseCheck) -> None:
        """A limiter asks about an item's lease past its time."""
        await self._permits.on_lease_check(check)

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        """Items finished so far in this chunk, and the items waiting at a limiter
        now (item index -> ``rate`` or ``concurrency``)."""
        return {"done": self._done, "waiting": self._permits.waiting_for()}

    @workflow.run
    async def run(self, chunk: ChunkInput) -> ChunkResult:
        """Run every item of the chunk; item failures are results, not exceptions."""
        with workflow.unsafe.sandbox_unrestricted():
            worker = catalog.current_specs()[chunk.worker]
        a = chunk.allowance
        started = workflow.now().timestamp()
        expired = a.deadline is not None and a.deadline <= started
        ledger = Ledger(
            Budget(
                max_tokens=a.max_tokens,
                max_external_calls=a.max_external_calls,
                deadline_seconds=(
                    a.deadline - started if a.deadline is not None and not expired else None
                ),
            ),
            started_at=started,
        )
        slots = asyncio.Semaphore(chunk.max_parallel)
        me = workflow.info().workflow_id

        def remaining() -> timedelta | None:
            if ledger.deadline is None:
                return None
            return timedelta(seconds=max(0.0, ledger.deadline - workflow.now().timestamp()))

        def refused(item: ChunkItem, code: str, message: str) -> ItemResult:
            self._done += 1
            return ItemResult(
                index=item.index, status="failed", error_code=code, error_message=message
            )

        async def one(item: ChunkItem) -> ItemResult:
            async with slots:
                try:
                    if expired:
                        raise BudgetRefused("deadline", "pipeline deadline has passed")
                    admission = ledger.admit(
                        worker, workflow.now().timestamp(), chunk.timeout_seconds
                    )
                except BudgetRefused as e:
                    return refused(item, ErrorCode.BUDGET_EXCEEDED.value, e.message)
                # The worker's per-tenant rate limit holds for every item, and the
                # step's concurrency key (resolved per item) across every chunk.
                keyed = chunk.concurrency_limit is not None and item.concurrency_key is not None
                ticket = (
                    f"{me}/{item.index}/{workflow.uuid4().hex[:8]}"
                    if chunk.rate_limited or keyed
                    else ""
                )
                calls: list[AcquireCall] = []
                if chunk.rate_limited:
                    calls.append(
                        AcquireCall(
                            worker_id=worker.worker_id,
                            tenant=chunk.tenant,
                            requester=me,
                            ticket=ticket,
                        )
                    )
                if keyed:
                    assert item.concurrency_key is not None and chunk.concurrency_limit
                    calls.append(
                        AcquireCall(
                            key=item.concurrency_key,
                            limit=chunk.concurrency_limit,
                            requester=me,
                            ticket=f"{ticket}/concurrency",
                            lease_seconds=chunk.lease_seconds,
                        )
                    )
                try:
                    leases = await self._permits.acquire_all(calls, remaining, who=str(item.index))
                except PermitWaitExpired as e:
                    ledger.settle(admission, Usage())
                    return refused(
                        item,
                        ErrorCode.RATE_LIMITED.value,
                        f"the pipeline deadline passed while waiting for {e.what}",
                    )
                try:
                    outcome = await call_worker(
                        worker,
                        key=f"{chunk.key_prefix}/{item.index}",
                        step_id=chunk.step_id,
                        tenant=chunk.tenant,
                        trace_id=chunk.trace_id,
                        input=item.input,
                        admission=admission,
                        max_attempts=chunk.max_attempts,
                        queue_suffix=chunk.queue_suffix,
                        summary=f"{chunk.step_id}[{item.index}] ({worker.worker_id})",
                    )
                finally:
                    await self._permits.release_all(leases)
                ledger.settle(admission, outcome.usage)
                self._done += 1
                status = outcome.status if outcome.status in names.OK_STATUSES else "failed"
                return ItemResult(
                    index=item.index,
                    status=status,  # type: ignore[arg-type]
                    outputs=outcome.outputs if outcome.ok else None,
                    attempts=outcome.attempts,
                    error_code=outcome.error_code,
                    error_message=outcome.error_message,
                )

        results = await asyncio.gather(*(one(i) for i in chunk.items))
        return ChunkResult(items=list(results), usage=ledger.used)


__all__ = ["PipelineForEachWorkflow"]
