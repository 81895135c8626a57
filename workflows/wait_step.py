"""The ``wait`` step: its tokens (the ``callback-tokens`` local activity), then
its callbacks (:class:`~aiworker.workflows.callbacks.CallbackDesk`), and its result,
shaped as any step's (a for_each wait's as any for_each's). Deterministic code only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.callbacks import CALLBACK_FAILED, MAX_WAIT_ITEMS, TokenCall, TokenGrant
    from aiworker.schemas.causes import ErrorCause
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import Step, StepResult

from aiworker.workflows.callbacks import Slot
from aiworker.workflows.state import Ended, PipelineRun

# A reviewer may send a wait step back this many times (as workflows.steps does a worker's).
MAX_REVIEW_ROUNDS = 3
# How a failed step is escalated (workflows.steps.review_step): the step, its failure and
# the contracts approved outputs must meet -> its result, or None for a retry.
Review = Callable[
    [PipelineRun, Step, StepResult, list[tuple[str, Any]]], Awaitable[StepResult | None]
]


async def run_wait(run: PipelineRun, step: Step, review: Review) -> StepResult:
    """A wait step, after its preflight: its tokens, then its callbacks (then, failed
    with ``on_failure: escalate``, review)."""
    wait = step.wait
    if wait is None:  # the step runner sends only wait steps here
        return StepResult(status="failed", error_code=ErrorCode.INTERNAL.value)
    count, listed = 1, step.for_each is not None
    if step.for_each is not None:
        items = run.resolve(step, step.for_each, "for_each")
        if isinstance(items, Ended):
            return items.result
        if not isinstance(items, list) or len(items) > MAX_WAIT_ITEMS:
            what = "not a list" if not isinstance(items, list) else f"{len(items)} items"
            return StepResult(
                status="failed",
                error_code=ErrorCode.INVALID_INPUT.value,
                error_message=(
                    f"step {step.id!r}: field 'for_each': {what} (a wait step waits for a "
                    f"list of at most {MAX_WAIT_ITEMS})"
                ),
            )
        count = len(items)
        if not items:
            return _listed_result([])
    grant: TokenGrant = await workflow.execute_local_activity(
        names.CALLBACK_TOKENS,
        TokenCall(count=count),
        result_type=TokenGrant,
        summary=f"{step.id}: {count} callback token{'s' if count > 1 else ''}",
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=2)),
    )
    desk = run.board.callbacks
    slots = desk.open(step, grant, listed)
    run.steps[step.id] = StepResult(
        status="waiting", items={"total": count, "done": 0} if listed else None
    )
    await desk.wait_all(slots, step.id)
    if listed:
        return _listed_result(slots)
    result = _slot_result(step, slots[0])
    if step.on_failure != "escalate":
        return result
    # Escalated as any failed step: approve (outputs checked against wait.schema),
    # reject, or retry: the same token waits again, for timeout_seconds from now.
    contracts = [("wait.schema", wait.schema_)]
    for _ in range(MAX_REVIEW_ROUNDS):
        if result.ok or run.terminal is not None:
            return result
        reviewed = await review(run, step, result, contracts)
        if reviewed is not None:
            return reviewed
        desk.reopen(slots[0])
        run.steps[step.id] = StepResult(status="waiting")
        await desk.wait_all(slots, step.id)
        result = _slot_result(step, slots[0])
    return result


def _slot_error(slot: Slot) -> tuple[str, str]:
    if slot.state == "failed":
        return CALLBACK_FAILED, f"the callback failed: {slot.message}"
    return ErrorCode.TIMEOUT.value, f"no callback within {slot.timeout_seconds:g}s"


def _slot_result(step: Step, slot: Slot) -> StepResult:
    if slot.state == "completed":
        return StepResult(status="succeeded", outputs=slot.outputs)
    code, message = _slot_error(slot)
    return StepResult(
        status="failed", error_code=code, error_message=f"step {step.id!r}: {message}"
    )


def _listed_result(slots: list[Slot]) -> StepResult:
    """A for_each wait's result, shaped as any for_each step's (``outputs.items``)."""
    failures = [(i, *_slot_error(s)) for i, s in enumerate(slots) if s.state != "completed"]
    errors = [{"index": i, "error_code": c, "message": m} for i, c, m in failures]
    total, failed = len(slots), len(failures)
    ok = total - failed
    message = None
    if failures:
        first_i, _, first_m = failures[0]
        message = f"{failed} of {total} items failed; item {first_i}: {first_m}"
    return StepResult(
        status="succeeded" if not failed else ("failed" if not ok else "partial"),
        error_code=failures[0][1] if failures else None,
        error_message=message,
        cause=[ErrorCause(code=c, message=m, item=i) for i, c, m in failures[:10]],
        outputs={
            "items": [s.outputs if s.state == "completed" else None for s in slots],
            "count": total,
            "succeeded": ok,
            "failed": failed,
            "errors": errors,
        },
        items={"total": total, "succeeded": ok, "failed": failed},
    )
