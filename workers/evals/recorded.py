"""The recorded calls of a worker, read back from Temporal.

Every worker call a pipeline makes is an activity whose scheduled event holds
the :class:`~aiworker.schemas.protocol.WorkerRequest` (the resolved input) and
whose completed event holds the :class:`~aiworker.schemas.protocol.WorkerResponse`
(outputs, usage, duration), or whose failed event holds the error code and the
:class:`~aiworker.schemas.protocol.ErrorInfo`. :func:`recorded_calls` lists
ended pipelines in visibility (their search attributes: tenant, pipeline name;
the start time for ``since``), reads each history and pairs those events. The
payloads are decoded by the client's data converter, which reads payloads that
left the history for the external payload store
(:mod:`aiworker.workers.process.payload_storage`) back from it.

From the run's result (the workflow's completed event) each call gets its step's
human review (decision, and the step's outputs when approved: the corrected
outputs where the reviewer gave some); from the run-config marker
(:class:`~aiworker.schemas.limits.RunConfig`, the specs the run recorded) the
model alias of a prompt worker.

Not read: calls of ``execution: local`` workers (markers, not activities) and
the items of a ``for_each`` step (they run in child workflows): both are left
for a later version and say so in docs/evals.md.

This is the one history reader of evals and of ``aiworker check --quote``:
keep its names stable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.visibility import quote

_SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
_STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
_COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
_FAILED = EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
_TIMED_OUT = EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
_CANCELED = EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED
_MARKER = EventType.EVENT_TYPE_MARKER_RECORDED
_WF_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


@dataclass(frozen=True)
class CallQuery:
    """Which recorded calls to read (every field given must match; None: any).

    Attributes:
        worker: the worker id (the activity type).
        version: the worker's contract version as the request carried it.
        tenant: the run's tenant.
        pipeline: the pipeline's name.
        since: only runs started this long ago or later.
        status: the call's status: ``succeeded``, ``partial``, ``failed``
            (the activity failed after its retries), ``timed_out``, ``cancelled``.
        error_code: the failed call's stable error code.
        limit: at most this many calls (newest runs first).
    """

    worker: str | None = None
    version: str | None = None
    tenant: str | None = None
    pipeline: str | None = None
    since: timedelta | None = None
    status: str | None = None
    error_code: str | None = None
    limit: int | None = None

    def visibility_query(self, now: datetime | None = None) -> str:
        """The visibility query of the runs whose calls may match: ended pipelines
        with this tenant and pipeline name, started within ``since``."""
        parts = [
            f"WorkflowType = {quote(names.PIPELINE_WORKFLOW)}",
            "ExecutionStatus != 'Running'",
        ]
        if self.tenant:
            parts.append(f"{names.SA_TENANT} = {quote(self.tenant)}")
        if self.pipeline:
            parts.append(f"{names.SA_PIPELINE} = {quote(self.pipeline)}")
        if self.since is not None:
            start = (now or datetime.now(UTC)) - self.since
            parts.append(f"StartTime >= {quote(start.strftime('%Y-%m-%dT%H:%M:%S.%fZ'))}")
        return " AND ".join(parts)


@dataclass(frozen=True)
class RecordedCall:
    """One worker call as its run's history recorded it.

    Attributes:
        workflow_id: the pipeline's workflow id.
        run_id: its run id.
        pipeline: the pipeline's name (search attribute).
        tenant: the tenant the call was made for.
        step_id: the step that made it.
        worker: the worker id.
        version: the worker's contract version the request named.
        model: the model alias (an ``llm-call`` input's ``model``, else the
            recorded spec's ``implementation.model``), None when there is none.
        input: the resolved input the worker received.
        output: the outputs it returned; None when the call failed.
        status: ``succeeded`` or ``partial`` (the response's), ``failed``,
            ``timed_out`` or ``cancelled``.
        error_code: the stable error code of a failed call (``timeout`` for a
            timed-out one), else None.
        usage: the call's usage as recorded (tokens, external calls, cost as a
            decimal string); for a failed call what its error info booked.
        cost_usd: ``usage["cost_usd"]`` as a float.
        external_calls: ``usage["external_calls"]`` (0 when not recorded).
        duration_ms: the worker's own measure of the last attempt, else the time
            from the last attempt's start to the call's end.
        started_at: when the call was scheduled (ISO 8601, UTC).
        review: the step's human review, ``{"decision", "reviewer", "note",
            "outputs"}`` (``outputs``: the step's outputs when approved, the
            corrected ones if the reviewer gave some), None without a review.
        scheduled_event_id: the call's scheduled event in its history (with the
            workflow and run ids, what names the call).
    """

    workflow_id: str
    run_id: str
    pipeline: str | None
    tenant: str | None
    step_id: str | None
    worker: str
    version: str | None
    model: str | None
    input: dict[str, Any]
    output: dict[str, Any] | None
    status: str
    error_code: str | None
    usage: dict[str, Any]
    cost_usd: float
    external_calls: int
    duration_ms: float
    started_at: str
    review: dict[str, Any] | None = None
    scheduled_event_id: int = 0

    def to_json(self) -> dict[str, Any]:
        """The call as a JSON object (the dataset item's fields, without ``id``)."""
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "pipeline": self.pipeline,
            "tenant": self.tenant,
            "step_id": self.step_id,
            "worker": self.worker,
            "version": self.version,
            "model": self.model,
            "input": self.input,
            "output": self.output,
            "status": self.status,
            "error_code": self.error_code,
            "usage": self.usage,
            "cost_usd": self.cost_usd,
            "external_calls": self.external_calls,
            "duration_ms": self.duration_ms,
            "started_at": self.started_at,
            "review": self.review,
            "scheduled_event_id": self.scheduled_event_id,
        }


