"""``EvalWorkflow``: one eval run, every dataset item called through the candidate.

Each item is one activity (Temporal retries inside it, under the candidate's
spec: its timeout, retry policy and non-retryable codes): the ``eval-call``
activity for a candidate given as a prompt spec, or the worker's own activity on
another task queue for a version other processes serve. At most
``concurrency`` items run at once. The run is resumable because it is a
workflow: a worker process killed mid-run leaves the ended items' results in
the history, and the process that picks the run up again replays them and
calls only the items that had not ended (an item in flight when the process
died is that activity's next attempt, not a second call).

The eval's budget (``max_cost_usd``) is kept here, not with the pipeline's
ledger (workflows/budget.py), because an eval has no deadline, no steps and no
reservations to share: items stop starting once the calls that ended cost the
budget or more (an item refused is ``skipped`` with ``budget_exceeded``); the
calls in flight may pass it by at most ``concurrency`` calls. An optional judge
(an ``llm-call`` with a rubric and a response schema) grades each output that
came back; a judge that fails or answers off its schema is that item's judge
error and nothing else.

The workflow never scores: it returns what each call answered, and the client
scores against the dataset (workers/evals/report.py). No eval item is a
pipeline step, so nothing an eval produces reaches a sink.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.evals import (
        EvalCall,
        EvalInput,
        EvalItem,
        EvalItemResult,
        EvalResult,
    )
    from aiworker.schemas.options import activity_options
    from aiworker.schemas.protocol import Usage, WorkerRequest, WorkerResponse

from aiworker.workflows.calls import error_code_of, error_details, failure_text


@workflow.defn(name=names.EVAL_WORKFLOW)
class EvalWorkflow:
    """Calls every item of an eval through its candidate; returns what each answered."""

    def __init__(self) -> None:
        self._results: dict[int, EvalItemResult] = {}
        self._total = 0
        self._spent = 0.0

    @workflow.query(name=names.EVAL_PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        """How many items have ended, of how many; what they cost so far."""
        return {"ended": len(self._results), "total": self._total, "spent_usd": self._spent}

    @workflow.run
    async def run(self, inp: EvalInput) -> EvalResult:
        """Run every item (at most ``inp.concurrency`` at once) and return their results."""
        self._total = len(inp.items)
        queue: list[int] = list(range(len(inp.items)))
        queue.reverse()

        async def lane() -> None:
            while queue:
                i = queue.pop()
                self._results[i] = await self._item(inp, inp.items[i])

        lanes = min(inp.concurrency, len(inp.items))
        await asyncio.gather(*(lane() for _ in range(lanes)))
        return EvalResult(
            items=[self._results[i] for i in range(len(inp.items))], spent_usd=self._spent
        )

    async def _item(self, inp: EvalInput, item: EvalItem) -> EvalItemResult:
        if inp.max_cost_usd is not None and self._spent >= inp.max_cost_usd:
            return EvalItemResult(
                id=item.id,
                status="skipped",
                error_code=ErrorCode.BUDGET_EXCEEDED.value,
                error_message=f"the eval's budget of ${inp.max_cost_usd:g} was spent "
                "before this item started",
            )
        result = await self._call(inp, item)
        self._spent += float(result.usage.cost_usd)
        if inp.judge is not None and result.outputs is not None and result.status != "failed":
            judge = await self._judge(inp, item, result.outputs)
            result = result.model_copy(update={"judge": judge})
        return result

    async def _call(self, inp: EvalInput, item: EvalItem) -> EvalItemResult:
        cand = inp.candidate
        spec = cand.spec
        request = WorkerRequest(
            worker_id=spec.worker_id,
            version=spec.version,
            idempotency_key=f"{workflow.info().workflow_id}/{item.id}",
            step_id="eval",
            tenant=item.tenant,
            input={**item.input, **cand.input_overrides},
        )
        options = activity_options(spec, queue_suffix=inp.queue_suffix)
        if cand.mode == "queue" and cand.task_queue:
            options["task_queue"] = cand.task_queue + inp.queue_suffix
        try:
            if cand.mode == "spec":
                response = await workflow.execute_activity(
                    names.EVAL_CALL,
                    EvalCall(spec=spec, request=request.model_dump(mode="json")),
                    result_type=WorkerResponse,
                    summary=f"eval {item.id}",
                    **options,
                )
            else:
                response = await workflow.execute_activity(
                    spec.worker_id,
                    request,
                    result_type=WorkerResponse,
                    summary=f"eval {item.id}",
                    **options,
                )
        except ActivityError as e:
            details = error_details(e)
            raw_usage = details.get("usage")
            usage = Usage.model_validate(raw_usage) if isinstance(raw_usage, dict) else Usage()
            return EvalItemResult(
                id=item.id,
                status="failed",
                error_code=error_code_of(e),
                error_message=failure_text(e.cause or e),
                error_field=field if isinstance(field := details.get("field"), str) else None,
                usage=usage,
                attempts=_attempt(details),
            )
        return EvalItemResult(
            id=item.id,
            status=response.status,
            outputs=response.outputs,
            usage=response.usage,
            duration_ms=response.observability.duration_ms,
            attempts=response.observability.attempt,
        )

    async def _judge(
        self, inp: EvalInput, item: EvalItem, outputs: dict[str, Any]
    ) -> dict[str, Any]:
        judge, spec = inp.judge, inp.judge_spec
        if judge is None or spec is None:
            return {"error_code": ErrorCode.INVALID_INPUT.value, "error_message": "no judge spec"}
        shown = json.dumps({"input": item.input, "output": outputs}, sort_keys=True)
        request = WorkerRequest(
            worker_id=spec.worker_id,
            version=spec.version,
            idempotency_key=f"{workflow.info().workflow_id}/{item.id}/judge",
            step_id="eval-judge",
            tenant=item.tenant,
            input={
                "system": judge.rubric,
                "messages": [{"role": "user", "content": shown}],
                "model": judge.model,
                "response_schema": judge.response_schema,
                "max_tokens": judge.max_tokens,
                "temperature": 0,
            },
        )
        try:
            response = await workflow.execute_activity(
                spec.worker_id,
                request,
                result_type=WorkerResponse,
                summary=f"judge {item.id}",
                **activity_options(spec, queue_suffix=inp.queue_suffix),
            )
        except ActivityError as e:
            return {"error_code": error_code_of(e), "error_message": failure_text(e.cause or e)}
        self._spent += float(response.usage.cost_usd)
        # llm-call's outputs carry the structured answer under "json"
        raw = response.outputs.get("json")
        answer = raw if isinstance(raw, dict) else response.outputs
        verdict = answer.get(judge.pass_field)
        if not isinstance(verdict, bool):
            return {
                "error_code": ErrorCode.INVALID_OUTPUT.value,
                "error_message": f"the judge's answer has no boolean {judge.pass_field!r}",
                "answer": answer,
            }
        return {
            "passed": verdict,
            "answer": answer,
            "usage": response.usage.model_dump(mode="json"),
        }


def _attempt(details: dict[str, Any]) -> int:
    context = details.get("context")
    attempt = context.get("attempt") if isinstance(context, dict) else None
    return attempt if isinstance(attempt, int) else 0


__all__ = ["EvalWorkflow"]
