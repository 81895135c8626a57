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

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas import names
    from schemas.errors import ErrorCode
    from schemas.limits import AcquireCall, Permit
    from schemas.pipeline import Budget, ChunkInput, ChunkItem, ChunkResult, ItemResult
    from schemas.protocol import Usage
    from schemas.spec import load_specs

from workflows.budget import BudgetRefused, Ledger
from workflows.calls import call_worker
from workflows.permits import PermitBook


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

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self) -> dict[str, int]:
        """Items finished so far in this chunk."""
        return {"done": self._done}

    @workflow.run
    async def run(self, chunk: ChunkInput) -> ChunkResult:
        """Run every item of the chunk; item failures are results, not exceptions."""
        with workflow.unsafe.sandbox_unrestricted():
            worker = load_specs()[chunk.worker]
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
                # The worker's per-tenant rate limit holds for every item.
                if chunk.rate_limited:
                    permit = await self._permits.acquire(
                        AcquireCall(
                            worker_id=worker.worker_id,
                            tenant=chunk.tenant,
                            requester=me,
                            ticket=f"{me}/{item.index}/{workflow.uuid4().hex[:8]}",
                        ),
                        None
                        if ledger.deadline is None
                        else timedelta(
                            seconds=max(0.0, ledger.deadline - workflow.now().timestamp())
                        ),
                    )
                    if permit is None:
                        ledger.settle(admission, Usage())
                        return refused(
                            item,
                            ErrorCode.RATE_LIMITED.value,
                            "the pipeline deadline passed while waiting for the rate limit",
                        )
                outcome = await call_worker(
                    worker,
                    key=f"{chunk.key_prefix}/{item.index}",
                    tenant=chunk.tenant,
                    trace_id=chunk.trace_id,
                    input=item.input,
                    admission=admission,
                    max_attempts=chunk.max_attempts,
                    queue_suffix=chunk.queue_suffix,
                    summary=f"{chunk.step_id}[{item.index}] ({worker.worker_id})",
                )
                ledger.settle(admission, outcome.usage)
                self._done += 1
                status = outcome.status if outcome.status in ("succeeded", "partial") else "failed"
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
