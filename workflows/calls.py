"""One worker call from a workflow, and the bounded validation loop around it.

Long on purpose (about 650 lines): one call's whole path, as an activity
or a local activity, and every way it can end, checked in one place.

Shared by ``PipelineWorkflow`` and its for_each chunks. A call goes by
activity name with options derived from the worker spec and ends as a
``StepResult`` (the shape a step's result has, so the step runner adds to it
rather than converting it): a failure carries the stable error code of the
activity's cause, never an exception, so callers route on codes.
Deterministic code only.

A worker the run's plan names local (spec ``"execution": "local"``) runs as a
local activity in this worker process, with the same envelope, timeout and
retry policy. Its application failure arrives unwrapped and without a usable
retry state, so its code and attempts are worked out to match an activity's.

A built-in or plugin worker validates its own envelope and outputs in the
worker runtime, so its result is decoded straight into ``WorkerResponse``.
An external worker (``implementation.kind`` external) runs code aiworker
never saw: its result arrives undecoded (``RawValue``) and is checked here,
the envelope against ``WorkerResponse`` and the outputs against the spec's
``output_schema``; anything malformed becomes an ``invalid_output`` outcome
with the reasons, never a failed workflow task and never data downstream.
Its failures are checked too: a type outside the error-code table is
``internal`` with the type named, and details that are no ``ErrorInfo`` are
dropped (:func:`foreign_failure`). Its call may wait in the task queue only
until the pipeline's deadline (``schedule_to_start``), then fails as
``timeout`` naming the queue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RawValue, RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    RetryState,
    TimeoutType,
)
from temporalio.exceptions import (
    TimeoutError as TemporalTimeout,
)

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from aiworker.schemas import messages, safe_schema
    from aiworker.schemas.batch import ItemsResult, ItemsTask, items_activity
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.lost_usage import (
        NOTHING_HEARD,
        USAGE_ESTIMATED,
        LastBeat,
        cover,
        estimated_message,
    )
    from aiworker.schemas.options import (
        LOCAL_RETRY_THRESHOLD,
        activity_options,
        effective_timeout,
    )
    from aiworker.schemas.pipeline import StepResult
    from aiworker.schemas.protocol import (
        CachePolicy,
        ErrorInfo,
        RequestConstraints,
        TraceContext,
        Usage,
        WorkerRequest,
        WorkerResponse,
    )
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.budget import Admission

_CODES = frozenset(c.value for c in ErrorCode)

PAYLOAD_DECODE_ERRORS: tuple[type[Exception], ...] = (
    ApplicationError,
    KeyError,
    RuntimeError,
    ValueError,
)
"""What the process's payload converter raises for a payload it cannot decode: an
unknown encoding (``KeyError``), JSON the parser refuses (``invalid_input``, an
``ApplicationError``), a value its type refuses (pydantic's ``ValidationError``, a
``ValueError``) and the SDK's own wrapping of a converter's refusal
(``RuntimeError``). A payload someone else wrote (an external worker's reply, a
caller's header) is caught as these and only these; anything else raised while
decoding is a bug here and fails the workflow task."""


def invalid_input(message: str, problems: list[str] | None = None) -> ApplicationError:
    """The non-retryable failure of a pipeline whose spec is wrong."""
    return ApplicationError(
        message,
        {"code": ErrorCode.INVALID_INPUT.value, "problems": problems or [message]},
        type=ErrorCode.INVALID_INPUT.value,
        non_retryable=True,
    )


def error_code_of(err: BaseException) -> str:
    """The stable error code behind an activity failure."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type:
        return cause.type
    if isinstance(cause, TemporalTimeout):
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


@dataclass(frozen=True)
class CallContext:
    """What every call of one step (or item, or agent turn) shares: who runs it
    (``tenant``, ``trace_id``), which step it belongs to, the task-queue suffix
    of this deployment and the run's task ``priority`` (the default leaves the
    command as it was before priorities)."""

    tenant: str
    trace_id: str
    step_id: str | None = None
    queue_suffix: str = ""
    priority: Priority = Priority.default


@dataclass(frozen=True)
class WorkerCall:
    """One worker call, as :func:`call_worker` and
    :func:`~aiworker.workflows.governed.governed_call` take it.

    ``key`` is the idempotency key, ``summary`` the activity's summary (the
    worker id when None). ``timeout_seconds`` is the step's own timeout (the
    budget's admission caps it by the deadline), ``max_attempts`` the step's cap
    on retries (None: the spec's). ``cache`` goes in the request: the worker
    runtime looks the call up before the worker runs
    (:mod:`~aiworker.activities.step_cache`), so a step without one pays nothing.
    ``local`` runs the call as a local activity in this worker process (the
    run's recorded plan says which workers may): the same activity, envelope,
    timeout and retry policy, so it ends in the same ``StepResult``.
    """

    worker: WorkerSpec
    key: str
    input: dict[str, Any]
    context: CallContext
    summary: str | None = None
    timeout_seconds: float | None = None
    max_attempts: int | None = None
    cache: CachePolicy | None = None
    local: bool = False


async def call_worker(call: WorkerCall, admission: Admission | None = None) -> StepResult:
    """Call ``call.worker`` once (Temporal retries inside); never raises on worker failure.

    Only the call itself: permits, budget and settlement are
    :func:`~aiworker.workflows.governed.governed_call`'s, which every worker call
    of a workflow goes through; ``admission`` is what the budget admitted.

    Returns how the call ended: ``succeeded``/``partial`` with outputs, warnings,
    artifacts and usage (``cached`` when the step cache answered), or ``failed``
    with the error code, message and reasons.
    """
    worker, ctx = call.worker, call.context
    queue_suffix, priority, summary = ctx.queue_suffix, ctx.priority, call.summary
    max_attempts, local = call.max_attempts, call.local
    request = _request(call, admission)
    constraints = request.constraints
    external = worker.kind == "external"
    local = local and not external  # another process's worker cannot run here
    options = activity_options(
        worker,
        constraints=constraints,
        max_attempts=max_attempts,
        queue_suffix=queue_suffix,
        schedule_to_start_seconds=schedule_to_start_seconds(worker, admission),
    )
    try:
        if local:
            # No task queue, priority or heartbeat: it runs here, in this workflow task.
            result = await workflow.execute_local_activity(
                worker.worker_id,
                request,
                result_type=WorkerResponse,
                summary=summary or worker.worker_id,
                start_to_close_timeout=options["start_to_close_timeout"],
                retry_policy=options["retry_policy"],
                local_retry_threshold=LOCAL_RETRY_THRESHOLD,
            )
        else:
            result = await workflow.execute_activity(
                worker.worker_id,
                request,
                # an external worker's reply is checked here, not trusted to decode
                result_type=RawValue if external else WorkerResponse,
                summary=summary or worker.worker_id,
                priority=priority,
                **options,
            )
    except (ActivityError, ApplicationError, CancelledError) as e:
        if not (isinstance(e, ActivityError) or local):
            raise
        # a local activity's application failure arrives as it was raised, unwrapped
        cause = e.cause if isinstance(e, ActivityError) else e
        message = failure_text(cause or e)
        code = error_code_of(e)
        details = error_details(e)
        if external and isinstance(e, ActivityError):
            code, details, message = foreign_failure(worker, e, message)
        attempts = _attempt_in(details, "context")
        if isinstance(cause, TemporalTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START:
            timeout_s = options["schedule_to_start_timeout"]
            waited = timeout_s.total_seconds() if timeout_s else 0.0
            message = (
                f"no worker polled task queue {options['task_queue']!r} for "
                f"{worker.worker_id!r} within {waited:g}s (the pipeline deadline); "
                "is its process running?"
            )
            return StepResult(
                status="failed",
                attempts=0,  # no attempt started
                error_code=ErrorCode.TIMEOUT.value,
                error_message=message,
            )
        if not attempts:
            # The failure did not say (a Temporal timeout, a worker's bare exception):
            # all attempts if the policy ran out, else at least the one that failed.
            if isinstance(e, ActivityError) and not local:
                ran_out = e.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED
            else:  # a local activity's failure states no usable retry state
                ran_out = _retried(cause, options["retry_policy"])
            attempts = (options["retry_policy"].maximum_attempts or 1) if ran_out else 1
        usage, warnings = _usage_of(details), []
        if (
            not local
            and isinstance(cause, TemporalTimeout)
            and cause.type in (TimeoutType.START_TO_CLOSE, TimeoutType.HEARTBEAT)
        ):
            most = _most_per_attempt(worker, admission, request)
            usage, lost = _lost_usage(cause, attempts, most)
            if lost:
                warnings.append(
                    {
                        "code": USAGE_ESTIMATED,
                        "message": estimated_message(lost),
                        "field": "usage",
                    }
                )
        return StepResult(
            status="failed",
            attempts=attempts,
            error_code=code,
            error_message=message,
            reasons=list(details.get("reasons") or []),
            usage=usage,
            warnings=warnings,
        )
    if isinstance(result, RawValue):
        checked = check_external_response(worker, result)
        if isinstance(checked, StepResult):
            return checked
        response = checked
    else:
        response = result
    return StepResult(
        status=response.status,
        outputs=response.outputs,
        attempts=response.observability.attempt,
        warnings=[w.model_dump(mode="json") for w in response.warnings],
        artifacts=[a.model_dump(mode="json") for a in response.artifacts],
        usage=response.usage,
        cached=response.cached,
    )


def _request(call: WorkerCall, admission: Admission | None) -> WorkerRequest:
    """The envelope of ``call`` under what the budget admitted (draws one ``uuid4``)."""
    ctx = call.context
    timeout = call.timeout_seconds
    if admission is not None and admission.timeout_seconds is not None:
        timeout = admission.timeout_seconds
    constraints = RequestConstraints(
        timeout_seconds=timeout,
        max_tokens=admission.max_tokens if admission else None,
        max_external_calls=admission.max_external_calls if admission else None,
    )
    return WorkerRequest(
        worker_id=call.worker.worker_id,
        version=call.worker.version,
        idempotency_key=call.key,
        step_id=ctx.step_id,
        tenant=ctx.tenant,
        trace=TraceContext(trace_id=ctx.trace_id, span_id=workflow.uuid4().hex[:16]),
        input=call.input,
        constraints=constraints,
        cache=call.cache,
    )


@dataclass(frozen=True)
class ItemEnd:
    """How one item of an items task ended (:func:`call_items`): its ``result``, and
    for a failure whether the workflow may run it again (``retryable``) and after how
    long at least (``retry_after``, what the worker asked for)."""

    result: StepResult
    retryable: bool = False
    retry_after: float | None = None


async def call_items(
    calls: list[tuple[WorkerCall, Admission | None]],
    attempts: list[int],
    max_parallel: int,
    summary: str,
) -> list[ItemEnd]:
    """ONE call of ``<worker_id>.items`` for several calls of one worker (a for_each's
    items, ``items_per_task``); never raises on a worker's failure.

    Each call goes as its own envelope, at its own attempt; the task runs at most
    ``max_parallel`` of them at once. Its start-to-close timeout is one item's
    (the longest admitted, with the usual grace) times the rounds the items need
    at that parallelism (``ceil(len / max_parallel)``). Temporal retries the task
    only when it fails as a whole (a worker gone, a timeout), per the spec's
    retry policy: an item's failure is its outcome, which the caller retries.
    When the task's attempts are spent, every item fails with the task's code.
    """
    worker, ctx = calls[0][0].worker, calls[0][0].context
    requests = [_request(c, a) for c, a in calls]
    longest = max(effective_timeout(worker, r.constraints) for r in requests)
    options = activity_options(
        worker,
        constraints=RequestConstraints(timeout_seconds=longest),
        max_attempts=calls[0][0].max_attempts,
        queue_suffix=ctx.queue_suffix,
    )
    rounds = -(-len(calls) // max_parallel)
    options["start_to_close_timeout"] = options["start_to_close_timeout"] * rounds
    policy = options["retry_policy"]
    task = ItemsTask(
        requests=[r.model_dump(mode="json", exclude_defaults=True) for r in requests],
        attempts=attempts,
        max_parallel=max_parallel,
    )
    try:
        done = await workflow.execute_activity(
            items_activity(worker.worker_id),
            task,
            result_type=ItemsResult,
            summary=summary,
            priority=ctx.priority,
            **options,
        )
    except ActivityError as e:
        message = failure_text(e.cause or e)
        failed = StepResult(
            status="failed",
            error_code=error_code_of(e),
            error_message=f"the items task failed as a whole: {message}",
        )
        return [ItemEnd(failed.model_copy(update={"attempts": n})) for n in attempts]
    no_retry = set(policy.non_retryable_error_types or ())
    out: list[ItemEnd] = []
    for n, outcome in zip(attempts, done.outcomes, strict=True):
        if outcome.response is not None:
            r = outcome.response
            out.append(
                ItemEnd(
                    StepResult(
                        status=r.status,
                        outputs=r.outputs,
                        attempts=n,
                        warnings=[w.model_dump(mode="json") for w in r.warnings],
                        artifacts=[a.model_dump(mode="json") for a in r.artifacts],
                        usage=r.usage,
                        cached=r.cached,
                    )
                )
            )
            continue
        err = outcome.error
        if err is None:  # a reply with neither: the worker side's bug, never data
            err = ErrorInfo(code=ErrorCode.INTERNAL, message="no outcome", retryable=False)
        code = err.code.value
        out.append(
            ItemEnd(
                StepResult(
                    status="failed",
                    attempts=n,
                    error_code=code,
                    error_message=err.message,
                    reasons=list(err.reasons),
                    usage=err.usage or Usage(),
                ),
                retryable=err.retryable and code not in no_retry,
                retry_after=err.retry_after_seconds,
            )
        )
    return out


def schedule_to_start_seconds(worker: WorkerSpec, admission: Admission | None) -> float | None:
    """How long a call of ``worker`` may wait for a poller: what is left of the
    pipeline deadline for an external worker (None: no deadline, or a worker
    this process serves itself, whose queue it polls)."""
    if worker.kind != "external" or admission is None:
        return None
    return admission.deadline_seconds


def external_wait(
    worker: WorkerSpec, admission: Admission | None, queue_suffix: str, now: float
) -> dict[str, Any] | None:
    """What the ``progress`` query shows for a running call of an external worker.

    The workflow sees only that the call is scheduled, not whether a worker
    has picked it up, so this names the queue and the bound, nothing more.
    """
    if worker.kind != "external":
        return None
    wait = schedule_to_start_seconds(worker, admission)
    return {
        "task_queue": worker.task_queue + queue_suffix,
        "schedule_to_start_timeout_seconds": wait,
        "schedule_to_start_deadline": None if wait is None else now + wait,
        "note": (
            "served by another process; the pipeline cannot see whether a worker has "
            "picked the call up"
            + (
                ", and fails it as timeout if none has by the deadline"
                if wait is not None
                else "; with no pipeline deadline it waits until one does"
            )
        ),
    }


def failure_text(error: BaseException) -> str:
    """What a failure says, without its code: ``str()`` of an ``ApplicationError`` is
    ``"<type>: <message>"``, and the type is the step's ``error_code`` already, so a
    message built from ``str()`` read ``invalid_input: invalid_input: ...`` once the
    code was put before it."""
    return error.message if isinstance(error, FailureError) else str(error)


def foreign_failure(
    worker: WorkerSpec, err: ActivityError, message: str
) -> tuple[str, dict[str, Any], str]:
    """An external worker's failure as (code, ErrorInfo as a dict, message).

    Built-ins raise through the runtime, which guarantees a stable code and a
    well-formed ``ErrorInfo``; an external worker may raise anything its SDK
    sends (``ValueError``, ``PanicError``) with any details. A type outside the
    code table is ``internal`` (a bug in the worker) with that type named, and
    details that are no ``ErrorInfo`` are dropped, so a misbehaving worker
    fails its step, never the pipeline.
    """
    code = error_code_of(err)
    cause = err.cause
    if isinstance(cause, ApplicationError) and code not in _CODES:
        message = (
            f"external worker {worker.worker_id!r} failed with type {code!r}, "
            f"which is no aiworker error code: {message}"
        )
        code = ErrorCode.INTERNAL.value
    raw = cause.details if isinstance(cause, ApplicationError) else ()
    if not raw:
        return code, {}, message
    try:
        info = ErrorInfo.model_validate(raw[0])
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        message += (
            f" (its ErrorInfo detail is malformed and ignored: "
            f"{messages.json_path(first['loc'])}: {first['msg']})"
        )
        return code, {}, message
    return code, info.model_dump(mode="json"), message


def check_external_response(worker: WorkerSpec, raw: RawValue) -> WorkerResponse | StepResult:
    """An external worker's reply as a ``WorkerResponse``, or an ``invalid_output``
    outcome saying what is wrong with it (paths and messages)."""
    try:
        doc = workflow.payload_converter().from_payload(raw.payload)
    except PAYLOAD_DECODE_ERRORS as e:  # a reply this process cannot decode: the worker's fault
        return _malformed(worker, 1, f"the reply cannot be decoded: {e}", [])
    attempt = _attempt_in(doc, "observability") or 1
    try:
        response = WorkerResponse.model_validate(doc)
    except ValidationError as e:
        reasons = [
            {
                "path": messages.json_path(err["loc"]),
                "message": err["msg"],
                "validator": err["type"],
            }
            for err in e.errors(include_url=False)[:100]
        ]
        return _malformed(worker, attempt, "the response envelope is malformed", reasons)
    if response.worker_id != worker.worker_id:
        reasons = [
            {
                "path": "$.worker_id",
                "message": f"{response.worker_id!r} answered a call of {worker.worker_id!r}",
            }
        ]
        return _malformed(worker, attempt, "the response names another worker", reasons)
    try:
        # The safe validator: nothing fetched, patterns on RE2, formats checked as
        # the worker runtime checks a built-in's outputs; pure computation.
        validator = safe_schema.validator(worker.output_schema)
        # In JSON terms, as the runtime reports a built-in's outputs.
        reasons = [
            {k: r[k] for k in ("path", "message", "validator")}
            for r in messages.reasons(safe_schema.errors(validator, response.outputs))
        ]
    except safe_schema.SchemaError as e:  # the spec's schema refused or not applicable here
        reasons = [{"path": "$", "message": f"the output schema cannot be applied: {e}"}]
    if reasons:
        out = _malformed(
            worker, response.observability.attempt, "the outputs fail the output schema", reasons
        )
        return out.model_copy(update={"usage": response.usage})
    return response


def _malformed(
    worker: WorkerSpec, attempt: int, what: str, reasons: list[dict[str, Any]]
) -> StepResult:
    first = f": {reasons[0]['path']}: {reasons[0]['message']}" if reasons else ""
    return StepResult(
        status="failed",
        attempts=attempt,
        error_code=ErrorCode.INVALID_OUTPUT.value,
        error_message=f"external worker {worker.worker_id!r}: {what}{first}",
        reasons=reasons,
    )


def _attempt_in(doc: Any, section: str) -> int:
    """The attempt a (possibly malformed) reply or ErrorInfo states in ``section``
    (``observability``, ``context``), else 0."""
    part = doc.get(section) if isinstance(doc, dict) else None
    attempt = part.get("attempt") if isinstance(part, dict) else None
    return attempt if isinstance(attempt, int) and attempt >= 1 else 0


def _retried(cause: BaseException | None, policy: RetryPolicy) -> bool:
    """Whether ``policy`` retries a failure like ``cause``: then a local activity
    that failed with it ran out of attempts (no schedule-to-close ends it sooner)."""
    if isinstance(cause, ApplicationError):
        return not cause.non_retryable and cause.type not in (
            policy.non_retryable_error_types or ()
        )
    return not isinstance(cause, CancelledError)


def _most_per_attempt(
    worker: WorkerSpec, admission: Admission | None, request: WorkerRequest
) -> Usage:
    """The most one attempt may consume, as far as the workflow knows: the output
    tokens and external calls the budget reserved for the call, else the spec's
    caps; and, for a worker that may call a model (``language_model`` in its
    allow-list), the prompt at one token per byte of its input, which no
    tokenizer exceeds (byte-level BPE), so the ledger never undercounts it."""
    c = worker.constraints
    prompt = 0
    if "language_model" in c.tools_allowed:
        prompt = len(json.dumps(request.input, ensure_ascii=False).encode("utf-8"))
    tokens = admission.max_tokens if admission and admission.max_tokens is not None else None
    calls = (
        admission.max_external_calls
        if admission and admission.max_external_calls is not None
        else None
    )
    return Usage(
        input_tokens=prompt,
        output_tokens=tokens if tokens is not None else (c.max_tokens or 0),
        external_calls=calls if calls is not None else (c.max_external_calls or 0),
    )


def _lost_usage(cause: TemporalTimeout, attempts: int, estimate: Usage) -> tuple[Usage, list[int]]:
    """What a call whose last attempt the server timed out consumed: what its last
    heartbeat said, with every attempt that never reported booked at ``estimate``
    (``schemas/lost_usage.py``)."""
    for d in cause.last_heartbeat_details:
        if isinstance(d, dict) and isinstance(d.get("usage"), dict):
            heard = _usage_of(d)
            last = LastBeat.of(d)
            if last is None:  # a worker from before attempts were marked
                return cover(heard, LastBeat(attempts, False, heard), attempts, estimate)
            return cover(heard, last, attempts, estimate)
    return cover(Usage(), NOTHING_HEARD, attempts, estimate)


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
