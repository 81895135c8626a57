"""The step runner: one step of a pipeline, from its preflight to its result.

    preflight (dependencies; lists held by reference loaded; gate, ``when``)
                                              -> skipped | blocked
    for_each                                  -> the fan-out (``fanout``)
    else, per review round (counted):
      attempt: call -> validate -> call again with the reasons as feedback,
               up to ``validate.max_attempts`` -> the ``fallback`` worker
      failed and ``on_failure: escalate``     -> review: approve | reject | retry

Every call goes through :func:`~aiworker.workflows.governed.governed_call`:
it waits for its limits (``pipeline_limits``), is admitted by the budget
ledger, runs, gives its leases back and is settled. A step that ends early
(skipped, blocked, refused by the budget or a limit) comes back as an :class:`Ended` value, never an
exception; a step that ends the whole run says so in ``PipelineRun.terminal``.
Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names, safe_schema
    from aiworker.schemas.agent import ends_pipeline
    from aiworker.schemas.causes import coded, with_reasons
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import AcquireCall
    from aiworker.schemas.pipeline import Step, StepResult, Validation, step_values
    from aiworker.schemas.refs import ReferenceError_, ReferenceLimitError, resolve
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.agent_step import run_agent
from aiworker.workflows.budget import Admission
from aiworker.workflows.calls import (
    CallContext,
    WorkerCall,
    call_worker,
    external_wait,
    with_feedback,
)
from aiworker.workflows.fanout import run_for_each
from aiworker.workflows.governed import Governance, Refused, governed_call
from aiworker.workflows.pipeline_limits import step_max_attempts
from aiworker.workflows.state import Ended, PipelineRun, ms_since, now
from aiworker.workflows.tally import Tally, after_primary, gate_verdict
from aiworker.workflows.wait_step import run_wait

# A reviewer may send a step back this many times; then the step fails.
MAX_REVIEW_ROUNDS = 3
# A worker that rejects its own output (an LLM reply failing its schema) gets the
# same second chance as a validator's verdict.
_FEEDBACK_CODES = (ErrorCode.INVALID_OUTPUT.value, ErrorCode.VALIDATION_FAILED.value)


async def run_step(run: PipelineRun, step: Step) -> StepResult:
    """Run ``step`` to its result, with its duration."""
    start = workflow.now()
    ended = preflight_deps(run, step)
    if ended is None:  # first load any list held by reference that its references read
        failed = await run.materialize(step_values(step), "input")
        ended = Ended(failed) if failed is not None else preflight(run, step)
    if ended is not None:
        result = ended.result
    elif step.wait is not None:
        result = await run_wait(run, step, review_step)
    elif step.for_each is not None:
        result = await run_for_each(run, step)
    else:
        worker = run.workers[step.worker]
        step_input = run.resolve(step, step.input, "input")
        if isinstance(step_input, Ended):
            result = step_input.result
        else:
            result = await StepRunner(run, step, worker, step_input).execute()
    return result.model_copy(update={"duration_ms": ms_since(start)})


def preflight_deps(run: PipelineRun, step: Step) -> Ended | None:
    """Dependencies: how the step ends if one did not succeed."""
    for dep in step.depends_on:
        st = run.steps[dep].status
        if st not in names.OK_STATUSES and step.worker != names.AGGREGATOR:
            return Ended(
                StepResult(status="skipped", error_message=f"dependency {dep!r} ended {st}")
            )
    return None


def preflight(run: PipelineRun, step: Step) -> Ended | None:
    """Gate and ``when`` (after :func:`preflight_deps`): how the step ends if it must not run."""
    if step.gate is not None:
        blocked = gate_verdict(step.gate, run.steps[step.gate])
        if blocked is not None:
            return blocked
    if step.when is not None:
        try:
            value = resolve(step.when["value"], run.scope(), budget=run.size_budget())
        except ReferenceLimitError as e:
            return run.over_cap(step, "when", e)
        except ReferenceError_ as e:
            return Ended(
                StepResult(status="skipped", error_message=f"when: value unavailable: {e}")
            )
        try:
            # RE2 patterns, no retrieval: safe inside a workflow task
            matches = safe_schema.is_valid(step.when["schema"], value)
        except safe_schema.SchemaError as e:
            return Ended(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.INVALID_INPUT.value,
                    error_message=(
                        f"step {step.id!r}: field 'when.schema': {safe_schema.problem(e)}"
                    ),
                )
            )
        if not matches:
            return Ended(StepResult(status="skipped", error_message="when: value does not match"))
    return None


@dataclass
class StepRunner:
    """One step with a single worker call (no for_each) and its resolved input."""

    run: PipelineRun
    step: Step
    worker: WorkerSpec
    step_input: dict[str, Any]

    async def execute(self) -> StepResult:
        """The bounded loop, once per review round."""
        result = StepResult(status="failed")
        for review_round in range(MAX_REVIEW_ROUNDS + 1):
            # a retried step keeps what its earlier rounds went through
            attempt = await self.attempt(review_round, Tally(causes=list(result.cause)))
            if isinstance(attempt, Ended):
                return attempt.result
            result = attempt
            if result.ok or self.run.terminal is not None:
                return result
            if self.step.on_failure != "escalate" or review_round == MAX_REVIEW_ROUNDS:
                return result
            reviewed = await self.review(result)
            if reviewed is not None:
                return reviewed
            self.run.steps[self.step.id] = result.model_copy(update={"status": "running"})
        return result

    def progress(self, tally: Tally, in_flight: int = 1) -> None:
        """Show the step's attempts and validations in ``progress`` as they happen."""
        self.run.steps[self.step.id] = tally.running(in_flight)

    async def attempt(self, review_round: int, tally: Tally) -> StepResult | Ended:
        """run -> validate -> feed back reasons, up to max_attempts -> fallback."""
        step, v = self.step, self.step.validate_
        base = f"{self.run.key_base}/{step.id}"
        if review_round:
            base += f"#review-{review_round}"
        loops = v.max_attempts if v is not None else 1
        worker_id = self.worker.worker_id
        last: StepResult | None = None
        current = self.step_input
        for n in range(loops):
            key = base if n == 0 else f"{base}#attempt-{n + 1}"
            label = f"{step.id} ({worker_id})"
            self.progress(tally)
            result = await self.call(self.worker, key, current, label)
            if isinstance(result, Ended):
                return tally.ended(result, worker_id)
            tally.add(result)
            if not result.ok or self.run.terminal is not None:
                last = result
                if not result.ok:
                    tally.failed_try(result, worker_id, n + 1)
                if (
                    v is not None
                    and self.run.terminal is None
                    and result.error_code in _FEEDBACK_CODES
                    and result.reasons
                ):
                    current = with_feedback(self.step_input, v.feedback_field, result.reasons)
                    continue
                break
            if v is None:
                return tally.succeeded(result)
            rejected = f"validation attempt {n + 1} of {loops} failed"
            self.progress(tally, in_flight=0)
            rejection = await self.validate(v, result, f"{key}#validate", tally, rejected)
            if rejection is None:
                return tally.succeeded(result)
            tally.failed_try(rejection, worker_id, n + 1)
            last = rejection
            current = with_feedback(self.step_input, v.feedback_field, rejection.reasons)
        if step.fallback is not None and self.run.terminal is None:
            result = await self.fallback(step.fallback, base, tally)
            if isinstance(result, Ended):
                return tally.ended(result, step.fallback)
            if result.ok:
                return tally.succeeded(result).model_copy(update={"fallback_used": True})
            last = after_primary(step.fallback, result, worker_id, last)
        fallback_used = step.fallback is not None and self.run.terminal is None
        failed = tally.failed(last, fallback_used)
        if self.worker.kind == "workflow" and step.fallback is None and last is not None:
            # an agent stopped by a bound keeps its transcript so far in its outputs
            failed = failed.model_copy(update={"outputs": last.outputs})
        return failed

    async def fallback(self, worker_id: str, base: str, tally: Tally) -> StepResult | Ended:
        """The fallback worker's call (validated like the step's own), once."""
        step = self.step
        fb = self.run.workers[worker_id]
        fb_input: Any = self.step_input
        if step.fallback_input is not None:
            fb_input = self.run.resolve(step, step.fallback_input, "fallback_input")
            if isinstance(fb_input, Ended):
                return fb_input
        label = f"{step.id} fallback ({fb.worker_id})"
        self.progress(tally)
        result = await self.call(fb, f"{base}#fallback", fb_input, label)
        if isinstance(result, Ended):
            return result
        tally.add(result)
        if result.ok and step.validate_ is not None:
            rejected = "its output failed validation"
            key = f"{base}#fallback#validate"
            self.progress(tally, in_flight=0)
            rejection = await self.validate(step.validate_, result, key, tally, rejected)
            if rejection is not None:
                result = rejection
        if not result.ok:
            tally.failed_try(result, fb.worker_id, None, fallback=True)
        return result

    async def validate(
        self,
        v: Validation,
        call: StepResult,
        key: str,
        tally: Tally,
        rejected: str,
    ) -> StepResult | None:
        """Run the validator on a call's outputs: None if they pass, else the failure
        with the validator's reasons and ``rejected`` with the first reason as its
        message (the validator's own error when it failed itself)."""
        tally.validations += 1
        check = WorkerCall(
            self.run.workers[names.VALIDATOR],
            key=key,
            input={"data": call.outputs, "schema": v.schema_},
            context=self.context(),
            summary=f"{self.step.id} validate ({names.VALIDATOR})",
            local=self.run.limits.is_local(names.VALIDATOR),
        )
        # no permits, no budget: the validator checks, it spends nothing
        verdict = await governed_call(check, Governance())
        if isinstance(verdict, Refused):  # nothing to refuse without limits or a ledger
            return self.refused(verdict).result
        found = verdict.outputs if isinstance(verdict.outputs, dict) else {}
        if verdict.ok and found.get("valid"):
            return None
        reasons = list(found.get("errors") or verdict.reasons)
        return StepResult(
            status="failed",
            outputs=call.outputs,
            error_code=ErrorCode.VALIDATION_FAILED.value,
            error_message=(
                with_reasons(rejected, reasons)
                if verdict.ok
                else f"{rejected}: the validator failed: "
                f"{coded(verdict.error_code, verdict.error_message)}"
            ),
            reasons=reasons,
        )

    def context(self) -> CallContext:
        run = self.run
        return CallContext(
            tenant=run.tenant,
            trace_id=run.trace_id,
            step_id=self.step.id,
            queue_suffix=run.queue_suffix,
            priority=run.priority,
        )

    async def call(
        self, worker: WorkerSpec, key: str, step_input: dict[str, Any], label: str
    ) -> StepResult | Ended:
        """One worker call through :func:`~aiworker.workflows.governed.governed_call`:
        its limits, the budget's admission, the call (an llm-agent's child workflow),
        release, settlement."""
        run, step = self.run, self.step
        asks = self.limits(worker)
        if isinstance(asks, Ended):
            return asks
        call = WorkerCall(
            worker,
            key=key,
            input=step_input,
            context=self.context(),
            summary=label,
            timeout_seconds=step.timeout_seconds,
            max_attempts=step_max_attempts(step),
            cache=step.cache,
            local=run.limits.is_local(worker.worker_id),
        )
        gov = Governance(
            ledger=run.ledger,
            permits=run.limits.permits,
            asks=lambda: asks,
            deadline=run.limits.deadline,
            who=step.id,
        )
        result = await governed_call(call, gov, lambda admission: self.invoke(call, admission))
        if isinstance(result, Refused):
            return self.refused(result)
        if ends_pipeline(result):
            run.terminal = "budget_exhausted"
        return result

    async def invoke(self, call: WorkerCall, admission: Admission | None) -> StepResult:
        """The call itself, an external worker's wait shown in ``progress`` meanwhile."""
        run, step, worker = self.run, self.step, call.worker
        wait = external_wait(worker, admission, run.queue_suffix, now())
        if wait is not None:
            run.board.external[step.id] = wait
        try:
            if worker.kind == "workflow" and admission is not None:
                # llm-agent: its turns and tool calls in a child
                return await run_agent(
                    call,
                    admission,
                    specs=run.workers,
                    child_id=workflow.info().workflow_id + call.key[len(run.key_base) :],
                    deadline=run.ledger.deadline,
                    limits=run.limits.for_agent(),
                )
            return await call_worker(call, admission)
        finally:
            run.board.external.pop(step.id, None)

    def refused(self, refused: Refused) -> Ended:
        """A call that did not run, as the step's end."""
        if refused.kind == "budget":
            return self.run.budget_exhausted(refused.resource, refused.message)
        return Ended(
            StepResult(
                status="failed",
                error_code=ErrorCode.RATE_LIMITED.value,
                error_message=f"step {self.step.id!r}: {refused.message}",
            )
        )

    def limits(self, worker: WorkerSpec) -> list[AcquireCall] | Ended:
        """What the call waits for: the worker's per-tenant rate limit and the step's
        concurrency key (resolved here; a key that cannot be ends the step)."""
        run, step = self.run, self.step
        ticket = run.limits.ticket(step.id)
        key: str | None = None
        if step.concurrency is not None:
            resolved = run.resolve(step, step.concurrency.key, "concurrency.key")
            if isinstance(resolved, Ended):
                return resolved
            key = str(resolved)
        limits = run.limits.for_worker(worker, step, key)
        return limits.calls(ticket, rate_suffix="/rate")

    async def review(self, result: StepResult) -> StepResult | None:
        """Escalate a failed step to a human: the step's result after the decision,
        or None to run it again (``retry``)."""
        # corrected outputs must meet the worker's own contract and the step's
        contracts: list[tuple[str, Any]] = [
            (f"{self.worker.worker_id} output_schema", self.worker.output_schema)
        ]
        if self.step.validate_ is not None:
            contracts.append(("validate.schema", self.step.validate_.schema_))
        return await review_step(self.run, self.step, result, contracts)


