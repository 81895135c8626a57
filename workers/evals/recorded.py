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

From the run's result (the workflow's completed event, or for a run that did not
succeed the result its failed event carries) each call gets its step's
human review (decision, and the step's outputs when approved: the corrected
outputs where the reviewer gave some); from the run-config marker
(:class:`~aiworker.schemas.limits.RunConfig`, the specs the run recorded) the
model alias of a prompt worker.

The items of a ``for_each`` step are read from the chunk workflows the run
started (``PipelineForEachWorkflow`` children, nested chunks too): one call per
item, whether the item was its own activity or one envelope of an items task
(``<worker>.items``, ``items_per_task``), with the item's resolved input and
index. Calls of ``execution: local`` workers are markers, not activities: the
marker holds the response (or the failure) and its summary names the step (or
``step[index]`` in a chunk), but not the request; the input is the chunk's
item input, or for a step's call its ``input`` (``fallback_input`` for a
fallback) resolved again against the run's inputs and the steps' results as the
run ended (what it saw when it called: a step's results do not change once
ended). A step's validator call (``<step> validate``) is not a step's call and
is not read.

A run whose payloads this process cannot read (they live in another stack's
artifact store, or the store refuses them) raises the store's error
(:class:`~aiworker.activities.errors.NotFoundError`, ``not_found``); a caller
that can do without it passes ``unreadable`` and gets it listed instead
(:class:`UnreadableRun`), the way the quote does.

This is the one history reader of evals and of ``aiworker check --quote``:
keep its names stable.
"""

from __future__ import annotations

import re
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

from aiworker.activities.errors import WorkerError
from aiworker.schemas import names
from aiworker.schemas.batch import ITEMS_SUFFIX
from aiworker.schemas.outcomes import carried_result
from aiworker.schemas.refs import ReferenceError_, resolve
from aiworker.workers.client.visibility import quote

_SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
_STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
_COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
_FAILED = EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
_TIMED_OUT = EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
_CANCELED = EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED
_MARKER = EventType.EVENT_TYPE_MARKER_RECORDED
_WF_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
_WF_FAILED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
_WF_STARTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
_CHILD_STARTED = EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
_LOCAL_MARKER = "core_local_activity"  # the SDK core's marker of a local activity
# a local activity's summary as workflows/steps.py and workflows/foreach.py write it
_STEP_SUMMARY = re.compile(r"^(?P<step>\S+?)(?P<fallback> fallback)? \((?P<worker>[^()]+)\)$")
_ITEM_SUMMARY = re.compile(r"^(?P<step>\S+?)\[(?P<index>\d+)\] \((?P<worker>[^()]+)\)$")


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
            workflow and run ids, what names the call); a local activity's
            marker event.
        item_index: a ``for_each`` item's index in its step's list; None for a
            step's own call.
        history_workflow_id: the workflow whose history holds the call when it
            is not the pipeline's (a ``for_each`` chunk); None: the pipeline's.
        local: the call ran as a local activity (read from its marker).
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
    item_index: int | None = None
    history_workflow_id: str | None = None
    local: bool = False

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
            "item_index": self.item_index,
            "history_workflow_id": self.history_workflow_id,
            "local": self.local,
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


@dataclass
class _Ended:
    """One call as its history ended it: the request, and the response or failure."""

    worker: str
    event_id: int
    at: datetime
    end: datetime
    attempt_started: datetime | None
    request: dict[str, Any]
    response: dict[str, Any] | None = None
    error_code: str | None = None
    error_usage: dict[str, Any] = field(default_factory=dict)
    status: str | None = None  # failed, timed_out, cancelled; None: from the response
    item_index: int | None = None
    local: bool = False


@dataclass
class _Scan:
    """What one history (a pipeline's or a chunk's) holds for the reader."""

    ended: list[_Ended] = field(default_factory=list)
    started_input: Any = None
    result: Any = None
    specs: dict[str, Any] = field(default_factory=dict)
    chunks: list[tuple[str, str]] = field(default_factory=list)
    # local activities: (marker event, worker, summary, response or None, failure or None)
    markers: list[tuple[HistoryEvent, str, str, Any, Failure | None]] = field(default_factory=list)


def _index_of(key: Any) -> int | None:
    """A for_each item's index: the last part of its idempotency key."""
    tail = str(key).rsplit("/", 1)[-1]
    return int(tail) if tail.isascii() and tail.isdigit() else None