@dataclass
class _Pending:
    event_id: int
    worker: str
    at: datetime
    request: dict[str, Any]
    attempt_started: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _cost(usage: Mapping[str, Any]) -> float:
    try:
        return float(Decimal(str(usage.get("cost_usd", "0"))))
    except (InvalidOperation, ValueError):
        return 0.0


async def _decode_one(client: Client, payloads: Payloads) -> Any:
    if not payloads.payloads:
        return None
    values = await client.data_converter.decode(payloads.payloads)
    return values[0] if values else None


async def _failure_code(client: Client, failure: Failure) -> tuple[str, dict[str, Any]]:
    """The stable code of an activity's failure and its ErrorInfo (``{}`` if none)."""
    f = failure
    for _ in range(8):  # an ApplicationError may wrap a cause; a short, counted walk
        if f.HasField("application_failure_info"):
            info = f.application_failure_info
            details: dict[str, Any] = {}
            if info.details.payloads:
                first = await _decode_one(client, info.details)
                if isinstance(first, dict):
                    details = first
            return info.type or "internal", details
        if f.HasField("timeout_failure_info"):
            return "timeout", {}
        if f.HasField("canceled_failure_info"):
            return "cancelled", {}
        if not f.HasField("cause"):
            break
        f = f.cause
    return "internal", {}


def _review(result: Any, step_id: str | None) -> dict[str, Any] | None:
    if not isinstance(result, dict) or step_id is None:
        return None
    steps = result.get("steps")
    step = steps.get(step_id) if isinstance(steps, dict) else None
    if not isinstance(step, dict) or not isinstance(step.get("review"), dict):
        return None
    r = step["review"]
    decision = r.get("decision")
    outputs = step.get("outputs") if decision == "approve" else None
    return {
        "decision": decision,
        "reviewer": r.get("reviewer"),
        "note": r.get("note"),
        "outputs": outputs if isinstance(outputs, dict) else None,
    }


def _model(worker: str, request: Mapping[str, Any], specs: Mapping[str, Any]) -> str | None:
    given = request.get("input", {}).get("model") if worker == names.LLM_CALL else None
    if isinstance(given, str):
        return given
    spec = specs.get(worker)
    impl = spec.get("implementation") if isinstance(spec, dict) else None
    model = impl.get("model") if isinstance(impl, dict) else None
    return model if isinstance(model, str) else None


def _ended_scheduled_id(event: HistoryEvent) -> int:
    et = event.event_type
    if et == _COMPLETED:
        return event.activity_task_completed_event_attributes.scheduled_event_id
    if et == _FAILED:
        return event.activity_task_failed_event_attributes.scheduled_event_id
    if et == _TIMED_OUT:
        return event.activity_task_timed_out_event_attributes.scheduled_event_id
    return event.activity_task_canceled_event_attributes.scheduled_event_id


def _matches(query: CallQuery, call: RecordedCall) -> bool:
    return (
        (query.version is None or call.version == query.version)
        and (query.tenant is None or call.tenant == query.tenant)
        and (query.status is None or call.status == query.status)
        and (query.error_code is None or call.error_code == query.error_code)
    )


