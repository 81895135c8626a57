"""``PipelineWorkflow``: runs a pipeline spec as a DAG of worker calls.

The spec arrives as plain JSON and is checked whole before the first step
runs; a bad spec fails the workflow with a non-retryable ``invalid_input``
naming the step and field. Steps start as soon as their dependencies are
done. Each step calls its worker by activity name with options derived from
the worker spec (``schemas.options``); failures are routed on the stable
error code of the activity's cause.

Deterministic code only: no I/O, clock, randomness or telemetry libraries.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas import names
    from schemas.errors import ErrorCode
    from schemas.limits import AcquireCall, Permit
    from schemas.options import activity_options
    from schemas.pipeline import (
        PipelineResult,
        PipelineSpec,
        Step,
        StepResult,
        TerminalStatus,
        check_pipeline,
        step_dependencies,
    )
    from schemas.protocol import (
        RequestConstraints,
        TraceContext,
        Usage,
        WorkerRequest,
        WorkerResponse,
    )
    from schemas.refs import ReferenceError_, resolve
    from schemas.spec import WorkerSpec, load_specs

from workflows.permits import PermitBook

STATUS_KEY = SearchAttributeKey.for_keyword(names.SA_STATUS)
TENANT_KEY = SearchAttributeKey.for_keyword(names.SA_TENANT)
PIPELINE_KEY = SearchAttributeKey.for_keyword(names.SA_PIPELINE)


def _specs() -> dict[str, WorkerSpec]:
    # Worker processes load the specs before workflows run; the cached result
    # is shared through the passed-through module, so this reads no file here.
    with workflow.unsafe.sandbox_unrestricted():
        return load_specs()


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
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = list(err["loc"])
            where = "pipeline"
            if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
                steps = raw.get("steps") if isinstance(raw, dict) else None
                sid = None
                if (
                    isinstance(steps, list)
                    and loc[1] < len(steps)
                    and isinstance(steps[loc[1]], dict)
                ):
                    sid = steps[loc[1]].get("id")
                where = f"step {sid!r}" if sid else f"step #{loc[1]}"
                loc = loc[2:]
            field = ".".join(str(p) for p in loc) or "(root)"
            problems.append(f"{where}: field {field!r}: {err['msg']}")
        raise invalid_input("invalid pipeline: " + "; ".join(problems), problems) from None
    problems = check_pipeline(spec, known_workers)
    if problems:
        raise invalid_input("invalid pipeline: " + "; ".join(problems), problems)
    return spec


def error_code_of(err: BaseException) -> str:
    """The stable error code behind an activity failure."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type:
        return cause.type
    if isinstance(cause, TimeoutError):
        return ErrorCode.TIMEOUT.value
    if isinstance(cause, CancelledError):
        return "cancelled"
    return ErrorCode.INTERNAL.value


def _error_details(err: BaseException) -> dict[str, Any]:
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.details:
        d = cause.details[0]
        if isinstance(d, dict):
            return d
    return {}