async def _scan(
    client: Client, workflow_id: str, run_id: str, worker: str | None, page_size: int
) -> _Scan:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    out = _Scan()
    pending: dict[int, _Pending] = {}
    async for event in handle.fetch_history_events(page_size=page_size):
        et = event.event_type
        if et == _SCHEDULED:
            a = event.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            base = name.removesuffix(ITEMS_SUFFIX)
            if worker is not None and base != worker:
                continue
            request = await _decode_one(client, a.input)
            if not isinstance(request, dict):
                continue
            if name != base:  # an items task: one envelope per for_each item
                if not isinstance(request.get("requests"), list):
                    continue
            elif request.get("worker_id") != name:  # aiworker's own activities
                continue
            at = event.event_time.ToDatetime(UTC)
            pending[event.event_id] = _Pending(event.event_id, name, at, request)
        elif et == _STARTED:
            p = pending.get(event.activity_task_started_event_attributes.scheduled_event_id)
            if p is not None:
                p.attempt_started = event.event_time.ToDatetime(UTC)
        elif et in (_COMPLETED, _FAILED, _TIMED_OUT, _CANCELED):
            p = pending.pop(_ended_scheduled_id(event), None)
            if p is not None:
                out.ended.extend(await _ended(client, p, event))
        elif et == _MARKER:
            await _marker(client, event, worker, out)
        elif et == _CHILD_STARTED:
            c = event.child_workflow_execution_started_event_attributes
            if c.workflow_type.name == names.FOREACH_WORKFLOW:
                out.chunks.append((c.workflow_execution.workflow_id, c.workflow_execution.run_id))
        elif et == _WF_STARTED:
            start = event.workflow_execution_started_event_attributes
            out.started_input = await _decode_one(client, start.input)
        elif et == _WF_COMPLETED:
            done = event.workflow_execution_completed_event_attributes
            out.result = await _decode_one(client, done.result)
        elif et == _WF_FAILED:
            # a run that did not succeed carries its result in its failure
            failed = event.workflow_execution_failed_event_attributes.failure
            carried = carried_result(await client.data_converter.decode_failure(failed))
            out.result = carried.model_dump(mode="json") if carried is not None else None
    return out


async def _marker(client: Client, event: HistoryEvent, worker: str | None, out: _Scan) -> None:
    """A local activity's marker: the run config (specs), or a worker's call."""
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != _LOCAL_MARKER:
        return
    data = attrs.details.get("data")
    meta = await _decode_one(client, data) if data is not None else None
    name = meta.get("activity_type") if isinstance(meta, dict) else None
    result = attrs.details.get("result")
    value = await _decode_one(client, result) if result is not None and result.payloads else None
    if not out.specs and isinstance(value, dict) and isinstance(value.get("specs"), dict):
        out.specs = value["specs"]  # the run config: the first marker with specs
        return
    if not isinstance(name, str) or (worker is not None and name != worker):
        return
    failure = attrs.failure if attrs.HasField("failure") else None
    is_call = isinstance(value, dict) and value.get("worker_id") == name
    if not is_call and failure is None:
        return
    summary = ""
    if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
        text = await _decode_one(client, Payloads(payloads=[event.user_metadata.summary]))
        summary = text if isinstance(text, str) else ""
    out.markers.append((event, name, summary, value if is_call else None, failure))


async def _ended(client: Client, p: _Pending, event: HistoryEvent) -> list[_Ended]:
    """The call(s) an ended activity made: one, or one per envelope of an items task."""
    end = event.event_time.ToDatetime(UTC)
    et = event.event_type
    if p.worker.endswith(ITEMS_SUFFIX):
        worker = p.worker.removesuffix(ITEMS_SUFFIX)
        requests = [r for r in p.request["requests"] if isinstance(r, dict)]
        calls = [
            _Ended(worker, p.event_id, p.at, end, p.attempt_started, r,
                   item_index=_index_of(r.get("idempotency_key")))
            for r in requests
        ]  # fmt: skip
        if et != _COMPLETED:
            code, _ = await _activity_failure(client, event)
            status = {_FAILED: "failed", _TIMED_OUT: "timed_out"}.get(et, "cancelled")
            for c in calls:
                c.status, c.error_code = status, code
            return calls
        done = await _decode_one(client, event.activity_task_completed_event_attributes.result)
        outcomes = done.get("outcomes") if isinstance(done, dict) else None
        for c, o in zip(calls, outcomes if isinstance(outcomes, list) else [], strict=False):
            if isinstance(o, dict) and isinstance(o.get("response"), dict):
                c.response = o["response"]
            elif isinstance(o, dict) and isinstance(o.get("error"), dict):
                err = o["error"]
                c.status, c.error_code = "failed", str(err.get("code") or "internal")
                c.error_usage = dict(err.get("usage") or {})
        return calls
    call = _Ended(p.worker, p.event_id, p.at, end, p.attempt_started, p.request)
    call.item_index = _index_of(p.request.get("idempotency_key"))
    if et == _COMPLETED:
        response = await _decode_one(client, event.activity_task_completed_event_attributes.result)
        call.response = response if isinstance(response, dict) else {}
    elif et == _FAILED:
        code, info = await _activity_failure(client, event)
        call.status, call.error_code = "failed", code
        call.error_usage = dict(info.get("usage") or {})
    elif et == _TIMED_OUT:
        call.status, call.error_code = "timed_out", "timeout"
    else:
        call.status, call.error_code = "cancelled", "cancelled"
    return [call]