async def run_calls(
    client: Client,
    workflow_id: str,
    run_id: str,
    *,
    worker: str | None = None,
    pipeline: str | None = None,
    page_size: int = 1000,
) -> list[RecordedCall]:
    """Every worker call one pipeline run's history recorded (of ``worker``
    only, when given), in the order they were scheduled."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    pending: dict[int, _Pending] = {}
    ended: list[tuple[_Pending, HistoryEvent]] = []
    specs: dict[str, Any] = {}
    result: Any = None
    async for event in handle.fetch_history_events(page_size=page_size):
        et = event.event_type
        if et == _SCHEDULED:
            a = event.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            if worker is not None and name != worker:
                continue
            request = await _decode_one(client, a.input)
            # a worker call carries a WorkerRequest; internal activities do not
            if not isinstance(request, dict) or request.get("worker_id") != name:
                continue
            at = event.event_time.ToDatetime(UTC)
            pending[event.event_id] = _Pending(event.event_id, name, at, request)
        elif et == _STARTED:
            p = pending.get(event.activity_task_started_event_attributes.scheduled_event_id)
            if p is not None:
                p.attempt_started = event.event_time.ToDatetime(UTC)
        elif et in (_COMPLETED, _FAILED, _TIMED_OUT, _CANCELED):
            sid = _ended_scheduled_id(event)
            p = pending.pop(sid, None)
            if p is not None:
                ended.append((p, event))
        elif et == _MARKER and not specs:
            # a local activity's marker keeps its result under "result" (sdk-core);
            # the first one with specs is the run config
            data = event.marker_recorded_event_attributes.details.get("result")
            if data is not None and data.payloads:
                value = await _decode_one(client, data)
                if isinstance(value, dict) and isinstance(value.get("specs"), dict):
                    specs = value["specs"]
        elif et == _WF_COMPLETED:
            done = event.workflow_execution_completed_event_attributes
            result = await _decode_one(client, done.result)
    calls: list[RecordedCall] = []
    for p, event in ended:
        calls.append(await _call(client, workflow_id, run_id, pipeline, p, event, specs, result))
    return calls


async def _call(
    client: Client,
    workflow_id: str,
    run_id: str,
    pipeline: str | None,
    p: _Pending,
    event: HistoryEvent,
    specs: Mapping[str, Any],
    result: Any,
) -> RecordedCall:
    request = p.request
    end = event.event_time.ToDatetime(UTC)
    elapsed = (end - (p.attempt_started or p.at)).total_seconds() * 1000
    output: dict[str, Any] | None = None
    usage: dict[str, Any] = {}
    error_code: str | None = None
    duration = elapsed
    et = event.event_type
    if et == _COMPLETED:
        response = await _decode_one(client, event.activity_task_completed_event_attributes.result)
        response = response if isinstance(response, dict) else {}
        outputs = response.get("outputs")
        output = outputs if isinstance(outputs, dict) else {}
        status = str(response.get("status") or "succeeded")
        usage = dict(response.get("usage") or {})
        obs = response.get("observability")
        if isinstance(obs, dict) and isinstance(obs.get("duration_ms"), int | float):
            duration = float(obs["duration_ms"])
    elif et == _FAILED:
        status = "failed"
        error_code, info = await _failure_code(
            client, event.activity_task_failed_event_attributes.failure
        )
        usage = dict(info.get("usage") or {})
    elif et == _TIMED_OUT:
        status, error_code = "timed_out", "timeout"
    else:
        status, error_code = "cancelled", "cancelled"
    step_id = request.get("step_id")
    return RecordedCall(
        workflow_id=workflow_id,
        run_id=run_id,
        pipeline=pipeline,
        tenant=request.get("tenant"),
        step_id=step_id,
        worker=p.worker,
        version=request.get("version"),
        model=_model(p.worker, request, specs),
        input=dict(request.get("input") or {}),
        output=output,
        status=status,
        error_code=error_code,
        usage=usage,
        cost_usd=_cost(usage),
        external_calls=int(usage.get("external_calls") or 0),
        duration_ms=round(duration, 3),
        started_at=_iso(p.at),
        review=_review(result, step_id),
        scheduled_event_id=p.event_id,
    )


async def recorded_calls(
    client: Client, query: CallQuery, *, page_size: int = 100
) -> AsyncIterator[RecordedCall]:
    """The recorded calls matching ``query``: ended pipeline runs newest first
    (visibility's order), each run's calls in the order they were scheduled; at
    most ``query.limit``.

    Visibility is eventually consistent: a run that ended a moment ago may be
    missing from it for a short while.

    Args:
        client: a client with the process's data converter (external payload
            storage included).
        query: what to read.
        page_size: the visibility page size and the history page size.
    """
    if query.limit is not None and query.limit <= 0:
        return
    count = 0
    async for wf in client.list_workflows(query.visibility_query(), page_size=page_size):
        pipeline = wf.typed_search_attributes.get(names.PIPELINE_KEY)
        for call in await run_calls(
            client, wf.id, wf.run_id, worker=query.worker, pipeline=pipeline, page_size=page_size
        ):
            if not _matches(query, call):
                continue
            yield call
            count += 1
            if query.limit is not None and count >= query.limit:
                return


__all__ = ["CallQuery", "RecordedCall", "recorded_calls", "run_calls"]
