"""The worker runtime: one wrapper runs every AI worker.

Order, as in the seed diagram::

    request -> validate input -> enforce constraints -> execute
            -> validate output -> log line, metrics, span -> response

A worker module holds only its domain logic (:class:`Worker`); everything
else — contracts, deadlines, tool allow-lists, quotas, error mapping,
telemetry — happens here, the same way for every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from aiworker.activities import lineage
from aiworker.activities.errors import (
    InternalError,
    InvalidInputError,
    InvalidOutputError,
    WorkerError,
    WorkerTimeoutError,
)
from aiworker.activities.jsonschema_cache import describe, validator_for
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.redaction import Redactor
from aiworker.activities.toolbox import Toolbox
from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode, is_retryable
from aiworker.schemas.options import effective_timeout
from aiworker.schemas.protocol import (
    ArtifactRef,
    Observability,
    RequestConstraints,
    Usage,
    WarningInfo,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.settings import Settings
from aiworker.schemas.spec import WorkerSpec

log = logging.getLogger("aiworker.worker")
tracer = trace.get_tracer("aiworker.runtime")

# The stable log fields of the attempt running in this asyncio task. Set and
# never reset: the SDK logs an attempt's outcome ("Completing activity as
# failed") after the activity and its spans have returned, in the same task,
# and that line should still say which trace and tenant it belongs to.
_attempt_fields: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "aiworker_attempt_fields", default=None
)


def attempt_log_fields() -> Mapping[str, Any]:
    """Trace and request fields of the worker attempt this task runs (empty if none)."""
    return _attempt_fields.get() or {}


@dataclass
class WorkerResult:
    """What a worker's ``execute`` returns; the runtime makes the response."""

    outputs: dict[str, Any]
    status: str = "succeeded"
    warnings: list[WarningInfo] = field(default_factory=list)
    artifacts: list[ArtifactRef] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    log_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkerContext:
    """Everything one worker call may use."""

    request: WorkerRequest
    spec: WorkerSpec
    settings: Settings
    tools: Toolbox
    attempt: int
    deadline: float
    max_tokens: int | None
    workflow_id: str | None = None
    activity_id: str | None = None
    spent_input_tokens: int = 0
    spent_output_tokens: int = 0
    timeout_seconds: float | None = None

    @property
    def tenant(self) -> str:
        """The tenant this call is for (scope files, artifacts and caches by it)."""
        return self.request.tenant

    @property
    def idempotency_key(self) -> str:
        """The same for every retry of one logical step: the key for side effects."""
        return self.request.idempotency_key

    @property
    def step_id(self) -> str | None:
        """The pipeline step this call runs, where the caller said."""
        return self.request.step_id

    def spend(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Book tokens a provider billed in this attempt as soon as they are known,
        so that they count against the budget even if the attempt then fails."""
        self.spent_input_tokens += max(0, input_tokens)
        self.spent_output_tokens += max(0, output_tokens)

    def remaining(self) -> float:
        """Seconds left before this attempt's deadline."""
        return max(0.0, self.deadline - time.monotonic())

    def span(
        self, name: str, **attributes: str | int | float | bool
    ) -> contextlib.AbstractContextManager[trace.Span]:
        """A child span of this attempt for one piece of the work (fetch, parse, model call).

        Attributes get the ``aiworker.`` prefix::

            with ctx.span("fetch", url=url) as span:
                ...
                span.set_attribute("aiworker.http_status", 200)
        """
        return tracer.start_as_current_span(
            name, attributes={f"aiworker.{k}": v for k, v in attributes.items()}
        )

    def heartbeat(self, *details: Any) -> None:
        """Report progress of long work to Temporal (no-op outside an activity)."""
        if activity.in_activity():
            activity.heartbeat(*details)


@dataclass
class _Spend:
    """What one activity has consumed: earlier attempts (carried in heartbeat
    details, so Temporal keeps them across retries) and the running one."""

    prior: Usage = field(default_factory=Usage)
    ctx: WorkerContext | None = None

    @classmethod
    def of(cls, info: activity.Info | None) -> _Spend:
        for d in info.heartbeat_details if info else ():
            if isinstance(d, dict) and isinstance(d.get("usage"), dict):
                try:
                    return cls(prior=Usage.model_validate(d["usage"]))
                except ValidationError:
                    break
        return cls()

    def this_attempt(self) -> Usage:
        c = self.ctx
        if c is None:
            return Usage()
        return Usage(
            input_tokens=c.spent_input_tokens,
            output_tokens=c.spent_output_tokens,
            external_calls=c.tools.external_calls,
        )

    def details(self, usage: Usage) -> list[dict[str, Any]]:
        """Heartbeat details that hand ``usage`` to the next attempt."""
        return [{"usage": usage.model_dump(mode="json")}] if usage != Usage() else []


class Executes(Protocol):
    """What the runtime runs: a worker id and ``execute`` (an :class:`aiworker.Worker`,
    or a stand-in with the same two members). A worker that carries its own
    ``spec`` runs under it; otherwise the runtime's specs name it."""

    @property
    def worker_id(self) -> str: ...

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult: ...


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc) or "$"


