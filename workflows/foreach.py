"""``PipelineForEachWorkflow``: one bounded chunk of a pipeline's for_each.

The pipeline splits a for_each list into chunks of ``chunk_size`` items and
runs each chunk as a child workflow, so no history grows with the list: the
parent records one child per chunk, a child at most ``chunk_size`` activities.
Inside a chunk at most ``max_parallel`` items run at once, each through
:func:`~aiworker.workflows.governed.governed_call` (permits, then the budget).
Each item's
idempotency key is ``{key_prefix}/{item_index}``; its budget share comes from
the parent as an allowance, spent item by item through the same ledger.

A chunk with more than ``chunk_size`` items runs none itself: it splits them
into child chunks (:mod:`workflows.chunks`: a tree of bounded width), shares
its allowance and its leaf-chunk slots out to them, and returns their results
together. Inputs and results travel by reference (``SPILL_METADATA``), so no
history holds the items' bytes. With ``store_outputs`` (a for_each over more
than the plan's ``inline_items``) a leaf chunk stores its succeeded items'
outputs as one part in the artifact store (:mod:`workflows.items`) and its
result lists only the failed items: the counts and the part's reference
travel up, never an item's outputs.

The worker's spec comes with the chunk (``ChunkInput.spec``: the spec the
pipeline recorded at its start), so a chunk decides as its pipeline does
however the catalog of the process running it has changed; a chunk started
without it is ``invalid_input``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import AcquireCall
    from aiworker.schemas.options import retry_policy
    from aiworker.schemas.pipeline import (
        Budget,
        ChunkInput,
        ChunkItem,
        ChunkResult,
        ItemResult,
        StepResult,
    )
    from aiworker.schemas.priority import task_priority
    from aiworker.schemas.protocol import Usage
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Admission, Deadline, Ledger
from aiworker.workflows.calls import CallContext, WorkerCall, call_items, invalid_input
from aiworker.workflows.chunks import Split, share, split
from aiworker.workflows.governed import (
    Governance,
    Refused,
    governed_batch,
    governed_call,
)
from aiworker.workflows.items import ItemsUnavailable, store_index, store_items
from aiworker.workflows.limits import CallLimits, PermitBook, PermitSignals

# The kinds of worker whose items a task may group: aiworker's runtime runs them.
BATCHED_KINDS = ("python", "prompt")
# The error code of a call whose activity was cancelled (``calls.error_code_of``).
CANCELLED = "cancelled"


def _items(n: int) -> str:
    return "1 item" if n == 1 else f"{n} items"


@workflow.defn(name=names.FOREACH_WORKFLOW)
class PipelineForEachWorkflow(PermitSignals):
    """Runs one chunk of a for_each step with bounded concurrency."""

    def __init__(self) -> None:
        self._done = 0
        self._permits = PermitBook(batch=True)

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        """Items finished so far in this chunk, and the items waiting at a limiter
        now (item index -> ``rate`` or ``concurrency``) and the limits they wait for
        (item index -> ``limit_text``)."""
        return {
            "done": self._done,
            "waiting": self._permits.waiting_for(),
            "limits": self._permits.waiting_limits(),
        }

    @workflow.run
    async def run(self, chunk: ChunkInput) -> ChunkResult:
        """Run every item of the chunk; item failures are results, not exceptions."""
        if chunk.chunk_size is not None and len(chunk.items) > chunk.chunk_size:
            return await self._split(chunk, chunk.chunk_size)
        worker = chunk.spec
        if worker is None:
            # nothing to decide from: the process's catalog is never read in a workflow
            raise invalid_input(
                f"chunk of step {chunk.step_id!r}: no recorded spec of worker "
                f"{chunk.worker!r} (ChunkInput.spec); a chunk runs as a pipeline's for_each"
            )
        self._permits.step = chunk.step_id  # its waits are logged as the step's
        a = chunk.allowance
        # The pipeline's own deadline, as it is: a chunk started after it refuses every item.
        ledger = Ledger(
            Budget(
                max_tokens=a.max_tokens,
                max_external_calls=a.max_external_calls,
                max_cost_usd=a.max_cost_usd,
            ),
            started_at=workflow.now().timestamp(),
            ends=Deadline(a.deadline),
        )
        slots = asyncio.Semaphore(chunk.max_parallel)
        me = workflow.info().workflow_id
        # The parent's priority, passed on so each item's history shows it (none: nothing).
        priority = task_priority(workflow.info().priority, None, chunk.tenant)

        def refused(item: ChunkItem, code: str, message: str) -> ItemResult:
            self._done += 1
            return ItemResult(
                index=item.index, status="failed", error_code=code, error_message=message
            )

        context = CallContext(
            tenant=chunk.tenant,
            trace_id=chunk.trace_id,
            step_id=chunk.step_id,
            queue_suffix=chunk.queue_suffix,
            priority=priority,
        )

        def governed(item: ChunkItem) -> tuple[WorkerCall, Governance]:
            # The worker's per-tenant rate limit holds for every item, and the
            # step's concurrency key (resolved per item) across every chunk.
            limits = CallLimits(
                requester=me,
                worker_id=worker.worker_id,
                tenant=chunk.tenant,
                rate_limited=chunk.rate_limited,
                concurrency_key=(
                    item.concurrency_key if chunk.concurrency_limit is not None else None
                ),
                concurrency_limit=chunk.concurrency_limit or 1,
                lease_seconds=chunk.lease_seconds,
            )

            def asks(limits: CallLimits = limits, index: int = item.index) -> list[AcquireCall]:
                if not limits.any:
                    return []
                # drawn only when asking: the ids drawn after it must not shift on replay
                return limits.calls(f"{me}/{index}/{workflow.uuid4().hex[:8]}")

            call = WorkerCall(
                worker,
                key=f"{chunk.key_prefix}/{item.index}",
                input=item.input,
                context=context,
                summary=f"{chunk.step_id}[{item.index}] ({worker.worker_id})",
                timeout_seconds=chunk.timeout_seconds,
                max_attempts=chunk.max_attempts,
                cache=chunk.cache,
                local=chunk.local,
            )
            gov = Governance(
                ledger=ledger,
                permits=self._permits,
                asks=asks,
                deadline=ledger.ends,
                who=str(item.index),
            )
            return call, gov

        def ended(item: ChunkItem, result: StepResult | Refused) -> ItemResult:
            if isinstance(result, Refused):
                code = (
                    ErrorCode.BUDGET_EXCEEDED if result.kind == "budget" else ErrorCode.RATE_LIMITED
                )
                return refused(item, code.value, result.message)
            self._done += 1
            return ItemResult(
                index=item.index,
                status="failed" if not result.ok else result.status,  # type: ignore[arg-type]
                outputs=result.outputs if result.ok else None,
                attempts=result.attempts,
                error_code=result.error_code,
                error_message=result.error_message,
                cached=result.cached,
            )

        async def one(item: ChunkItem) -> ItemResult:
            async with slots:
                call, gov = governed(item)
                return ended(item, await governed_call(call, gov))

        if chunk.tolerated is not None:
            # only a step with tolerated_failures (never with items_per_task > 1)

            async def run_one(item: ChunkItem) -> ItemResult:
                call, gov = governed(item)
                return ended(item, await governed_call(call, gov))

            results = await self._tolerating(chunk.items, chunk.tolerated, slots, run_one)
        elif chunk.items_per_task > 1 and not chunk.local and worker.kind in BATCHED_KINDS:
            results = await self._in_tasks(chunk, worker, governed, ended)
        else:
            results = await asyncio.gather(*(one(i) for i in chunk.items))
        if not chunk.store_outputs:
            return ChunkResult(items=list(results), usage=ledger.used)
        return await self._store(chunk, list(results), ledger.used)

    async def _tolerating(
        self,
        items: list[ChunkItem],
        tolerated: int,
        slots: asyncio.Semaphore,
        run_one: Callable[[ChunkItem], Awaitable[ItemResult]],
    ) -> list[ItemResult]:
        """The chunk's items under a failure threshold (``tolerated_failures``,
        docs/foreach.md): once more than ``tolerated`` of them failed, no item
        starts (``not_started``) and those in flight are cancelled (their
        activities are cancelled; ``cancelled``). A cancellation of the chunk itself
        (its pipeline stopped the step) does the same, and the chunk still returns
        what its items did, so its pipeline counts every item.

        Written here rather than left to Temporal because an activity's cancellation
        ends one call, while the threshold is over the step's items: the chunk
        decides from the results in its history which items stop. An item whose
        call ended as the cancellation came keeps that result, unless it ended
        ``cancelled``.
        """
        failed = 0
        started: set[int] = set()
        stopped = False
        tasks: list[asyncio.Task[ItemResult]] = []

        def stop() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            me = asyncio.current_task()
            for t in tasks:
                if t is not me and not t.done():
                    t.cancel()

        def halted(item: ChunkItem, status: str) -> ItemResult:
            self._done += 1
            return ItemResult(index=item.index, status=status)  # type: ignore[arg-type]

        async def one(item: ChunkItem) -> ItemResult:
            nonlocal failed
            try:
                async with slots:
                    if stopped:
                        return halted(item, "not_started")
                    started.add(item.index)
                    result = await run_one(item)
            except asyncio.CancelledError:
                return halted(item, "cancelled" if item.index in started else "not_started")
            if result.status == "failed":
                if stopped and result.error_code == CANCELLED:
                    return result.model_copy(update={"status": "cancelled"})
                failed += 1
                if failed > tolerated:
                    stop()
            return result

        tasks.extend(asyncio.create_task(one(item)) for item in items)
        try:
            await workflow.wait(tasks)
        except asyncio.CancelledError:
            # the pipeline cancelled this chunk (the step's threshold was passed)
            stop()
            await workflow.wait(tasks)
        # a task cancelled before it first ran never started its item
        return [
            halted(item, "not_started") if t.cancelled() else t.result()
            for t, item in zip(tasks, items, strict=True)
        ]

    async def _in_tasks(
        self,
        chunk: ChunkInput,
        worker: WorkerSpec,
        governed: Callable[[ChunkItem], tuple[WorkerCall, Governance]],
        ended: Callable[[ChunkItem, StepResult | Refused], ItemResult],
    ) -> list[ItemResult]:
        """The chunk's items, ``items_per_task`` to an activity task (docs/foreach.md).

        Each item takes its permits and its budget admission as a single item does
        (:func:`~aiworker.workflows.governed.governed_batch`); the admitted ones of a
        group go in ONE ``<worker_id>.items`` call (:func:`call_items`). At most
        ``max_parallel`` items are in flight: ``max_parallel // items_per_task``
        tasks at once (at least one), each running ``min(items_per_task,
        max_parallel)`` items at once; one group more takes its permits and
        admission ahead and waits, holding them, for a task slot. An item that
        failed retryably runs again in a next task of its group's items, after
        the spec's backoff (or the worker's retry-after, if longer), until the
        step's attempts are spent.
        Written here rather than left to Temporal's retry policy because one
        activity succeeds or fails as a whole, while each item must keep its own
        attempts and code.
        """
        k = chunk.items_per_task
        inner = min(k, chunk.max_parallel)
        at_once = max(1, chunk.max_parallel // k)
        tasks = asyncio.Semaphore(at_once)
        # one group more than run at once takes its permits and admission ahead, so
        # a task starts as soon as a slot frees, not a permit round trip later
        ready = asyncio.Semaphore(at_once + 1)
        policy = retry_policy(worker, chunk.max_attempts)
        most = policy.maximum_attempts or 1

        def backoff(attempt: int) -> float:
            first = policy.initial_interval.total_seconds() if policy.initial_interval else 1.0
            delay = first * policy.backoff_coefficient ** (attempt - 1)
            cap = policy.maximum_interval
            return min(delay, cap.total_seconds()) if cap is not None else delay

        async def rounds(admitted: list[tuple[WorkerCall, Admission | None]]) -> list[StepResult]:
            final: list[StepResult | None] = [None] * len(admitted)
            used = [Usage() for _ in admitted]
            attempts = [1] * len(admitted)
            pending = list(range(len(admitted)))
            while pending:
                first = admitted[pending[0]][0]
                ends = await call_items(
                    [admitted[i] for i in pending],
                    [attempts[i] for i in pending],
                    inner,
                    f"{chunk.step_id}[{first.key.rsplit('/', 1)[-1]}..] "
                    f"{_items(len(pending))} ({worker.worker_id})",
                )
                again: list[int] = []
                wait = 0.0
                for i, end in zip(pending, ends, strict=True):
                    used[i] = used[i] + end.result.usage
                    if end.retryable and attempts[i] < most:
                        again.append(i)
                        wait = max(wait, backoff(attempts[i]), end.retry_after or 0.0)
                        attempts[i] += 1
                    else:
                        final[i] = end.result.model_copy(update={"usage": used[i]})
                if again:
                    retry = max(attempts[i] for i in again)
                    await workflow.sleep(
                        wait,
                        summary=f"backoff before retry {retry} of {chunk.step_id}[..] "
                        f"{_items(len(again))} ({worker.worker_id})",
                    )
                pending = again
            return [r for r in final if r is not None]

        async def group(items: list[ChunkItem]) -> list[ItemResult]:
            async with ready:
                pairs = [governed(item) for item in items]
                outs = await governed_batch(
                    [c for c, _ in pairs], [g for _, g in pairs], rounds, slot=tasks
                )
                return [ended(item, out) for item, out in zip(items, outs, strict=True)]

        groups = [chunk.items[i : i + k] for i in range(0, len(chunk.items), k)]
        done = await asyncio.gather(*(group(g) for g in groups))
        return [r for g in done for r in g]

    @staticmethod
    async def _store(chunk: ChunkInput, results: list[ItemResult], usage: Usage) -> ChunkResult:
        """The chunk's result with its succeeded items' outputs stored as one part:
        those items counted, the failed ones listed. If the store fails, the
        succeeded items fail with its code (a redrive runs them again)."""
        ok = [r for r in results if r.status in names.OK_STATUSES]
        failed = [r for r in results if r.status not in names.OK_STATUSES]
        if not ok:
            return ChunkResult(items=failed, usage=usage)
        try:
            part = await store_items(chunk.tenant, [(r.index, r.outputs) for r in ok])
        except ItemsUnavailable as e:
            lost = [
                r.model_copy(
                    update={
                        "status": "failed",
                        "outputs": None,
                        "error_code": e.code,
                        "error_message": e.message,
                    }
                )
                for r in ok
            ]
            return ChunkResult(items=sorted(failed + lost, key=lambda r: r.index), usage=usage)
        return ChunkResult(
            items=failed,
            usage=usage,
            succeeded=len(ok),
            cached=sum(r.cached for r in ok),
            parts=[part],
        )

    async def _split(self, chunk: ChunkInput, chunk_size: int) -> ChunkResult:
        """Run the chunk's items in child chunks; their results in item order."""
        plan = split(len(chunk.items), chunk_size, chunk.chunk_slots)
        if chunk.tolerated is not None:
            parts = await self._split_tolerating(chunk, plan, chunk.tolerated)
        else:
            parts = await self._split_all(chunk, plan)
        usage = Usage()
        for p in parts:
            usage = usage + p.usage
        stored = [ref for p in parts for ref in p.parts]
        if chunk.store_outputs and len(stored) > 1:
            # one reference up instead of one per leaf: the pipeline holds at most
            # FANOUT of them, however many items (kept as they are if the store fails)
            index = await store_index(chunk.tenant, stored)
            stored = [index] if index is not None else stored
        return ChunkResult(
            items=[it for p in parts for it in p.items],
            usage=usage,
            succeeded=sum(p.succeeded for p in parts),
            cached=sum(p.cached for p in parts),
            parts=stored,
        )

    async def _split_all(self, chunk: ChunkInput, plan: Split) -> list[ChunkResult]:
        """Every child chunk of ``plan``, ``plan.at_once`` at a time; their results."""
        slots = asyncio.Semaphore(plan.at_once)
        info = workflow.info()

        async def child(k: int, part: range) -> ChunkResult:
            items = chunk.items[part.start : part.stop]
            sub = chunk.model_copy(
                update={
                    "items": items,
                    "allowance": share(chunk.allowance, len(items), len(chunk.items)),
                    "chunk_slots": plan.child_slots,
                }
            )
            async with slots:
                result: ChunkResult = await workflow.execute_child_workflow(
                    PipelineForEachWorkflow.run,
                    sub,
                    id=f"{info.workflow_id}/{k}",
                    task_queue=info.task_queue,
                    static_summary=(
                        f"{chunk.step_id} items {items[0].index}..{items[-1].index} "
                        f"({chunk.worker})"
                    ),
                    priority=info.priority,
                )
            self._done += len(result.items) + result.succeeded
            return result

        return list(
            await asyncio.gather(
                *(child(k, r) for k, r in enumerate(plan.ranges(len(chunk.items))))
            )
        )

    async def _split_tolerating(
        self, chunk: ChunkInput, plan: Split, tolerated: int
    ) -> list[ChunkResult]:
        """The child chunks of ``plan`` under a failure threshold (docs/foreach.md):
        each child may tolerate what is left of ``tolerated`` as it starts; once
        more items failed, no child starts (its items ``not_started``) and the
        running ones are asked to stop (a cancellation request: they cancel their
        items in flight and return what they did). A cancellation of this chunk
        does the same. Counted as each child ends, before its slot frees, from the
        results in this history. Written here because Temporal cancels a workflow,
        not a share of a step's items."""
        slots = asyncio.Semaphore(plan.at_once)
        info = workflow.info()
        failed = 0
        stopped = False
        running: set[str] = set()
        cancels: list[asyncio.Task[None]] = []

        def stop() -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                cancels.extend(asyncio.create_task(cancel_chunk(w)) for w in sorted(running))

        async def child(k: int, part: range) -> ChunkResult:
            nonlocal failed
            items = chunk.items[part.start : part.stop]
            async with slots:
                if stopped:
                    self._done += len(items)
                    return ChunkResult(
                        items=[ItemResult(index=i.index, status="not_started") for i in items]
                    )
                wid = f"{info.workflow_id}/{k}"
                handle = await workflow.start_child_workflow(
                    PipelineForEachWorkflow.run,
                    chunk.model_copy(
                        update={
                            "items": items,
                            "allowance": share(chunk.allowance, len(items), len(chunk.items)),
                            "chunk_slots": plan.child_slots,
                            "tolerated": tolerated - failed,
                        }
                    ),
                    id=wid,
                    task_queue=info.task_queue,
                    static_summary=(
                        f"{chunk.step_id} items {items[0].index}..{items[-1].index} "
                        f"({chunk.worker})"
                    ),
                    priority=info.priority,
                )
                running.add(wid)
                if stopped:  # passed while this child was starting
                    cancels.append(asyncio.create_task(cancel_chunk(wid)))
                try:
                    result = await handle
                finally:
                    running.discard(wid)
                self._done += len(result.items) + result.succeeded
                failed += sum(it.status == "failed" for it in result.items)
                if failed > tolerated:
                    stop()
                return result

        tasks = [
            asyncio.create_task(child(k, r)) for k, r in enumerate(plan.ranges(len(chunk.items)))
        ]
        try:
            await workflow.wait(tasks)
        except asyncio.CancelledError:
            # the pipeline (or the chunk above) stopped the step
            stop()
            await workflow.wait(tasks)
        if cancels:
            await workflow.wait(cancels)
        ranges = plan.ranges(len(chunk.items))
        return [
            ChunkResult(
                items=[
                    ItemResult(index=i.index, status="not_started")
                    for i in chunk.items[r.start : r.stop]
                ]
            )
            if t.cancelled()
            else t.result()
            for t, r in zip(tasks, ranges, strict=True)
        ]


async def cancel_chunk(workflow_id: str) -> None:
    """Ask a running chunk to stop (a Temporal cancellation request, for
    ``tolerated_failures``): it cancels its items in flight, starts no more and
    returns what they did. A chunk that ended meanwhile refuses the request: its
    result counts as it is."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).cancel()
    except FailureError:
        pass


__all__ = ["PipelineForEachWorkflow", "cancel_chunk"]
