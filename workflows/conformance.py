"""The conformance kit's workflow: call one worker's activity as a pipeline would.

``aiworker conformance WORKER_ID`` (``aiworker.workers.conformance.run``) runs
:class:`ConformanceWorkflow` on a private task queue served inside the CLI
process. The workflow calls the worker by its activity name (its
``worker_id``) on the queue its spec names, with the activity options every
pipeline derives from the spec (:func:`aiworker.schemas.options.activity_options`),
and hands back each call's raw outcome: the response as the worker sent it
(taken as a raw payload and decoded here as a plain dict, so that a reply
that is no JSON object, or no JSON at all, is reported as a failed call, not
fatal to the workflow task), or the failure with its type, retry flag,
message and details. Judging the outcomes is plain Python in the caller;
this file only moves payloads. Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.options import activity_options
    from aiworker.schemas.protocol import RequestConstraints
    from aiworker.schemas.spec import WorkerSpec, describe_validation

from aiworker.workflows.calls import PAYLOAD_DECODE_ERRORS


class ConformanceCall(BaseModel):
    """One activity call: its id in the history, the raw request, the tightened timeout."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=200, description="the activity id in the history")
    request: dict[str, Any] = Field(description="the request exactly as the worker receives it")
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="a tightened timeout the activity options follow too"
    )


class ConformancePlan(BaseModel):
    """The input of :class:`ConformanceWorkflow`."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="the worker's spec (a WorkerSpec as JSON)")
    queue_suffix: str = Field(default="", description="AIWORKER_TASK_QUEUE_SUFFIX of the stack")
    call_timeout_seconds: float = Field(
        gt=0, description="bound of each call, retries included (schedule-to-close)"
    )
    calls: list[ConformanceCall] = Field(max_length=200)


@workflow.defn(name="ConformanceWorkflow")
class ConformanceWorkflow:
    """Calls a worker once per :class:`ConformanceCall`, one after the other.

    Returns ``{"calls": [{"id", "ok": true, "response": {...}} | {"id", "ok":
    false, "failure": {"kind", "type", "non_retryable", "message", "details",
    "retry_state"}}]}``. A plan that does not parse fails the workflow as a
    non-retryable ``invalid_input`` (never a workflow-task retry).
    """

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        try:
            plan = ConformancePlan.model_validate(raw)
            spec = WorkerSpec.model_validate(plan.spec)
        except ValidationError as e:
            raise ApplicationError(
                f"conformance plan: {describe_validation(e)}",
                type=ErrorCode.INVALID_INPUT.value,
                non_retryable=True,
            ) from None
        outcomes = [await self._call(spec, plan, call) for call in plan.calls]
        return {"calls": outcomes}

    @staticmethod
    async def _call(
        spec: WorkerSpec, plan: ConformancePlan, call: ConformanceCall
    ) -> dict[str, Any]:
        options = activity_options(
            spec,
            constraints=RequestConstraints(timeout_seconds=call.timeout_seconds),
            queue_suffix=plan.queue_suffix,
        )
        try:
            reply = await workflow.execute_activity(
                spec.worker_id,
                call.request,
                activity_id=call.id,
                # raw: a reply the converter cannot decode into a dict would fail the
                # workflow task on every retry (and the command with it), not the call
                result_type=RawValue,
                # Bounds a call whose worker nobody serves, or that keeps retrying.
                schedule_to_close_timeout=timedelta(seconds=plan.call_timeout_seconds),
                summary=f"conformance {call.id}",
                **options,
            )
        except ActivityError as e:
            return {"id": call.id, "ok": False, "failure": _failure(e)}
        try:
            response = workflow.payload_converter().from_payload(reply.payload, dict)
        except PAYLOAD_DECODE_ERRORS as e:  # a reply the converter refuses: the worker's fault
            return {"id": call.id, "ok": False, "failure": _undecodable(reply, e)}
        return {"id": call.id, "ok": True, "response": response}


def _undecodable(reply: RawValue, err: Exception) -> dict[str, Any]:
    """A call that returned, but with a reply that is no JSON object."""
    encoding = reply.payload.metadata.get("encoding", b"").decode("utf-8", "replace")
    why = str(err.__cause__ or err).splitlines()[0][:300]
    if "Input should be an object" in str(err) or "dict_type" in str(err):
        why = "it is JSON, but not an object"
    return {
        "kind": "undecodable",
        "type": None,
        "non_retryable": False,
        "message": (
            f"the reply could not be decoded as a response envelope "
            f"(payload encoding {encoding or 'unset'!r}, {len(reply.payload.data)} bytes): {why}"
        ),
        "details": [],
        "retry_state": None,
    }


def _failure(err: ActivityError) -> dict[str, Any]:
    """What the workflow saw of a failed call, as JSON."""
    cause = err.cause
    retry_state = err.retry_state.name if err.retry_state is not None else None
    if isinstance(cause, ApplicationError):
        return {
            "kind": "application",
            "type": cause.type,
            "non_retryable": cause.non_retryable,
            "message": cause.message,
            "details": list(cause.details),
            "retry_state": retry_state,
        }
    if isinstance(cause, TemporalTimeout):
        return {
            "kind": "timeout",
            "type": cause.type.name if cause.type is not None else None,
            "non_retryable": False,
            "message": str(cause) or "activity timed out",
            "details": [],
            "retry_state": retry_state,
        }
    return {
        "kind": type(cause).__name__ if cause is not None else "unknown",
        "type": None,
        "non_retryable": False,
        "message": str(cause or err),
        "details": [],
        "retry_state": retry_state,
    }