@workflow.defn(name=names.PIPELINE_WORKFLOW)
class PipelineWorkflow:
    """Runs a pipeline: a DAG of AI worker steps with references between them."""

    def __init__(self) -> None:
        self._steps: dict[str, StepResult] = {}
        self._usage = Usage()
        self._status = "running"
        self._permits = PermitBook()
        self._started_at: float | None = None
        self._deadline_seconds: float | None = None

    @workflow.signal(name=names.PERMIT_SIGNAL)
    def permit(self, permit: Permit) -> None:
        """A limiter granted a permit this pipeline asked for."""
        self._permits.on_permit(permit)

    @workflow.query(name=names.PROGRESS_QUERY)
    def progress(self) -> dict[str, Any]:
        """Per-step status, attempts, error code, duration and usage so far."""
        return {
            "status": self._status,
            "steps": {
                k: v.model_dump(mode="json", exclude={"outputs"}) for k, v in self._steps.items()
            },
            "usage": self._usage.model_dump(mode="json"),
        }

    @workflow.run
    async def run(self, pipeline: Any) -> PipelineResult:
        """Run the pipeline; the argument is the pipeline JSON users write.

        Typed ``Any`` on purpose: the JSON is checked here, so that malformed
        input fails the workflow with ``invalid_input`` instead of failing
        payload decoding, which would retry the workflow task forever.
        """
        specs = _specs()
        spec = parse_spec(pipeline, set(specs))
        info = workflow.info()
        self._started_at = workflow.now().timestamp()
        self._deadline_seconds = spec.budget.deadline_seconds
        self._queue_suffix = names.queue_suffix_of(info.task_queue)
        self._trace_id = workflow.uuid4().hex
        workflow.upsert_search_attributes(
            [
                STATUS_KEY.value_set("running"),
                TENANT_KEY.value_set(spec.tenant),
                PIPELINE_KEY.value_set(spec.name),
            ]
        )
        for step in spec.steps:
            self._steps[step.id] = StepResult(status="pending")
        try:
            result = await self._execute(spec, specs)
        except asyncio.CancelledError:
            self._status = "cancelled"
            workflow.upsert_search_attributes([STATUS_KEY.value_set("cancelled")])
            raise
        except ApplicationError:
            self._status = "failed"
            workflow.upsert_search_attributes([STATUS_KEY.value_set("failed")])
            raise
        except Exception as e:  # a bug: fail the workflow, never the workflow task forever
            self._status = "failed"
            workflow.upsert_search_attributes([STATUS_KEY.value_set("failed")])
            raise ApplicationError(
                f"internal error in PipelineWorkflow: {type(e).__name__}: {e}",
                type=ErrorCode.INTERNAL.value,
                non_retryable=True,
            ) from e
        self._status = result.status
        workflow.upsert_search_attributes([STATUS_KEY.value_set(result.status)])
        return result

    async def _execute(self, spec: PipelineSpec, specs: dict[str, WorkerSpec]) -> PipelineResult:
        deps = step_dependencies(spec)
        by_id = {s.id: s for s in spec.steps}
        done: set[str] = set()
        running: dict[str, asyncio.Task[StepResult]] = {}
        failed_hard = False
        # Each round finishes at least one step, so this loop is bounded.
        for _ in range(len(spec.steps) + 1):
            if not failed_hard:
                for step in spec.steps:
                    if step.id in done or step.id in running:
                        continue
                    if deps[step.id] <= done:
                        self._steps[step.id] = StepResult(status="running")
                        running[step.id] = asyncio.create_task(
                            self._run_step(spec, specs[step.worker], step)
                        )
            if not running:
                break
            finished, _pending = await workflow.wait(
                list(running.values()), return_when=asyncio.FIRST_COMPLETED
            )
            for sid in [sid for sid, t in running.items() if t in finished]:
                task = running.pop(sid)
                result = task.result()
                self._steps[sid] = result
                self._usage = self._usage + result.usage
                done.add(sid)
                if result.status == "failed" and by_id[sid].on_failure == "fail":
                    failed_hard = True
        for step in spec.steps:
            if self._steps[step.id].status == "pending":
                self._steps[step.id] = StepResult(
                    status="skipped", error_message="not run: an earlier step failed"
                )
        statuses = {r.status for r in self._steps.values()}
        status: TerminalStatus
        if failed_hard:
            status = "failed"
        elif statuses & {"failed", "partial", "blocked"}:
            status = "partial"
        else:
            status = "succeeded"
        output, output_error = self._output(spec)
        return PipelineResult(
            status=status,
            output=output,
            steps=dict(self._steps),
            usage=self._usage,
            trace_id=self._trace_id,
            error=output_error,
        )

    def _scope(self, spec: PipelineSpec) -> dict[str, Any]:
        return {
            "inputs": spec.inputs,
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
        scope = self._scope(spec)
        for key, value in spec.output.items():
            try:
                out[key] = resolve(value, scope)
            except ReferenceError_ as e:
                missing.append(f"output {key!r}: {e}")
        return out, ({"code": "output_incomplete", "problems": missing} if missing else None)

    async def _run_step(self, spec: PipelineSpec, worker: WorkerSpec, step: Step) -> StepResult:
        start = workflow.now()
        if step.gate is not None:
            gate = self._steps[step.gate]
            if gate.status != "succeeded" or not (gate.outputs or {}).get("valid", False):
                return StepResult(
                    status="blocked",
                    error_code=ErrorCode.VALIDATION_FAILED.value,
                    error_message=f"gate {step.gate!r} did not pass",
                    outputs={"reasons": (gate.outputs or {}).get("errors", [])},
                )
        try:
            step_input = resolve(step.input, self._scope(spec))
        except ReferenceError_ as e:
            return StepResult(
                status="failed",
                error_code=ErrorCode.INVALID_INPUT.value,
                error_message=f"step {step.id!r}: field 'input': {e}",
            )
        limits = await self._acquire_limits(spec, worker, step)
        if isinstance(limits, StepResult):
            return limits
        try:
            return await self._call_worker(spec, worker, step, step_input, start)
        finally:
            for key, ticket in limits:
                await self._permits.release(key, ticket)

    def _remaining(self) -> timedelta | None:
        if self._deadline_seconds is None or self._started_at is None:
            return None
        left = self._started_at + self._deadline_seconds - workflow.now().timestamp()
        return timedelta(seconds=max(0.0, left))

    async def _acquire_limits(
        self, spec: PipelineSpec, worker: WorkerSpec, step: Step
    ) -> list[tuple[str, str]] | StepResult:
        """Wait for the worker's per-tenant rate limit and the step's concurrency key.

        Returns the concurrency leases to release, or a failed step result when
        the pipeline's deadline would pass first (``rate_limited``).
        """
        info = workflow.info()
        base = f"{info.workflow_id}/{step.id}/{workflow.uuid4().hex[:8]}"
        calls = [
            AcquireCall(
                worker_id=worker.worker_id,
                tenant=spec.tenant,
                requester=info.workflow_id,
                ticket=f"{base}/rate",
            )
        ]
        if step.concurrency is not None:
            try:
                key = resolve(step.concurrency.key, self._scope(spec))
            except ReferenceError_ as e:
                return StepResult(
                    status="failed",
                    error_code=ErrorCode.INVALID_INPUT.value,
                    error_message=f"step {step.id!r}: field 'concurrency.key': {e}",
                )
            attempts = worker.retries.max_attempts
            lease = (step.timeout_seconds or worker.constraints.timeout_seconds) * attempts + 60
            calls.append(
                AcquireCall(
                    key=str(key),
                    limit=step.concurrency.limit,
                    requester=info.workflow_id,
                    ticket=f"{base}/concurrency",
                    lease_seconds=lease,
                )
            )
        leases: list[tuple[str, str]] = []
        for call in calls:
            result = await self._permits.acquire(call, self._remaining())
            if result is None:
                for key, ticket in leases:
                    await self._permits.release(key, ticket)
                return StepResult(
                    status="failed",
                    error_code=ErrorCode.RATE_LIMITED.value,
                    error_message=f"step {step.id!r}: the pipeline deadline passed while "
                    f"waiting for {'a concurrency slot' if call.key else 'the rate limit'}",
                )
            if result.limited and call.key is not None and result.limiter_id is not None:
                leases.append((result.limiter_id, call.ticket))
        return leases

    async def _call_worker(
        self, spec: PipelineSpec, worker: WorkerSpec, step: Step, step_input: Any, start: Any
    ) -> StepResult:
        info = workflow.info()
        constraints = RequestConstraints(timeout_seconds=step.timeout_seconds)
        request = WorkerRequest(
            worker_id=worker.worker_id,
            version=worker.version,
            idempotency_key=f"{info.workflow_id}/{step.id}",
            tenant=spec.tenant,
            trace=TraceContext(trace_id=self._trace_id, span_id=workflow.uuid4().hex[:16]),
            input=step_input,
            constraints=constraints,
        )
        options = activity_options(
            worker,
            constraints=constraints,
            max_attempts=step.retry.max_attempts if step.retry else None,
            queue_suffix=self._queue_suffix,
        )
        try:
            response = await workflow.execute_activity(
                worker.worker_id,
                request,
                result_type=WorkerResponse,
                summary=f"{step.id} ({worker.worker_id})",
                **options,
            )
        except ActivityError as e:
            details = _error_details(e)
            attempts = int(details.get("context", {}).get("attempt", 0) or 0)
            return StepResult(
                status="failed",
                attempts=attempts,
                error_code=error_code_of(e),
                error_message=str(e.cause) if e.cause else str(e),
                duration_ms=_ms_since(start),
                outputs={"reasons": details.get("reasons", [])} if details.get("reasons") else None,
            )
        return StepResult(
            status=response.status,
            attempts=response.observability.attempt,
            duration_ms=_ms_since(start),
            outputs=response.outputs,
            warnings=[w.model_dump(mode="json") for w in response.warnings],
            artifacts=[a.model_dump(mode="json") for a in response.artifacts],
            usage=response.usage,
        )


def _ms_since(start: Any) -> float:
    delta: timedelta = workflow.now() - start
    return round(delta.total_seconds() * 1000, 3)


__all__ = ["PipelineWorkflow"]