def tighten(spec: WorkerSpec, c: RequestConstraints) -> RequestConstraints:
    """Check that ``c`` only tightens ``spec``; ``invalid_input`` names the loosened field."""
    sc = spec.constraints
    if c.timeout_seconds is not None and c.timeout_seconds > sc.timeout_seconds:
        raise InvalidInputError(
            f"constraints.timeout_seconds={c.timeout_seconds} loosens the spec's "
            f"{sc.timeout_seconds}",
            field="constraints.timeout_seconds",
        )
    if c.max_tokens is not None and sc.max_tokens is not None and c.max_tokens > sc.max_tokens:
        raise InvalidInputError(
            f"constraints.max_tokens={c.max_tokens} loosens the spec's {sc.max_tokens}",
            field="constraints.max_tokens",
        )
    if c.tools_allowed is not None:
        extra = sorted(set(c.tools_allowed) - set(sc.tools_allowed))
        if extra:
            raise InvalidInputError(
                f"constraints.tools_allowed adds {extra} beyond the spec's {sc.tools_allowed}",
                field="constraints.tools_allowed",
            )
    if (
        c.max_external_calls is not None
        and sc.max_external_calls is not None
        and c.max_external_calls > sc.max_external_calls
    ):
        raise InvalidInputError(
            f"constraints.max_external_calls={c.max_external_calls} loosens the spec's "
            f"{sc.max_external_calls}",
            field="constraints.max_external_calls",
        )
    return RequestConstraints(
        timeout_seconds=effective_timeout(spec, c),
        max_tokens=min_optional(sc.max_tokens, c.max_tokens),
        tools_allowed=sorted(sc.tools_allowed if c.tools_allowed is None else c.tools_allowed),
        max_external_calls=min_optional(sc.max_external_calls, c.max_external_calls),
    )