async def _activity_failure(client: Client, event: HistoryEvent) -> tuple[str, dict[str, Any]]:
    if event.event_type == _FAILED:
        return await _failure_code(client, event.activity_task_failed_event_attributes.failure)
    return ("timeout" if event.event_type == _TIMED_OUT else "cancelled"), {}


def _step_scope(spec: Any, result: Any) -> dict[str, Any] | None:
    """What a step's references saw: the run's inputs and every step's results."""
    if not isinstance(spec, dict) or not isinstance(result, dict):
        return None
    steps = result.get("steps")
    return {
        "inputs": spec.get("inputs") or {},
        "steps": {
            sid: {k: r.get(k) for k in ("status", "outputs", "warnings", "artifacts")}
            for sid, r in (steps.items() if isinstance(steps, dict) else ())
            if isinstance(r, dict)
        },
    }


def _marker_request(summary: str, spec: Any, scope: dict[str, Any] | None) -> dict[str, Any] | None:
    """The request a pipeline step's local call made: its step and resolved input
    (None when the summary names no step's call or the input does not resolve)."""
    m = _STEP_SUMMARY.match(summary)
    if m is None or scope is None or not isinstance(spec, dict):
        return None
    step = next(
        (s for s in spec.get("steps") or () if isinstance(s, dict) and s.get("id") == m["step"]),
        None,
    )
    if step is None or step.get("for_each") is not None:
        return None
    raw = step.get("fallback_input") if m["fallback"] else None
    raw = raw if raw is not None else step.get("input")
    try:
        value = resolve(raw or {}, scope)
    except (ReferenceError_, ValueError, TypeError):
        return None
    if not isinstance(value, dict):
        return None
    return {"step_id": m["step"], "tenant": spec.get("tenant") or "default", "input": value}


def _chunk_request(summary: str, chunk: Any) -> dict[str, Any] | None:
    """The request a for_each item's local call made: the chunk's item input."""
    m = _ITEM_SUMMARY.match(summary)
    if m is None or not isinstance(chunk, dict):
        return None
    index = int(m["index"])
    for item in chunk.get("items") or ():
        if isinstance(item, dict) and item.get("index") == index:
            return {
                "step_id": chunk.get("step_id"),
                "tenant": chunk.get("tenant") or "default",
                "input": item.get("input") or {},
                "item_index": index,
            }
    return None


