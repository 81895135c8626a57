"""One worker call from a workflow, and the bounded validation loop around it.

Shared by ``PipelineWorkflow`` and its for_each chunks. A call goes by
activity name with options derived from the worker spec; a failure comes back
as an :class:`Outcome` carrying the stable error code of the activity's cause,
never as an exception, so callers route on codes. Deterministic code only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.options import activity_options
    from aiworker.schemas.protocol import (
        RequestConstraints,
        TraceContext,
        Usage,
        WorkerRequest,
        WorkerResponse,
    )
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Admission


@dataclass
class Outcome:
    """How one worker call (all its Temporal attempts) ended."""

    status: str
    outputs: Any = None
    attempts: int = 0
    error_code: str | None = None
    error_message: str | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    @property
    def ok(self) -> bool:
        return self.status in ("succeeded", "partial")


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


def error_details(err: BaseException) -> dict[str, Any]:
    """The ``ErrorInfo`` a worker attached to its failure (empty if none)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.details:
        d = cause.details[0]
        if isinstance(d, dict):
            return d
    return {}


async def call_worker(
    worker: WorkerSpec,
    *,
    key: str,
    tenant: str,
    trace_id: str,
    input: dict[str, Any],
    step_id: str | None = None,
    admission: Admission | None = None,
    timeout_seconds: float | None = None,
    max_attempts: int | None = None,
    queue_suffix: str = "",
    summary: str | None = None,
) -> Outcome:
    """Call ``worker`` once (Temporal retries inside); never raises on worker failure."""
    timeout = timeout_seconds
    if admission is not None and admission.timeout_seconds is not None:
        timeout = admission.timeout_seconds
    constraints = RequestConstraints(
        timeout_seconds=timeout,
        max_tokens=admission.max_tokens if admission else None,
        max_external_calls=admission.max_external_calls if admission else None,
    )
    request = WorkerRequest(
        worker_id=worker.worker_id,
        version=worker.version,
        idempotency_key=key,
        step_id=step_id,
        tenant=tenant,
        trace=TraceContext(trace_id=trace_id, span_id=workflow.uuid4().hex[:16]),
        input=input,
        constraints=constraints,
    )
    options = activity_options(
        worker, constraints=constraints, max_attempts=max_attempts, queue_suffix=queue_suffix
    )
    try:
        response = await workflow.execute_activity(
            worker.worker_id,
            request,
            result_type=WorkerResponse,
            summary=summary or worker.worker_id,
            **options,
        )
    except ActivityError as e:
        details = error_details(e)
        cause = e.cause
        attempts = int(details.get("context", {}).get("attempt", 0) or 0)
        return Outcome(
            status="failed",
            attempts=attempts or (options["retry_policy"].maximum_attempts or 1),
            error_code=error_code_of(e),
            error_message=str(cause) if cause else str(e),
            reasons=list(details.get("reasons") or []),
            usage=_usage_of(details),
        )
    return Outcome(
        status=response.status,
        outputs=response.outputs,
        attempts=response.observability.attempt,
        warnings=[w.model_dump(mode="json") for w in response.warnings],
        artifacts=[a.model_dump(mode="json") for a in response.artifacts],
        usage=response.usage,
    )


def _usage_of(details: dict[str, Any]) -> Usage:
    """What a failed call consumed (every attempt), as its ``ErrorInfo`` says."""
    raw = details.get("usage")
    if not isinstance(raw, dict):
        return Usage()
    try:
        return Usage.model_validate(raw)
    except ValueError:
        return Usage()


def with_feedback(
    step_input: dict[str, Any], field_name: str, reasons: list[Any]
) -> dict[str, Any]:
    """The next attempt's input: the validator's reasons in ``field_name``.

    A text field (an LLM prompt, say) gets the reasons appended as text; any
    other field is set to the list of reasons.
    """
    out = dict(step_input)
    current = out.get(field_name)
    if isinstance(current, str):
        lines = [
            f"- {r.get('path', '$')}: {r.get('message', r)}" if isinstance(r, dict) else f"- {r}"
            for r in reasons
        ]
        out[field_name] = (
            current
            + "\n\nThe previous answer was rejected by the validator:\n"
            + "\n".join(lines)
            + "\nFix these problems."
        )
    else:
        out[field_name] = reasons
    return out