async def review_step(
    run: PipelineRun, step: Step, result: StepResult, contracts: list[tuple[str, Any]]
) -> StepResult | None:
    """Escalate ``step``, failed with ``result``, to a human; approved outputs must meet
    ``contracts``. The step's result after the decision, or None to run it again."""
    board = run.board
    board.desk.open(step.id, contracts, has_outputs=result.outputs is not None)
    run.steps[step.id] = result.model_copy(update={"status": "awaiting_review"})
    board.set_status("awaiting_review")
    try:
        decided = await board.desk.wait(step.id, step.review_timeout_seconds)
    finally:
        # also on cancellation: the status upsert is part of the recorded history
        if not board.desk.awaiting and board.status == "awaiting_review":
            board.set_status("running")
    if decided is None:
        run.terminal = "escalation_timed_out"
        return result.model_copy(
            update={
                "status": "escalation_timed_out",
                "error_message": (
                    f"no review within {step.review_timeout_seconds:g}s; "
                    f"last error: {result.error_message}"
                ),
            }
        )
    decision, review = decided.decision, decided.record()
    if decision.decision == "approve":
        outputs = decision.outputs if decision.outputs is not None else result.outputs
        # Succeeded by approval: no error of its own any more; what was
        # approved over stays the newest entry of its cause.
        return result.model_copy(
            update={
                "status": "succeeded",
                "outputs": outputs,
                "review": review,
                "error_code": None,
                "error_message": None,
                "reasons": [],
            }
        )
    if decision.decision == "reject":
        run.terminal = "rejected"
        said = f"rejected in review by {review['reviewer']}"
        if decision.note:
            said += f": {decision.note}"
        message = f"{said}; the step had failed with {result.error_code}"
        return result.model_copy(
            update={"status": "rejected", "review": review, "error_message": message}
        )
    return None