async def _from_markers(client: Client, scan: _Scan, requests: Any) -> list[_Ended]:
    """The local calls of one history, each with the request ``requests(summary)`` gives."""
    calls: list[_Ended] = []
    for event, name, summary, value, failure in scan.markers:
        req = requests(summary)
        if req is None:
            continue
        at = event.event_time.ToDatetime(UTC)
        response = value if isinstance(value, dict) else None
        version = response.get("version") if response else None
        call = _Ended(
            name, event.event_id, at, at, None,
            {"worker_id": name, "version": version, **req}, local=True,
            item_index=req.get("item_index"),
        )  # fmt: skip
        if failure is not None:
            call.status = "failed"
            call.error_code, info = await _failure_code(client, failure)
            call.error_usage = dict(info.get("usage") or {})
            if call.request.get("version") is None and isinstance(info.get("context"), dict):
                call.request["version"] = info["context"].get("version")
        else:
            call.response = response
        calls.append(call)
    return calls


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
    only, when given), in the order they were scheduled, then its for_each
    items' calls chunk by chunk (module docstring)."""
    scan = await _scan(client, workflow_id, run_id, worker, page_size)
    scope = _step_scope(scan.started_input, scan.result)
    local = await _from_markers(
        client, scan, lambda summary: _marker_request(summary, scan.started_input, scope)
    )
    ended = sorted([*scan.ended, *local], key=lambda c: c.event_id)
    calls = [_call(workflow_id, run_id, pipeline, c, scan.specs, scan.result, None) for c in ended]
    todo = list(scan.chunks)
    while todo:  # a chunk's own chunks (a tree of chunks) are read after it
        chunk_id, chunk_run = todo.pop(0)
        chunk = await _scan(client, chunk_id, chunk_run, worker, page_size)
        todo.extend(chunk.chunks)
        local = await _from_markers(
            client, chunk, lambda summary, c=chunk: _chunk_request(summary, c.started_input)
        )
        ended = sorted([*chunk.ended, *local], key=lambda c: (c.event_id, c.item_index or 0))
        calls += [
            _call(workflow_id, run_id, pipeline, c, scan.specs, None, chunk_id) for c in ended
        ]
    return calls


def _call(
    workflow_id: str,
    run_id: str,
    pipeline: str | None,
    c: _Ended,
    specs: Mapping[str, Any],
    result: Any,
    chunk_id: str | None,
) -> RecordedCall:
    request = c.request
    elapsed = (c.end - (c.attempt_started or c.at)).total_seconds() * 1000
    output: dict[str, Any] | None = None
    usage: dict[str, Any] = dict(c.error_usage)
    duration = elapsed
    status = c.status
    if status is None:
        response = c.response or {}
        outputs = response.get("outputs")
        output = outputs if isinstance(outputs, dict) else {}
        status = str(response.get("status") or "succeeded")
        usage = dict(response.get("usage") or {})
        obs = response.get("observability")
        if isinstance(obs, dict) and isinstance(obs.get("duration_ms"), int | float):
            duration = float(obs["duration_ms"])
    step_id = request.get("step_id")
    return RecordedCall(
        workflow_id=workflow_id,
        run_id=run_id,
        pipeline=pipeline,
        tenant=request.get("tenant"),
        step_id=step_id,
        worker=c.worker,
        # an items task's envelopes leave defaults out: the response names the version
        version=request.get("version") or (c.response or {}).get("version"),
        model=_model(c.worker, request, specs),
        input=dict(request.get("input") or {}),
        output=output,
        status=status,
        error_code=c.error_code,
        usage=usage,
        cost_usd=_cost(usage),
        external_calls=int(usage.get("external_calls") or 0),
        duration_ms=round(duration, 3),
        started_at=_iso(c.at),
        review=_review(result, step_id) if chunk_id is None else None,
        scheduled_event_id=c.event_id,
        item_index=c.item_index if chunk_id is not None else None,
        history_workflow_id=chunk_id,
        local=c.local,
    )


@dataclass(frozen=True)
class UnreadableRun:
    """A run :func:`recorded_calls` left out: its payloads cannot be read here."""

    workflow_id: str
    run_id: str
    code: str
    message: str


async def recorded_calls(
    client: Client,
    query: CallQuery,
    *,
    page_size: int = 100,
    unreadable: list[UnreadableRun] | None = None,
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
        unreadable: when given, a run whose payloads this process cannot read
            (the store's error, a :class:`~aiworker.activities.errors.WorkerError`)
            is appended here and left out; otherwise that error is raised.
    """
    if query.limit is not None and query.limit <= 0:
        return
    count = 0
    async for wf in client.list_workflows(query.visibility_query(), page_size=page_size):
        pipeline = wf.typed_search_attributes.get(names.PIPELINE_KEY)
        try:
            calls = await run_calls(
                client,
                wf.id,
                wf.run_id,
                worker=query.worker,
                pipeline=pipeline,
                page_size=page_size,
            )
        except WorkerError as e:
            if unreadable is None:
                raise
            unreadable.append(UnreadableRun(wf.id, wf.run_id, e.code.value, str(e)))
            continue
        for call in calls:
            if not _matches(query, call):
                continue
            yield call
            count += 1
            if query.limit is not None and count >= query.limit:
                return


__all__ = ["CallQuery", "RecordedCall", "UnreadableRun", "recorded_calls", "run_calls"]
