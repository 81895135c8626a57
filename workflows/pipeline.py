"""``PipelineWorkflow``: runs a pipeline spec as a DAG of worker calls.

The spec arrives as plain JSON and is checked whole before the first step
runs; a bad spec fails the workflow with a non-retryable ``invalid_input``
naming the step and field. Then, step by step as dependencies finish:

- ``when`` false -> ``skipped``; a ``gate`` whose validator did not pass ->
  ``blocked`` with ``validation_failed`` and the validator's reasons.
- The budget ledger admits the step or refuses it with ``budget_exceeded``
  before anything is scheduled (the pipeline ends ``budget_exhausted``).
- A single step runs the bounded loop: run -> validate (the ``validator``
  worker) -> run again with the reasons in ``feedback`` ... up to
  ``validate.max_attempts`` -> the ``fallback`` worker -> ``on_failure``.
- ``escalate`` waits for the ``review`` Workflow Update (approve, reject,
  retry) until ``review_timeout_seconds``; no answer ends the pipeline
  ``escalation_timed_out``. Review rounds are counted too.
- A ``for_each`` step runs its items in child workflows of ``chunk_size``
  items (``workflows.foreach``), so histories stay bounded.
- ``resume_from`` (set by ``aiworker redrive``) reuses the outputs of steps
  that succeeded in an earlier run and keeps that run's idempotency keys.

Every status change is upserted to the ``AiworkerStatus`` search attribute;
the ``progress`` query shows per-step status, attempts, error code, duration
and usage. Deterministic code only: no I/O, clock, randomness or telemetry
libraries.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from jsonschema import Draft202012Validator
    from pydantic import ValidationError

    from aiworker.schemas import catalog, names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.limits import AcquireCall, LeaseCheck, Permit
    from aiworker.schemas.options import lease_seconds
    from aiworker.schemas.pipeline import (
        ChunkAllowance,
        ChunkInput,
        ChunkItem,
        ChunkResult,
        PipelineResult,
        PipelineSpec,
        ReviewDecision,
        Step,
        StepResult,
        TerminalStatus,
        step_dependencies,
    )
    from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
    from aiworker.schemas.protocol import TraceContext, Usage
    from aiworker.schemas.refs import ReferenceError_, find_refs, resolve
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Admission, BudgetRefused, Ledger
from aiworker.workflows.calls import (
    Outcome,
    call_worker,
    error_code_of,
    external_wait,
    with_feedback,
)
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.limits import Lease, PermitBook, PermitWaitExpired

MEMO_SEARCH_ATTRIBUTES = "search_attributes"
# A pipeline's own concurrency lease: checked with the pipeline when it runs out,
# kept while the pipeline lives; with a deadline it lasts the deadline and a margin.
PIPELINE_LEASE_SECONDS = 3600.0
PIPELINE_LEASE_MARGIN = 60.0
# A reviewer may send a step back this many times; then the step fails.
MAX_REVIEW_ROUNDS = 3
# Failed items listed in a for_each step's outputs (the counts cover all).
MAX_ITEM_ERRORS = 20
_FEEDBACK_CODES = (ErrorCode.INVALID_OUTPUT.value, ErrorCode.VALIDATION_FAILED.value)

__all__ = ["PipelineWorkflow", "error_code_of", "invalid_input", "parse_spec"]


def _specs() -> Mapping[str, WorkerSpec]:
    # Worker processes install their catalog (built-ins, plugins, spec files)
    # before workflows run; the module is passed through, so this reads no file
    # and imports no plugin here.
    with workflow.unsafe.sandbox_unrestricted():
        return catalog.current_specs()


def invalid_input(message: str, problems: list[str] | None = None) -> ApplicationError:
    """The non-retryable failure of a pipeline whose spec is wrong."""
    return ApplicationError(
        message,
        {"code": ErrorCode.INVALID_INPUT.value, "problems": problems or [message]},
        type=ErrorCode.INVALID_INPUT.value,
        non_retryable=True,
    )


def parse_spec(raw: Any, known_workers: set[str]) -> PipelineSpec:
    """Parse and check a pipeline spec; raise ``invalid_input`` naming step and field."""
    try:
        return parse_pipeline(raw, known_workers)
    except PipelineSpecError as e:
        raise invalid_input(str(e), e.problems) from None


def _now() -> float:
    return workflow.now().timestamp()


class _StepEnded(Exception):
    """A step ended early (skipped, blocked, refused); carries its result."""

    def __init__(self, result: StepResult) -> None:
        super().__init__(result.error_message or result.status)
        self.result = result


@workflow.defn(name=names.PIPELINE_WORKFLOW)
class PipelineWorkflow:
    """Runs a pipeline: a DAG of AI worker steps with references between them."""

    def __init__(self) -> None:
        self._steps: dict[str, StepResult] = {}
        self._status = "running"
        self._ledger: Ledger | None = None
        self._spec: PipelineSpec | None = None
        self._worker_specs: Mapping[str, WorkerSpec] = {}
        self._terminal: TerminalStatus | None = None
        # Steps waiting for a human: step id -> JSON Schema for corrected outputs.
        self._awaiting: dict[str, Any] = {}
        self._decisions: dict[str, ReviewDecision] = {}
        self._key_base = ""
        self._queue_suffix = ""
        self._trace_id = ""
        self._permits = PermitBook()
        self._rate_limited: set[str] | None = None  # None: every worker asks the limiter
        # Steps calling an external worker now: step id -> its queue and wait bound.
        self._external: dict[str, dict[str, Any]] = {}

    @workflow.signal(name=names.PERMIT_SIGNAL)
    def permit(self, permit: Permit) -> None:
        """A limiter granted a permit this pipeline asked for."""
        self._permits.on_permit(permit)

    @workflow.signal(name=names.LEASE_CHECK_SIGNAL)
    async def lease_check(self, check: LeaseCheck) -> None:
        """A limiter asks about a lease past its time (see ``LimiterWorkflow``)."""
        await self._permits.on_lease_check(check)

    # -- queries and updates -------------------------------------------------

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self, include_outputs: bool = False) -> dict[str, Any]:
        """Per-step status, attempts, error code, duration and usage so far."""
        exclude = None if include_outputs else {"outputs"}
        waiting = self._permits.waiting_for()
        steps = {k: v.model_dump(mode="json", exclude=exclude) for k, v in self._steps.items()}
        for step_id in waiting.keys() & steps.keys():
            steps[step_id]["status"] = "waiting"
        for step_id in self._external.keys() & steps.keys():
            steps[step_id]["external_worker"] = self._external[step_id]
        return {
            "status": self._status,
            "steps": steps,
            # who waits at a limiter now: step id ("" for the pipeline) -> rate or concurrency
            "waiting": waiting,
            "usage": (self._ledger.used if self._ledger else Usage()).model_dump(mode="json"),
            "budget": self._ledger.view() if self._ledger else None,
            "awaiting_review": sorted(self._awaiting),
        }

    @workflow.update(name=names.REVIEW_UPDATE)
    async def review(self, decision: dict[str, Any]) -> dict[str, Any]:
        """A human decision on an escalated step: approve, reject or retry."""
        d = ReviewDecision.model_validate(decision)
        step = d.step or next(iter(sorted(self._awaiting)))
        self._decisions[step] = d
        return {"step": step, "decision": d.decision, "reviewer": d.reviewer}

    @review.validator
    def _check_review(self, decision: dict[str, Any]) -> None:
        try:
            d = ReviewDecision.model_validate(decision)
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"invalid review: {first['msg']} at {first['loc']}") from None
        if not self._awaiting:
            raise ValueError("no step is awaiting review")
        if d.step is not None and d.step not in self._awaiting:
            raise ValueError(
                f"step {d.step!r} is not awaiting review (waiting: {sorted(self._awaiting)})"
            )
        if d.step is None and len(self._awaiting) > 1:
            raise ValueError(f"several steps await review, name one of {sorted(self._awaiting)}")
        step = d.step or next(iter(self._awaiting))
        if step in self._decisions:
            raise ValueError(f"step {step!r} already has a decision")
        if d.outputs is not None:
            if d.decision != "approve":
                raise ValueError("outputs come only with approve")
            errors = list(Draft202012Validator(self._awaiting[step]).iter_errors(d.outputs))
            if errors:
                first = errors[0]
                path = "$" + "".join(f"[{p!r}]" for p in first.absolute_path)
                raise ValueError(f"outputs fail step {step!r}'s schema at {path}: {first.message}")

    # -- the run -------------------------------------------------------------

    @workflow.run
    async def run(self, pipeline: Any) -> PipelineResult:
        """Run the pipeline; the argument is the pipeline JSON users write.

        Typed ``Any`` on purpose: the JSON is checked here, so that malformed
        input fails the workflow with ``invalid_input`` instead of failing
        payload decoding, which would retry the workflow task forever.
        """
        specs = _specs()
        try:
            spec = parse_spec(pipeline, set(specs))
        except ApplicationError:
            self._set_status("failed")
            raise
        self._spec = spec
        self._worker_specs = specs
        info = workflow.info()
        self._queue_suffix = names.queue_suffix_of(info.task_queue)
        # The real trace (from the SDK's tracing interceptor) when there is one,
        # so the result's trace_id finds the pipeline in the trace backend. The
        # uuid4() is drawn either way: later ids must not shift on replay.
        generated = workflow.uuid4().hex
        started_in = _trace_of(info)
        self._trace_id = started_in.trace_id if started_in else generated
        self._key_base = spec.resume_from.workflow_id if spec.resume_from else info.workflow_id
        self._ledger = Ledger(spec.budget, started_at=_now())
        # one upsert for all three: each is a visibility write on the server
        self._status = "running" if spec.concurrency is None else "waiting"
        if self._search_attributes_on():
            workflow.upsert_search_attributes(
                [
                    names.TENANT_KEY.value_set(spec.tenant),
                    names.PIPELINE_KEY.value_set(spec.name),
                    names.STATUS_KEY.value_set(self._status),
                ]
            )
        for step in spec.steps:
            self._steps[step.id] = StepResult(status="pending")
        try:
            # which workers wait for a rate-limit permit: asked once, not per step
            self._rate_limited = await self._permits.plan(
                spec.tenant,
                [s.worker for s in spec.steps] + [s.fallback for s in spec.steps if s.fallback],
            )
            slot = await self._pipeline_slot(spec)
            if isinstance(slot, PipelineResult):
                result = slot
            else:
                try:
                    result = await self._execute(spec)
                finally:
                    await self._permits.release_all(slot)
        except asyncio.CancelledError:
            self._finish("cancelled", spec)
            raise
        except ApplicationError:
            self._finish("failed", spec)
            raise
        except Exception as e:  # a bug: fail the workflow, never the workflow task forever
            self._finish("failed", spec)
            raise ApplicationError(
                f"internal error in PipelineWorkflow: {type(e).__name__}: {e}",
                type=ErrorCode.INTERNAL.value,
                non_retryable=True,
            ) from e
        self._finish(result.status, spec)
        return result

    async def _pipeline_slot(self, spec: PipelineSpec) -> list[Lease] | PipelineResult:
        """Wait for the pipeline's own concurrency slot (``concurrency`` on the pipeline).

        Returns the lease to give back at the end, or the result of a pipeline
        whose deadline passed while it waited (``rate_limited``, nothing ran).
        """
        if spec.concurrency is None:
            return []
        try:
            key = resolve(spec.concurrency.key, {"inputs": spec.inputs})
        except ReferenceError_ as e:
            raise ApplicationError(
                f"pipeline: field 'concurrency.key': {e}",
                type=ErrorCode.INVALID_INPUT.value,
                non_retryable=True,
            ) from None
        info = workflow.info()
        deadline = spec.budget.deadline_seconds
        call = AcquireCall(
            key=str(key),
            limit=spec.concurrency.limit,
            requester=info.workflow_id,
            ticket=f"{info.workflow_id}/{workflow.uuid4().hex[:8]}/pipeline",
            # renewed by the limiter's lease checks for as long as this pipeline lives
            lease_seconds=(
                PIPELINE_LEASE_SECONDS if deadline is None else deadline + PIPELINE_LEASE_MARGIN
            ),
        )
        try:
            leases = await self._permits.acquire_all([call], self._remaining)
        except PermitWaitExpired as e:
            message = f"the pipeline deadline passed while waiting for {e.what} ({key})"
            for sid in self._steps:
                self._steps[sid] = StepResult(status="skipped", error_message=message)
            return PipelineResult(
                status="failed",
                steps=dict(self._steps),
                usage=Usage(),
                trace_id=self._trace_id,
                error={"code": ErrorCode.RATE_LIMITED.value, "message": message},
            )
        self._set_status("running")
        return leases

    @staticmethod
    def _search_attributes_on() -> bool:
        # A server without aiworker's search attributes (the time-skipping test
        # server cannot register any) would fail every upsert; such a run
        # says so in its memo: {"search_attributes": false}.
        return bool(workflow.memo_value(MEMO_SEARCH_ATTRIBUTES, True, type_hint=bool))

    def _set_status(self, status: str) -> None:
        if status != self._status or status == "running":
            self._status = status
            if self._search_attributes_on():
                workflow.upsert_search_attributes([names.STATUS_KEY.value_set(status)])

    def _finish(self, status: str, spec: PipelineSpec) -> None:
        self._set_status(status)
        counter = workflow.metric_meter().create_counter(
            "aiworker_pipelines", "Pipelines that reached a terminal status."
        )
        counter.add(1, {"status": status, "pipeline": spec.name, "tenant": spec.tenant})

    async def _execute(self, spec: PipelineSpec) -> PipelineResult:
        deps = step_dependencies(spec)
        by_id = {s.id: s for s in spec.steps}
        reuse = spec.resume_from.steps if spec.resume_from else {}
        reused: list[str] = []
        done: set[str] = set()
        running: dict[str, asyncio.Task[StepResult]] = {}
        failed_hard = False
        try:
            # Each round finishes at least one step, so this loop is bounded.
            for _ in range(2 * len(spec.steps) + 2):
                if not failed_hard and self._terminal is None:
                    for step in spec.steps:
                        if step.id in done or step.id in running or not deps[step.id] <= done:
                            continue
                        old = reuse.get(step.id)
                        if old is not None and old.status in names.OK_STATUSES and spec.resume_from:
                            self._steps[step.id] = old.model_copy(
                                update={"reused_from": spec.resume_from.workflow_id}
                            )
                            reused.append(step.id)
                            done.add(step.id)
                            continue
                        self._steps[step.id] = StepResult(status="running")
                        running[step.id] = asyncio.create_task(self._run_step(spec, step))
                    if reused:
                        # Makes the reuse visible in this run's history and in the UI.
                        workflow.upsert_memo({"reused_steps": sorted(reused)})
                        reused = []
                        if not running:
                            continue
                if not running:
                    if all(s.id in done for s in spec.steps) or failed_hard or self._terminal:
                        break
                    continue
                finished, _ = await workflow.wait(
                    list(running.values()), return_when=asyncio.FIRST_COMPLETED
                )
                for sid in [sid for sid, t in running.items() if t in finished]:
                    result = running.pop(sid).result()
                    self._steps[sid] = result
                    done.add(sid)
                    if result.status == "failed" and by_id[sid].on_failure != "continue":
                        failed_hard = True
        except asyncio.CancelledError:
            for sid, task in running.items():
                task.cancel()
                self._steps[sid] = self._steps[sid].model_copy(update={"status": "cancelled"})
            await asyncio.gather(*running.values(), return_exceptions=True)
            for s in spec.steps:
                if self._steps[s.id].status == "pending":
                    self._steps[s.id] = StepResult(status="cancelled")
            raise
        status: TerminalStatus
        if self._terminal is not None:
            status = self._terminal
        elif failed_hard:
            status = "failed"
        elif any(
            r.status in ("failed", "partial", "blocked", "rejected") for r in self._steps.values()
        ):
            status = "partial"
        else:
            status = "succeeded"
        for step in spec.steps:
            if self._steps[step.id].status == "pending":
                self._steps[step.id] = StepResult(
                    status="skipped", error_message=f"not run: the pipeline ended {status}"
                )
        output, output_error = self._output(spec)
        return PipelineResult(
            status=status,
            output=output,
            steps=dict(self._steps),
            usage=self._ledger.used if self._ledger else Usage(),
            trace_id=self._trace_id,
            error=output_error,
        )

    def _scope(self) -> dict[str, Any]:
        spec = self._spec
        return {
            "inputs": spec.inputs if spec else {},
            "steps": {
                sid: {
                    "status": r.status,
                    "outputs": r.outputs,
                    "warnings": r.warnings,
                    "artifacts": r.artifacts,
                }
                for sid, r in self._steps.items()
            },
        }

    def _output(self, spec: PipelineSpec) -> tuple[dict[str, Any], dict[str, Any] | None]:
        out: dict[str, Any] = {}
        missing: list[str] = []
        scope = self._scope()
        for key, value in spec.output.items():
            try:
                out[key] = resolve(value, scope)
            except ReferenceError_ as e:
                missing.append(f"output {key!r}: {e}")
        return out, ({"code": "output_incomplete", "problems": missing} if missing else None)

    # -- one step ------------------------------------------------------------

    async def _run_step(self, spec: PipelineSpec, step: Step) -> StepResult:
        start = workflow.now()
        try:
            self._preflight(spec, step)
            if step.for_each is not None:
                result = await self._run_for_each(spec, step)
            else:
                result = await self._run_single(spec, step)
        except _StepEnded as e:
            result = e.result
        return result.model_copy(update={"duration_ms": _ms_since(start)})

    def _preflight(self, spec: PipelineSpec, step: Step) -> None:
        """Dependencies, gate and ``when``: raise ``_StepEnded`` if the step must not run."""
        for dep in step.depends_on:
            st = self._steps[dep].status
            if st not in names.OK_STATUSES and step.worker != names.AGGREGATOR:
                raise _StepEnded(
                    StepResult(status="skipped", error_message=f"dependency {dep!r} ended {st}")
                )
        if step.gate is not None:
            gate = self._steps[step.gate]
            outputs = gate.outputs if isinstance(gate.outputs, dict) else {}
            if gate.status != "succeeded" or not outputs.get("valid", False):
                reasons = list(outputs.get("errors") or gate.reasons)
                raise _StepEnded(
                    StepResult(
                        status="blocked",
                        error_code=ErrorCode.VALIDATION_FAILED.value,
                        error_message=f"gate {step.gate!r} did not pass ({gate.status})",
                        reasons=reasons,
                    )
                )
        if step.when is not None:
            try:
                value = resolve(step.when["value"], self._scope())
            except ReferenceError_ as e:
                raise _StepEnded(
                    StepResult(status="skipped", error_message=f"when: value unavailable: {e}")
                ) from None
            if not Draft202012Validator(step.when["schema"]).is_valid(value):
                raise _StepEnded(
                    StepResult(status="skipped", error_message="when: value does not match")
                )

    def _resolve_input(self, step: Step, value: Any, field: str, extra: dict[str, Any]) -> Any:
        scope = self._scope() | extra
        try:
            return resolve(value, scope)
        except ReferenceError_ as e:
            upstream = [
                r.step_id
                for r in find_refs(value)
                if r.step_id is not None and self._steps[r.step_id].status not in names.OK_STATUSES
            ]
            if upstream:
                raise _StepEnded(
                    StepResult(
                        status="skipped",
                        error_message=f"field {field!r}: step {upstream[0]!r} has no outputs",
                    )
                ) from None
            raise _StepEnded(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.INVALID_INPUT.value,
                    error_message=f"step {step.id!r}: field {field!r}: {e}",
                )
            ) from None

    def _admit(self, worker: WorkerSpec, timeout: float | None, calls: int = 1) -> Admission:
        if self._ledger is None:
            return Admission(None, None, timeout)
        try:
            return self._ledger.admit(worker, _now(), timeout, calls)
        except BudgetRefused as e:
            self._terminal = "budget_exhausted"
            raise _StepEnded(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.BUDGET_EXCEEDED.value,
                    error_message=f"refused before scheduling: {e.message}",
                    reasons=[{"resource": e.resource, "message": e.message}],
                    usage=Usage(),
                )
            ) from None

    async def _call(
        self, worker: WorkerSpec, step: Step, key: str, step_input: dict[str, Any], label: str
    ) -> Outcome:
        leases = await self._acquire_limits(worker, step)
        try:
            admission = self._admit(worker, step.timeout_seconds)
            wait = external_wait(worker, admission, self._queue_suffix, _now())
            if wait is not None:
                self._external[step.id] = wait
            outcome = await call_worker(
                worker,
                key=key,
                step_id=step.id,
                tenant=self._spec.tenant if self._spec else "default",
                trace_id=self._trace_id,
                input=step_input,
                admission=admission,
                max_attempts=self._max_attempts(step),
                queue_suffix=self._queue_suffix,
                summary=label,
            )
        finally:
            self._external.pop(step.id, None)
            await self._permits.release_all(leases)
        if self._ledger is not None:
            self._ledger.settle(admission, outcome.usage)
        if outcome.error_code == ErrorCode.BUDGET_EXCEEDED.value:
            self._terminal = "budget_exhausted"
        return outcome

    @staticmethod
    def _max_attempts(step: Step) -> int | None:
        return step.retry.max_attempts if step.retry else None

    def _remaining(self) -> timedelta | None:
        deadline = self._ledger.deadline if self._ledger else None
        if deadline is None:
            return None
        return timedelta(seconds=max(0.0, deadline - _now()))

    async def _acquire_limits(self, worker: WorkerSpec, step: Step) -> list[Lease]:
        """Wait for the worker's per-tenant rate limit and the step's concurrency key.

        Returns the concurrency leases to release; ends the step ``rate_limited``
        when the pipeline's deadline would pass first.
        """
        info = workflow.info()
        tenant = self._spec.tenant if self._spec else "default"
        base = f"{info.workflow_id}/{step.id}/{workflow.uuid4().hex[:8]}"
        calls = []
        if self._rate_limited is None or worker.worker_id in self._rate_limited:
            calls.append(
                AcquireCall(
                    worker_id=worker.worker_id,
                    tenant=tenant,
                    requester=info.workflow_id,
                    ticket=f"{base}/rate",
                )
            )
        if step.concurrency is not None:
            key = self._resolve_input(step, step.concurrency.key, "concurrency.key", {})
            calls.append(
                AcquireCall(
                    key=str(key),
                    limit=step.concurrency.limit,
                    requester=info.workflow_id,
                    ticket=f"{base}/concurrency",
                    lease_seconds=lease_seconds(
                        worker, step.timeout_seconds, self._max_attempts(step)
                    ),
                )
            )
        try:
            return await self._permits.acquire_all(calls, self._remaining, who=step.id)
        except PermitWaitExpired as e:
            raise _StepEnded(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.RATE_LIMITED.value,
                    error_message=(
                        f"step {step.id!r}: the pipeline deadline passed while waiting for {e.what}"
                    ),
                )
            ) from None

    async def _run_single(self, spec: PipelineSpec, step: Step) -> StepResult:
        worker = self._worker_specs[step.worker]
        step_input = self._resolve_input(step, step.input, "input", {})
        # Counted: each review round is one more pass of the bounded loop.
        result = StepResult(status="failed")
        for review_round in range(MAX_REVIEW_ROUNDS + 1):
            result = await self._attempt(spec, step, worker, step_input, review_round)
            if result.status in names.OK_STATUSES or self._terminal is not None:
                return result
            if step.on_failure != "escalate" or review_round == MAX_REVIEW_ROUNDS:
                return result
            decision = await self._await_review(step, worker, result)
            if decision is None:
                self._terminal = "escalation_timed_out"
                return result.model_copy(
                    update={
                        "status": "escalation_timed_out",
                        "error_message": (
                            f"no review within {step.review_timeout_seconds:g}s; "
                            f"last error: {result.error_message}"
                        ),
                    }
                )
            review = decision.model_dump(mode="json", exclude={"outputs"})
            if decision.decision == "approve":
                return result.model_copy(
                    update={
                        "status": "succeeded",
                        "outputs": (
                            decision.outputs if decision.outputs is not None else result.outputs
                        ),
                        "review": review,
                    }
                )
            if decision.decision == "reject":
                self._terminal = "rejected"
                return result.model_copy(update={"status": "rejected", "review": review})
            self._steps[step.id] = result.model_copy(update={"status": "running"})
        return result

    async def _await_review(
        self, step: Step, worker: WorkerSpec, result: StepResult
    ) -> ReviewDecision | None:
        schema = step.validate_.schema_ if step.validate_ is not None else worker.output_schema
        self._decisions.pop(step.id, None)
        self._awaiting[step.id] = schema
        self._steps[step.id] = result.model_copy(update={"status": "awaiting_review"})
        self._set_status("awaiting_review")
        try:
            await workflow.wait_condition(
                lambda: step.id in self._decisions,
                timeout=timedelta(seconds=step.review_timeout_seconds),
                timeout_summary=f"review deadline of {step.id}",
            )
        except TimeoutError:
            return None
        finally:
            self._awaiting.pop(step.id, None)
            if not self._awaiting and self._status == "awaiting_review":
                self._set_status("running")
        return self._decisions.pop(step.id)

    async def _attempt(
        self,
        spec: PipelineSpec,
        step: Step,
        worker: WorkerSpec,
        step_input: dict[str, Any],
        review_round: int,
    ) -> StepResult:
        """run -> validate -> feed back reasons, up to max_attempts -> fallback."""
        base = f"{self._key_base}/{step.id}"
        if review_round:
            base += f"#review-{review_round}"
        v = step.validate_
        loops = v.max_attempts if v is not None else 1
        attempts = 0
        validations = 0
        usage = Usage()
        last: Outcome | None = None
        current = step_input
        for n in range(loops):
            key = base if n == 0 else f"{base}#attempt-{n + 1}"
            outcome = await self._call(
                worker, step, key, current, f"{step.id} ({worker.worker_id})"
            )
            attempts += outcome.attempts
            usage = usage + outcome.usage
            if not outcome.ok or self._terminal is not None:
                last = outcome
                # A worker that rejects its own output (an LLM reply failing its
                # schema) gets the same second chance as a validator's verdict.
                if (
                    v is not None
                    and self._terminal is None
                    and outcome.error_code in _FEEDBACK_CODES
                    and outcome.reasons
                ):
                    current = with_feedback(step_input, v.feedback_field, outcome.reasons)
                    continue
                break
            if v is None:
                return _step_result(outcome, attempts, usage, validations)
            validations += 1
            verdict = await self._validate(v.schema_, outcome.outputs, f"{key}#validate", step)
            if verdict.ok and (verdict.outputs or {}).get("valid"):
                return _step_result(outcome, attempts, usage, validations)
            reasons = list((verdict.outputs or {}).get("errors") or verdict.reasons)
            last = Outcome(
                status="failed",
                outputs=outcome.outputs,
                error_code=ErrorCode.VALIDATION_FAILED.value,
                error_message=(
                    f"validation attempt {n + 1} of {loops} failed"
                    if verdict.ok
                    else f"validator failed: {verdict.error_message}"
                ),
                reasons=reasons,
            )
            current = with_feedback(step_input, v.feedback_field, reasons)
        if step.fallback is not None and self._terminal is None:
            fb = self._worker_specs[step.fallback]
            fb_input = (
                self._resolve_input(step, step.fallback_input, "fallback_input", {})
                if step.fallback_input is not None
                else step_input
            )
            outcome = await self._call(
                fb, step, f"{base}#fallback", fb_input, f"{step.id} fallback ({fb.worker_id})"
            )
            attempts += outcome.attempts
            usage = usage + outcome.usage
            if outcome.ok and v is not None:
                validations += 1
                verdict = await self._validate(
                    v.schema_, outcome.outputs, f"{base}#fallback#validate", step
                )
                if not (verdict.ok and (verdict.outputs or {}).get("valid")):
                    last = Outcome(
                        status="failed",
                        outputs=outcome.outputs,
                        error_code=ErrorCode.VALIDATION_FAILED.value,
                        error_message="the fallback's output failed validation too",
                        reasons=list((verdict.outputs or {}).get("errors") or verdict.reasons),
                    )
                    outcome = last
            if outcome.ok:
                return _step_result(outcome, attempts, usage, validations).model_copy(
                    update={"fallback_used": True}
                )
            last = outcome
        final = last or Outcome(status="failed", error_code=ErrorCode.INTERNAL.value)
        return StepResult(
            status="failed",
            attempts=attempts,
            error_code=final.error_code,
            error_message=final.error_message,
            outputs=None,
            reasons=final.reasons,
            usage=usage,
            validation_attempts=validations,
            fallback_used=step.fallback is not None and self._terminal is None,
        )

    async def _validate(self, schema: Any, data: Any, key: str, step: Step) -> Outcome:
        validator = self._worker_specs[names.VALIDATOR]
        return await call_worker(
            validator,
            key=key,
            step_id=step.id,
            tenant=self._spec.tenant if self._spec else "default",
            trace_id=self._trace_id,
            input={"data": data, "schema": schema},
            queue_suffix=self._queue_suffix,
            summary=f"{step.id} validate",
        )

    # -- for_each ------------------------------------------------------------

    async def _run_for_each(self, spec: PipelineSpec, step: Step) -> StepResult:
        worker = self._worker_specs[step.worker]
        items = self._resolve_input(step, step.for_each, "for_each", {})
        if not isinstance(items, list):
            raise _StepEnded(
                StepResult(
                    status="failed",
                    error_code=ErrorCode.INVALID_INPUT.value,
                    error_message=(
                        f"step {step.id!r}: field 'for_each': expected a list, "
                        f"got {type(items).__name__}"
                    ),
                )
            )
        total = len(items)
        results: list[Any] = [None] * total
        errors: list[dict[str, Any]] = []
        failed = 0
        resolved: list[ChunkItem] = []
        scope = self._scope()
        for i, item in enumerate(items):
            item_scope = scope | {"item": item, "item_index": i}
            try:
                resolved.append(
                    ChunkItem(
                        index=i,
                        input=resolve(step.input, item_scope),
                        concurrency_key=(
                            None
                            if step.concurrency is None
                            else str(resolve(step.concurrency.key, item_scope))
                        ),
                    )
                )
            except ReferenceError_ as e:
                failed += 1
                if len(errors) < MAX_ITEM_ERRORS:
                    errors.append(
                        {"index": i, "error_code": ErrorCode.INVALID_INPUT.value, "message": str(e)}
                    )
        if not total:
            return StepResult(
                status="succeeded",
                outputs={"items": [], "count": 0, "succeeded": 0, "failed": 0, "errors": []},
                items={"total": 0, "succeeded": 0, "failed": 0},
            )
        # One reservation for the whole step, shared out to chunks by item count.
        admission = self._admit(worker, step.timeout_seconds, calls=len(resolved))
        chunks = [
            resolved[i : i + step.chunk_size] for i in range(0, len(resolved), step.chunk_size)
        ]
        in_flight = max(1, math.ceil(step.max_parallel / step.chunk_size))
        per_chunk_parallel = min(step.max_parallel, step.chunk_size)
        slots = asyncio.Semaphore(in_flight)
        deadline = self._ledger.deadline if self._ledger else None
        info = workflow.info()
        done_items = 0
        usage = Usage()

        def share(total_cap: int | None, n: int) -> int | None:
            return None if total_cap is None else (total_cap * n) // max(1, len(resolved))

        async def run_chunk(k: int, chunk: list[ChunkItem]) -> ChunkResult:
            async with slots:
                return await workflow.execute_child_workflow(
                    PipelineForEachWorkflow.run,
                    ChunkInput(
                        step_id=step.id,
                        worker=worker.worker_id,
                        key_prefix=f"{self._key_base}/{step.id}",
                        tenant=spec.tenant,
                        trace_id=self._trace_id,
                        queue_suffix=self._queue_suffix,
                        items=chunk,
                        max_parallel=per_chunk_parallel,
                        timeout_seconds=step.timeout_seconds,
                        max_attempts=self._max_attempts(step),
                        rate_limited=(
                            self._rate_limited is None or worker.worker_id in self._rate_limited
                        ),
                        concurrency_limit=step.concurrency.limit if step.concurrency else None,
                        lease_seconds=lease_seconds(
                            worker, step.timeout_seconds, self._max_attempts(step)
                        ),
                        allowance=ChunkAllowance(
                            max_tokens=share(admission.max_tokens, len(chunk)),
                            max_external_calls=share(admission.max_external_calls, len(chunk)),
                            deadline=deadline,
                        ),
                    ),
                    id=f"{info.workflow_id}/{step.id}/{k}",
                    task_queue=info.task_queue,
                    static_summary=f"{step.id} items {chunk[0].index}..{chunk[-1].index}",
                )

        tasks = [asyncio.create_task(run_chunk(k, c)) for k, c in enumerate(chunks)]
        budget_hit = False
        try:
            for _ in range(len(tasks)):
                finished, _pending = await workflow.wait(
                    [t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED
                )
                for t in finished:
                    chunk_result = t.result()
                    usage = usage + chunk_result.usage
                    for it in chunk_result.items:
                        done_items += 1
                        if it.status in names.OK_STATUSES:
                            results[it.index] = it.outputs
                            continue
                        failed += 1
                        budget_hit = budget_hit or it.error_code == ErrorCode.BUDGET_EXCEEDED.value
                        if len(errors) < MAX_ITEM_ERRORS:
                            errors.append(
                                {
                                    "index": it.index,
                                    "error_code": it.error_code,
                                    "message": it.error_message,
                                }
                            )
                self._steps[step.id] = self._steps[step.id].model_copy(
                    update={"items": {"total": total, "done": done_items, "failed": failed}}
                )
                if all(t.done() for t in tasks):
                    break
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            if self._ledger is not None:
                self._ledger.settle(admission, usage)
        if budget_hit:
            self._terminal = "budget_exhausted"
        ok = total - failed
        errors.sort(key=lambda e: int(e["index"]))
        return StepResult(
            status="succeeded" if not failed else ("failed" if not ok else "partial"),
            attempts=len(chunks),
            error_code=(
                ErrorCode.BUDGET_EXCEEDED.value
                if budget_hit
                else (errors[0]["error_code"] if errors else None)
            ),
            error_message=f"{failed} of {total} items failed" if failed else None,
            outputs={
                "items": results,
                "count": total,
                "succeeded": ok,
                "failed": failed,
                "errors": errors,
            },
            usage=usage,
            items={"total": total, "succeeded": ok, "failed": failed},
        )


def _step_result(outcome: Outcome, attempts: int, usage: Usage, validations: int) -> StepResult:
    return StepResult(
        status="partial" if outcome.status == "partial" else "succeeded",
        attempts=attempts,
        outputs=outcome.outputs,
        warnings=outcome.warnings,
        artifacts=outcome.artifacts,
        usage=usage,
        validation_attempts=validations,
    )


def _trace_of(info: workflow.Info) -> TraceContext | None:
    """The W3C trace context the workflow was started in (from its headers), if any."""
    payload = info.headers.get(names.TRACE_HEADER)
    if payload is None:
        return None
    try:
        carrier = workflow.payload_converter().from_payloads([payload])[0]
    except Exception:
        return None
    if not isinstance(carrier, dict):
        return None
    return TraceContext.from_traceparent(carrier.get("traceparent"))


def _ms_since(start: Any) -> float:
    delta: timedelta = workflow.now() - start
    return round(delta.total_seconds() * 1000, 3)
