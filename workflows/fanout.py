"""The for_each fan-out: a step's items in child workflows of ``chunk_size`` items.

Each item's input (and concurrency key) is resolved here, against the
pipeline's scope plus ``item`` and ``item_index``; an item that cannot be
resolved fails alone with ``invalid_input`` (``payload_too_large`` over the
size cap of one value). The caps (``RunConfig.caps``) hold first: a list over
``max_foreach_items`` fails the step before any item is resolved or any child
starts, and the list with every item's input counts against
``max_foreach_bytes``. The budget admits the whole step
once, for one call per item, and shares the reservation out to the chunks by
item count (:class:`ChunkAllowance`, with the pipeline's deadline). At most
``ceil(max_parallel / chunk_size)`` chunks run at once, each with at most
``min(max_parallel, chunk_size)`` items in flight
(``PipelineForEachWorkflow``), so no history grows with the list; an even
``max_parallel`` of 4 or more that one chunk would hold whole runs as two
chunks with half of it each.
:class:`FanOut` tallies the items as chunks finish. Over the plan's
``inline_items`` items the outputs go by reference (:mod:`workflows.items`):
the chunks store them, the parent keeps counts, the failed items up to
:data:`MAX_ITEM_ERRORS` and the parts' references, and ``outputs.items`` is an
``ItemsRef``. Deterministic code only.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.workflow import ChildWorkflowHandle

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.caps import SETTING_OF
    from aiworker.schemas.causes import ErrorCause, bounded, coded
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import (
        ChunkAllowance,
        ChunkInput,
        ChunkItem,
        ChunkResult,
        ItemResult,
        ItemsRef,
        Step,
        StepResult,
    )
    from aiworker.schemas.pipeline_check import tolerated_count
    from aiworker.schemas.protocol import ArtifactRef, Usage
    from aiworker.schemas.refs import (
        ReferenceError_,
        ReferenceLimitError,
        ResolvedSizeError,
        SizeBudget,
        resolve,
    )

from aiworker.workflows.chunks import leaves, share, split
from aiworker.workflows.foreach import PipelineForEachWorkflow, cancel_chunk
from aiworker.workflows.items import ItemsUnavailable, load_items
from aiworker.workflows.pipeline_limits import step_max_attempts
from aiworker.workflows.state import Ended, PipelineRun

# Failed items listed in a for_each step's outputs (the counts cover all).
MAX_ITEM_ERRORS = 20


@dataclass
class FanOut:
    """A for_each step's items as they finish: outputs by index (or, by reference,
    the stored parts), failures, usage."""

    total: int
    by_ref: bool = False  # outputs stored by the chunks: ``parts``, not ``results``
    results: list[Any] = field(default_factory=list)
    parts: list[ArtifactRef] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    failed: int = 0
    done: int = 0
    usage: Usage = field(default_factory=Usage)
    budget_hit: bool = False
    kept: int = 0  # items whose outputs a redrive kept from the earlier run
    cached: int = 0  # items the step cache answered
    # tolerated_failures: the failed items the step tolerates (None: no threshold),
    # and the items it stopped once more failed (cancelled in flight, never started)
    tolerated: int | None = None
    cancelled: int = 0
    not_started: int = 0

    @property
    def over(self) -> bool:
        """More items failed than the step tolerates."""
        return self.tolerated is not None and self.failed > self.tolerated

    def keep(self, index: int, outputs: Any) -> None:
        """Book an item a redrive does not run again: its earlier outputs (by
        reference: they stay in the earlier run's parts)."""
        if not self.by_ref:
            self.results[index] = outputs
        self.done += 1
        self.kept += 1

    def __post_init__(self) -> None:
        if not self.by_ref:
            self.results = [None] * self.total

    def item_failed(self, index: int, code: str | None, message: str | None) -> None:
        self.failed += 1
        if len(self.errors) < MAX_ITEM_ERRORS:
            self.errors.append({"index": index, "error_code": code, "message": message})

    def add(self, chunk: ChunkResult) -> None:
        """Book a finished chunk's items and usage (by reference: its parts and
        the count of its stored items; only failed items are listed)."""
        self.usage = self.usage + chunk.usage
        self.parts.extend(chunk.parts)
        self.done += chunk.succeeded
        self.cached += chunk.cached
        for it in chunk.items:
            self.done += 1
            self.cached += it.cached
            if it.status == "cancelled":
                self.cancelled += 1
                continue
            if it.status == "not_started":
                self.not_started += 1
                continue
            if it.status in names.OK_STATUSES:
                self.results[it.index] = it.outputs
                continue
            self.budget_hit = self.budget_hit or it.error_code == ErrorCode.BUDGET_EXCEEDED.value
            self.item_failed(it.index, it.error_code, it.error_message)

    def result(self, chunks: int, tolerated_failures: int | str | None = None) -> StepResult:
        """The step's result: ``partial`` when some items failed, ``failed`` when all did
        or (``tolerated_failures``) more than the step tolerates (``too_many_failures``)."""
        stopped = self.cancelled + self.not_started
        ok = self.total - self.failed - stopped
        errors = sorted(self.errors, key=lambda e: int(e["index"]))
        code: str | None
        if self.budget_hit:
            code = ErrorCode.BUDGET_EXCEEDED.value
        elif self.over:
            code = ErrorCode.TOO_MANY_FAILURES.value
        else:
            code = errors[0]["error_code"] if errors else None
        # the first failed items, as the step's cause (their outputs' `errors` has more)
        cause = [
            ErrorCause(code=e["error_code"], message=e["message"] or "failed", item=e["index"])
            for e in errors
        ]
        message = f"{self.failed} of {self.total} items failed"
        if self.over:
            message = (
                f"{self.failed} of {self.total} items failed, more than the {self.tolerated} "
                f"tolerated (tolerated_failures {tolerated_failures!r}): {ok} succeeded, "
                f"{self.cancelled} cancelled, {self.not_started} not started"
            )
        if errors:
            first = errors[0]
            message += f"; item {first['index']}: {coded(first['error_code'], first['message'])}"
        counts: dict[str, int] = {}
        if self.tolerated is not None:
            counts = {
                "cancelled": self.cancelled,
                "not_started": self.not_started,
                "tolerated": self.tolerated,
            }
        return StepResult(
            status="succeeded"
            if not self.failed
            else ("failed" if not ok or self.over else "partial"),
            attempts=chunks,
            error_code=code,
            error_message=message if self.failed else None,
            cause=bounded(cause),
            outputs={
                "items": (
                    ItemsRef(count=self.total, parts=self.parts).model_dump(mode="json")
                    if self.by_ref
                    else self.results
                ),
                "count": self.total,
                "succeeded": ok,
                "failed": self.failed,
                "errors": errors,
                **counts,
            },
            usage=self.usage,
            items={
                "total": self.total,
                "succeeded": ok,
                "failed": self.failed,
                **({"reused": self.kept} if self.kept else {}),
                **({"cached": self.cached} if self.cached else {}),
                **counts,
            },
            cached=bool(self.total) and self.cached == self.total,
        )


async def run_for_each(run: PipelineRun, step: Step) -> StepResult:
    """Run a for_each step's items in chunks; item failures are counted, not raised."""
    worker = run.workers[step.worker]
    # The list and every item's input share one budget: the step's whole input.
    total = run.size_budget("max_foreach_bytes")
    items = run.resolve(step, step.for_each, "for_each", budget=total)
    if isinstance(items, Ended):
        return items.result
    if not isinstance(items, list):
        return StepResult(
            status="failed",
            error_code=ErrorCode.INVALID_INPUT.value,
            error_message=(
                f"step {step.id!r}: field 'for_each': expected a list, got {type(items).__name__}"
            ),
        )
    cap = run.caps.max_foreach_items
    if len(items) > cap:
        # Refused before any item is resolved or any child starts.
        return StepResult(
            status="failed",
            error_code=ErrorCode.INVALID_INPUT.value,
            error_message=(
                f"step {step.id!r}: field 'for_each': {len(items)} items; the cap is {cap} "
                f"({SETTING_OF['max_foreach_items']})"
            ),
        )
    # A redrive runs again only the items that did not succeed before.
    kept: dict[int, Any] = {}
    old_parts: list[ArtifactRef] | None = None
    if run.redrive is not None:
        old_ref = run.redrive.previous_items_ref(step.id, len(items))
        if old_ref is not None:
            try:
                loaded = await load_items(run.tenant, old_ref)
            except ItemsUnavailable as e:
                return StepResult(
                    status="failed",
                    error_code=e.code,
                    error_message=f"step {step.id!r}: the earlier run's items: {e.message}",
                )
            kept = run.redrive.kept_items(step.id, len(items), loaded)
            old_parts = old_ref.parts
            del loaded
        else:
            kept = run.redrive.kept_items(step.id, len(items))
    # Over the plan's inline_items the outputs go by reference (a redrive keeps the
    # earlier run's way: its kept outputs are where that run left them).
    by_ref = old_parts is not None or (not kept and len(items) > run.inline_items)
    fan = FanOut(total=len(items), by_ref=by_ref)
    if step.tolerated_failures is not None:  # a share is of the step's whole item count
        fan.tolerated = tolerated_count(step.tolerated_failures, len(items))
    if by_ref and old_parts is not None:
        fan.parts = list(old_parts)  # applied first: this run's parts cover the rest
    for index, outputs in kept.items():
        fan.keep(index, outputs)
    if by_ref:
        kept = dict.fromkeys(kept)  # the indexes are enough; the outputs are stored
    if run.redrive is not None and kept:
        run.redrive.items_rerun[step.id] = [i for i in range(len(items)) if i not in kept]
    # The scope as the step starts: each chunk's items resolve against it again.
    scope = run.scope()
    try:
        resolved = _check_items(
            step, scope, items, fan, total, run.caps.max_resolved_bytes, skip=kept.keys()
        )
    except ResolvedSizeError as e:
        return run.over_cap(step, "input", e).result
    if not fan.total:
        return StepResult(
            status="succeeded",
            outputs={"items": [], "count": 0, "succeeded": 0, "failed": 0, "errors": []},
            items={"total": 0, "succeeded": 0, "failed": 0},
        )
    # One reservation for the whole step, shared out to chunks by item count.
    admission = run.admit(worker, step.timeout_seconds, calls=len(resolved))
    if isinstance(admission, Ended):
        return admission.result
    limits = run.limits.for_worker(worker, step)
    # What every chunk of the step shares; each chunk adds its items and budget share.
    template = ChunkInput(
        step_id=step.id,
        worker=worker.worker_id,
        key_prefix=f"{run.key_base}/{step.id}",
        tenant=run.tenant,
        trace_id=run.trace_id,
        queue_suffix=run.queue_suffix,
        items=[],
        max_parallel=min(step.max_parallel, step.chunk_size),
        timeout_seconds=step.timeout_seconds,
        max_attempts=step_max_attempts(step),
        cache=step.cache,
        rate_limited=limits.rate_limited,
        concurrency_limit=step.concurrency.limit if step.concurrency else None,
        lease_seconds=limits.lease_seconds,
        local=run.limits.is_local(worker.worker_id),
        items_per_task=step.items_per_task,
        store_outputs=by_ref,
        spec=worker,  # the run's spec of its worker: chunks never read a catalog
    )
    at_once = math.ceil(step.max_parallel / step.chunk_size)  # leaf chunks, the whole step
    parallel = template.max_parallel
    if (
        at_once == 1
        and step.max_parallel >= 4
        and step.max_parallel % 2 == 0
        and leaves(len(resolved), step.chunk_size) > 1
    ):
        # Two leaf chunks with half the parallelism each: one's start and end (its
        # last items, its result, the next chunk's start) overlap the other's work.
        at_once, parallel = 2, step.max_parallel // 2
    # more leaf chunks than one workflow's children: groups of chunks (a tree)
    plan = split(len(resolved), step.chunk_size, at_once)
    template = template.model_copy(
        update={
            "chunk_size": step.chunk_size,
            "chunk_slots": plan.child_slots,
            "max_parallel": parallel,
        }
    )
    chunks = [resolved[r.start : r.stop] for r in plan.ranges(len(resolved))]
    slots = asyncio.Semaphore(plan.at_once)
    info = workflow.info()
    whole = ChunkAllowance(
        max_tokens=admission.max_tokens,
        max_external_calls=admission.max_external_calls,
        deadline=run.ledger.deadline,
        max_cost_usd=admission.cost_usd,
    )

    # tolerated_failures: the running chunks' handles, to cancel once too many failed
    running: dict[int, ChildWorkflowHandle[Any, ChunkResult]] = {}
    cancels: list[asyncio.Task[None]] = []

    def book(result: ChunkResult) -> None:
        """Count a chunk's items as it ends, before its slot frees (a chunk waiting
        for the slot must see these failures); once over the threshold, cancel the
        running chunks."""
        was_over = fan.over
        fan.add(result)
        if fan.over and not was_over:
            cancels.extend(asyncio.create_task(cancel_chunk(h.id)) for h in running.values())

    async def run_chunk(k: int, chunk: list[int]) -> ChunkResult | None:
        async with slots:
            extra: dict[str, Any] = {}
            if fan.tolerated is not None:
                if fan.over:  # the threshold was passed: the chunk never starts
                    book(
                        ChunkResult(
                            items=[ItemResult(index=i, status="not_started") for i in chunk]
                        )
                    )
                    return None
                extra["tolerated"] = fan.tolerated - fan.failed
            handle = await workflow.start_child_workflow(
                PipelineForEachWorkflow.run,
                template.model_copy(
                    update={
                        # resolved as the chunk starts, within the caps they passed above
                        "items": _chunk_items(step, scope, items, chunk, run),
                        "allowance": share(whole, len(chunk), len(resolved)),
                        **extra,
                    }
                ),
                id=f"{info.workflow_id}/{step.id}/{k}",
                task_queue=info.task_queue,
                static_summary=f"{step.id} items {chunk[0]}..{chunk[-1]} ({step.worker})",
                priority=run.priority,
            )
            if fan.tolerated is None:
                return await handle
            running[k] = handle
            if fan.over:  # passed while this chunk was starting
                cancels.append(asyncio.create_task(cancel_chunk(handle.id)))
            try:
                result = await handle
            finally:
                del running[k]
            book(result)
            return None

    tasks = [asyncio.create_task(run_chunk(k, c)) for k, c in enumerate(chunks)]
    try:
        while tasks:
            finished, _pending = await workflow.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in finished:
                if (booked := t.result()) is not None:  # tolerated_failures: booked already
                    fan.add(booked)
            # A finished task holds its chunk's whole decoded result (a model per item):
            # dropped once booked, so the parent keeps only the items' outputs, not
            # every chunk's result until the step ends (worker memory flat in the items).
            tasks = [t for t in tasks if t not in finished]
            run.steps[step.id] = run.steps[step.id].model_copy(
                update={"items": {"total": fan.total, "done": fan.done, "failed": fan.failed}}
            )
        if cancels:
            await workflow.wait(cancels)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        run.ledger.settle(admission, fan.usage)
    if fan.budget_hit:
        run.terminal = "budget_exhausted"
    return fan.result(chunks=len(chunks), tolerated_failures=step.tolerated_failures)


def _check_items(
    step: Step,
    scope: dict[str, Any],
    items: list[Any],
    fan: FanOut,
    total: SizeBudget,
    one: int,
    skip: Collection[int] = (),
) -> list[int]:
    """The indexes of the items whose input (and concurrency key) resolves, but
    those in ``skip``; an item that cannot be resolved, or resolves over a cap,
    fails alone. The resolved inputs are not kept (each chunk's are resolved
    again as it starts: :func:`_chunk_items`), so no list of every item's input
    lives in the parent.

    Raises:
        ResolvedSizeError: the items together passed ``total``: the step fails.
    """
    ok: list[int] = []
    for i, item in enumerate(items):
        if i in skip:
            continue
        try:
            _resolve_item(step, scope, item, i, total.part(one))
            ok.append(i)
        except ResolvedSizeError as e:
            if total.used > total.max_bytes:
                raise
            fan.item_failed(i, e.code, str(e))
        except ReferenceLimitError as e:
            fan.item_failed(i, e.code, str(e))
        except ReferenceError_ as e:
            fan.item_failed(i, ErrorCode.INVALID_INPUT.value, str(e))
    return ok


def _chunk_items(
    step: Step, scope: dict[str, Any], items: list[Any], indexes: list[int], run: PipelineRun
) -> list[ChunkItem]:
    """The items at ``indexes``, resolved again (:func:`_check_items` passed them
    within the same caps, so none fails here)."""
    total = run.size_budget("max_foreach_bytes")
    one = run.caps.max_resolved_bytes
    return [_resolve_item(step, scope, items[i], i, total.part(one)) for i in indexes]


def _resolve_item(
    step: Step, scope: dict[str, Any], item: Any, index: int, budget: SizeBudget
) -> ChunkItem:
    """One item's input and concurrency key, against the pipeline's scope."""
    item_scope = scope | {"item": item, "item_index": index}
    item_input = resolve(step.input, item_scope, budget=budget)
    key = None
    if step.concurrency is not None:
        key = str(resolve(step.concurrency.key, item_scope, budget=budget))
    return ChunkItem(index=index, input=item_input, concurrency_key=key)