def min_optional(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional limits (``None`` means no limit)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


class WorkerRuntime:
    """Runs workers under their specs; shared by every activity in a process."""

    def __init__(
        self,
        settings: Settings,
        specs: Mapping[str, WorkerSpec],
        *,
        tools: Mapping[str, Any] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.specs = specs
        self.tools: dict[str, Any] = dict(tools or {})
        self.metrics = metrics
        self.redactor = Redactor([*settings.secret_values(), *tool_secrets(self.tools)])

    def spec(self, worker_id: str) -> WorkerSpec:
        try:
            return self.specs[worker_id]
        except KeyError:
            raise InvalidInputError(f"unknown worker {worker_id!r}", field="worker_id") from None

    def spec_of(self, worker: Executes) -> WorkerSpec:
        """The contract ``worker`` runs under: its own spec, else the runtime's."""
        own = getattr(worker, "spec", None)
        if isinstance(own, WorkerSpec):
            return own
        return self.spec(worker.worker_id)

    def parse_request(self, raw: Any, spec: WorkerSpec) -> WorkerRequest:
        """Parse and check the envelope; ``invalid_input`` names the field."""
        worker_id = spec.worker_id
        if isinstance(raw, WorkerRequest):
            req = raw
        else:
            try:
                req = WorkerRequest.model_validate(raw)
            except ValidationError as e:
                err = e.errors()[0]
                raise InvalidInputError(
                    f"request field {_field_of(err['loc'])}: {err['msg']}",
                    field=_field_of(err["loc"]),
                    reasons=[
                        {"path": _field_of(x["loc"]), "message": x["msg"], "validator": x["type"]}
                        for x in e.errors()
                    ],
                ) from None
        if req.worker_id != worker_id:
            raise InvalidInputError(
                f"request for worker {req.worker_id!r} sent to worker {worker_id!r}",
                field="worker_id",
            )
        if req.version.split(".")[0] != spec.version.split(".")[0]:
            raise InvalidInputError(
                f"request speaks contract version {req.version!r}; worker {worker_id!r} "
                f"implements {spec.version!r}",
                field="version",
            )
        return req

    @staticmethod
    def check_schema(schema: dict[str, Any], value: Any, what: str) -> list[dict[str, str]]:
        with tracer.start_as_current_span(f"validate {what}") as span:
            errors = list(validator_for(schema).iter_errors(value))
            span.set_attribute("aiworker.schema_errors", len(errors))
            return describe(errors) if errors else []

    async def run(self, worker: Executes, raw: Any) -> WorkerResponse:
        """Run one attempt of ``worker`` on the request ``raw``; raise ``ApplicationError``."""
        started = time.monotonic()
        worker_id = worker.worker_id
        info = activity.info() if activity.in_activity() else None
        attempt = info.attempt if info else 1
        fields: dict[str, Any] = {
            "worker_id": worker_id,
            "attempt": attempt,
            "workflow_id": info.workflow_id if info else None,
            "run_id": info.workflow_run_id if info else None,
            "activity_id": info.activity_id if info else None,
        }
        tenant = "unknown"
        status = "failed"
        error_code: str | None = None
        spend = _Spend.of(info)
        if self.metrics:
            self.metrics.in_flight.labels(worker_id).inc()
        # A child of the SDK's RunActivity span (TracingInterceptor on the worker's
        # client), so each attempt has its own span under the pipeline's trace.
        with tracer.start_as_current_span(
            f"worker {worker_id}",
            kind=trace.SpanKind.INTERNAL,
            set_status_on_exception=False,
        ) as span:
            span.set_attribute("aiworker.worker_id", worker_id)
            span.set_attribute("aiworker.attempt", attempt)
            if info:
                span.set_attribute("aiworker.workflow_id", info.workflow_id or "")
                span.set_attribute("aiworker.activity_id", info.activity_id)
            try:
                spec = self.spec_of(worker)
                request = self.parse_request(raw, spec)
                tenant = request.tenant
                fields.update(tenant=tenant, idempotency_key=request.idempotency_key)
                span.set_attribute("aiworker.tenant", tenant)
                span.set_attribute("aiworker.idempotency_key", request.idempotency_key)
                trace_id, span_id = self._trace_ids(span, request)
                fields.update(trace_id=trace_id, span_id=span_id)
                _attempt_fields.set(
                    {
                        "trace_id": trace_id,
                        "span_id": span_id,
                        "worker_id": worker_id,
                        "tenant": tenant,
                        "idempotency_key": request.idempotency_key,
                    }
                )
                response = await self._run(
                    worker, spec, request, attempt, started, fields, info, spend
                )
                response = response.model_copy(
                    update={
                        "observability": Observability(
                            trace_id=trace_id,
                            span_id=span_id,
                            worker_id=worker_id,
                            attempt=attempt,
                            duration_ms=round((time.monotonic() - started) * 1000, 3),
                            timeout_seconds=response.observability.timeout_seconds,
                        )
                    }
                )
                status = response.status
                return response
            except WorkerError as e:
                error_code = e.code.value
                fields.update(error_code=error_code, error=e.message)
                if e.retry_after is not None:
                    fields["retry_after_seconds"] = e.retry_after
                failure, cause = self._redacted(e.to_application_error(worker_id, attempt), e)
                raise self._booked(failure, spend) from cause
            except ApplicationError as e:
                # A worker raised Temporal's error itself: keep it, but only with a stable code.
                if e.type in ErrorCode.__members__.values():
                    error_code = e.type
                    fields.update(error_code=error_code, error=e.message)
                    failure, cause = self._redacted(e, e.__cause__)
                    failure = self._booked(failure, spend)
                    if failure is e:
                        raise
                    raise failure from cause
                error_code = ErrorCode.INTERNAL.value
                fields.update(error_code=error_code, error=str(e))
                failure, cause = self._redacted(
                    InternalError(f"unexpected ApplicationError: {e}").to_application_error(
                        worker_id, attempt
                    ),
                    e,
                )
                raise self._booked(failure, spend) from cause
            except asyncio.CancelledError:
                status = "cancelled"
                error_code = "cancelled"
                fields.update(error_code="cancelled")
                raise
            except Exception as e:
                error_code = ErrorCode.INTERNAL.value
                fields.update(
                    error_code=error_code,
                    error=f"{type(e).__name__}: {e}",
                    traceback=traceback.format_exc(),
                )
                failure, cause = self._redacted(
                    InternalError(
                        f"internal error in worker {worker_id}: {type(e).__name__}: {e}"
                    ).to_application_error(worker_id, attempt),
                    e,
                )
                raise self._booked(failure, spend) from cause
            finally:
                duration = time.monotonic() - started
                fields.update(status=status, duration_ms=round(duration * 1000, 3))
                span.set_attribute("aiworker.status", status)
                if error_code is not None:
                    span.set_attribute("aiworker.error_code", error_code)
                    span.set_status(Status(StatusCode.ERROR, error_code))
                if "trace_id" not in fields:
                    # Failed before the envelope parsed: still findable in traces.
                    sc = span.get_span_context()
                    if sc.is_valid:
                        fields.update(
                            trace_id=format(sc.trace_id, "032x"),
                            span_id=format(sc.span_id, "016x"),
                        )
                level = logging.INFO if error_code is None else logging.WARNING
                if error_code == ErrorCode.INTERNAL.value:
                    level = logging.ERROR
                log.log(
                    level,
                    "worker.%s",
                    "completed" if error_code is None else "failed",
                    extra={"aiworker": {"event": "worker_call", **fields}},
                )
                if self.metrics:
                    m = self.metrics
                    m.in_flight.labels(worker_id).dec()
                    m.requests.labels(worker_id, status, error_code or "", tenant).inc()
                    m.duration.labels(worker_id, status).observe(duration)
                    if attempt > 1:
                        m.retries.labels(worker_id, tenant).inc()

    @staticmethod
    def _booked(failure: ApplicationError, spend: _Spend) -> ApplicationError:
        """``failure`` with what the call consumed so far, every attempt included.

        The usage goes into the failure's ``ErrorInfo`` (the workflow books it
        against the budget) and into the heartbeat details, which Temporal
        keeps for the next attempt, so retries add up instead of starting at 0.
        """
        usage = spend.prior + spend.this_attempt()
        if usage == Usage():
            return failure
        if activity.in_activity():
            activity.heartbeat(*spend.details(usage))
        if not failure.details or not isinstance(failure.details[0], dict):
            return failure
        info = {**failure.details[0], "usage": usage.model_dump(mode="json")}
        return _replaced(failure, failure.message, [info, *failure.details[1:]])

    def _redacted(
        self, failure: ApplicationError, cause: BaseException | None
    ) -> tuple[ApplicationError, BaseException | None]:
        """``failure`` without secrets (it goes into workflow history), and a safe cause.

        Messages built from exceptions may quote a configured secret (an API key
        in a URL, an echoed header). The failure keeps its code, retry
        behaviour and details, with every string redacted; a cause that quotes
        a secret is dropped rather than serialized beside it.
        """
        r = self.redactor
        message = r(failure.message)
        details = [r.value(d) for d in failure.details]
        cause_leaks = cause is not None and (
            r.contains_secret(str(cause)) or r(str(cause)) != str(cause)
        )
        if message == failure.message and details == list(failure.details) and not cause_leaks:
            return failure, cause
        clean = _replaced(failure, message, details)
        return clean, (None if cause_leaks or message != failure.message else cause)

    def _trace_ids(self, span: trace.Span, request: WorkerRequest) -> tuple[str | None, str | None]:
        sc = span.get_span_context()
        if sc.is_valid:
            return format(sc.trace_id, "032x"), format(sc.span_id, "016x")
        if request.trace is not None:
            return request.trace.trace_id, request.trace.span_id
        return None, None

    async def _run(
        self,
        worker: Executes,
        spec: WorkerSpec,
        request: WorkerRequest,
        attempt: int,
        started: float,
        fields: dict[str, Any],
        info: activity.Info | None,
        spend: _Spend,
    ) -> WorkerResponse:
        problems = self.check_schema(spec.input_schema, request.input, "input")
        if problems:
            first = problems[0]
            raise InvalidInputError(
                f"input {first['path']}: {first['message']} (rule {first['validator']})",
                field="input" + first["path"][1:],
                reasons=problems,
            )
        limits = tighten(spec, request.constraints)
        timeout = limits.timeout_seconds or spec.constraints.timeout_seconds
        metrics = self.metrics
        toolbox = Toolbox(
            self.tools,
            frozenset(limits.tools_allowed or ()),
            limits.max_external_calls,
            on_external_call=(
                (lambda tool: metrics.external_calls.labels(spec.worker_id, tool).inc())
                if metrics
                else None
            ),
        )
        ctx = WorkerContext(
            request=request,
            spec=spec,
            settings=self.settings,
            tools=toolbox,
            attempt=attempt,
            deadline=started + timeout,
            max_tokens=limits.max_tokens,
            timeout_seconds=timeout,
            workflow_id=info.workflow_id if info else None,
            activity_id=info.activity_id if info else None,
        )
        spend.ctx = ctx
        for name in spec.observability.log_fields:
            if name in request.input:
                fields[f"input.{name}"] = request.input[name]
        deadline = asyncio.timeout(max(0.0, ctx.remaining()))
        call = lineage.CallLineage(
            tenant=request.tenant,
            worker_id=spec.worker_id,
            workflow_id=ctx.workflow_id,
            step_id=request.step_id or lineage.step_of(request.idempotency_key, ctx.workflow_id),
            attempt=attempt,
            trace_id=fields.get("trace_id"),
            idempotency_key=request.idempotency_key,
            activity_id=ctx.activity_id,
        )
        try:
            with lineage.bound(call):
                async with self._heartbeats(spec, spend), deadline:
                    result = await worker.execute(ctx, request.input)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise WorkerTimeoutError(
                f"worker {spec.worker_id} passed its deadline of {timeout:g}s",
                timeout_seconds=timeout,
            ) from None
        fields.update(result.log_fields)
        if result.status not in names.OK_STATUSES:
            raise InternalError(f"worker returned status {result.status!r}")
        problems = self.check_schema(spec.output_schema, result.outputs, "output")
        if problems:
            first = problems[0]
            raise InvalidOutputError(
                f"output {first['path']}: {first['message']} (rule {first['validator']})",
                field="outputs" + first["path"][1:],
                reasons=problems,
            )
        span = trace.get_current_span()
        if result.input_tokens or result.output_tokens:
            span.set_attribute("aiworker.input_tokens", result.input_tokens)
            span.set_attribute("aiworker.output_tokens", result.output_tokens)
        if result.log_fields.get("model"):
            span.set_attribute("aiworker.model", str(result.log_fields["model"]))
        if self.metrics and (result.input_tokens or result.output_tokens):
            model = str(result.log_fields.get("model", ""))
            self.metrics.tokens.labels(spec.worker_id, model, "input").inc(result.input_tokens)
            self.metrics.tokens.labels(spec.worker_id, model, "output").inc(result.output_tokens)
        return WorkerResponse(
            worker_id=spec.worker_id,
            version=spec.version,
            status="partial" if result.status == "partial" else "succeeded",
            outputs=result.outputs,
            warnings=result.warnings,
            artifacts=result.artifacts,
            # this attempt's and the failed ones' before it: what the call cost
            usage=spend.prior
            + Usage(
                input_tokens=max(result.input_tokens, ctx.spent_input_tokens),
                output_tokens=max(result.output_tokens, ctx.spent_output_tokens),
                external_calls=toolbox.external_calls,
            ),
            observability=Observability(
                worker_id=spec.worker_id, attempt=attempt, timeout_seconds=timeout
            ),
        )

    @contextlib.asynccontextmanager
    async def _heartbeats(self, spec: WorkerSpec, spend: _Spend) -> AsyncIterator[None]:
        """Heartbeat in the background for workers whose spec asks for it (carrying
        the earlier attempts' usage, which a detail-less heartbeat would erase)."""
        if not spec.heartbeat_seconds or not activity.in_activity():
            yield
            return
        interval = max(0.5, spec.heartbeat_seconds / 3)

        async def beat() -> None:
            details = spend.details(spend.prior)
            while True:
                activity.heartbeat(*details)
                await asyncio.sleep(interval)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _replaced(failure: ApplicationError, message: str, details: list[Any]) -> ApplicationError:
    """``failure`` with another message and details; code and retry behaviour kept."""
    return ApplicationError(
        message,
        *details,
        type=failure.type,
        non_retryable=failure.non_retryable,
        next_retry_delay=failure.next_retry_delay,
        category=failure.category,
    )


def tool_secrets(tools: Mapping[str, Any]) -> list[str]:
    """Secrets the process's tools hold (a models file's API keys, say)."""
    out: list[str] = []
    for tool in tools.values():
        values = getattr(tool, "secret_values", None)
        if callable(values):
            out.extend(str(v) for v in values())
    return out


def retryable_code(code: str) -> bool:
    """Whether a code from a failure may be retried (unknown codes count as internal)."""
    try:
        return is_retryable(code)
    except ValueError:
        return True
