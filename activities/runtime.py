"""The worker runtime: one wrapper runs every AI worker.

The module is long on purpose: the whole path of one call reads top to
bottom in :meth:`WorkerRuntime.run`; each part's mechanism has its own module.

Order, as in ARCHITECTURE.md's path of a request, and as :meth:`WorkerRuntime.run` reads::

    request -> validate input -> [step cache hit -> response]
            -> enforce constraints -> execute -> validate output
            -> [store in the step cache] -> response
    (log line, metrics, span: emitted around it by the activity interceptor)

A worker module holds only its domain logic (:class:`Worker`); everything
else happens here or beside it, the same way for every worker:

- contracts: the envelope (:meth:`WorkerRuntime.parse_request`) and the
  input and output schemas (:func:`conform`);
- the tenant registry, when there is one (:mod:`~aiworker.activities.tenancy`):
  an unknown tenant or a worker it may not call is ``invalid_input``, and its
  egress allow-list holds for the whole call;
- constraints: the spec's, tightened by the request
  (:mod:`~aiworker.activities.constraints`), a deadline, the toolbox's
  allow-list and quota (:mod:`~aiworker.activities.toolbox`);
- failures to stable codes, without secrets
  (:func:`~aiworker.activities.errors.map_failures`);
- usage across attempts (:mod:`~aiworker.activities.usage`);
- the step cache of a request with one (:mod:`~aiworker.activities.step_cache`);
- telemetry (:mod:`~aiworker.activities.call_telemetry`), which the runtime
  only feeds: the span, the log line and the metrics of a call belong to
  the interceptor that wraps its activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from opentelemetry import trace
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from aiworker.activities import lineage
from aiworker.activities.call_telemetry import (
    CallTelemetryInterceptor,
    WorkerCall,
    current_call,
    observe_call,
    tracer,
)
from aiworker.activities.constraints import tighten
from aiworker.activities.contracts import Contract
from aiworker.activities.errors import (
    Failure,
    InternalError,
    InvalidInputError,
    InvalidOutputError,
    WorkerError,
    WorkerTimeoutError,
    code_of,
    map_failures,
)
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.redaction import Redactor
from aiworker.activities.step_cache import StepCache
from aiworker.activities.tenancy import admit
from aiworker.activities.toolbox import Toolbox, tool_secrets
from aiworker.activities.tools.egress import tenant_egress
from aiworker.activities.tools.shares import tenant_share
from aiworker.activities.usage import UsageBook, heartbeating
from aiworker.config.settings import Settings
from aiworker.schemas import messages, names, safe_schema
from aiworker.schemas.batch import ItemOutcome, ItemsResult, ItemsTask
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.lost_usage import USAGE_ESTIMATED, estimated_message
from aiworker.schemas.protocol import (
    ArtifactRef,
    ErrorInfo,
    Observability,
    Usage,
    WarningInfo,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.refs import ReferenceLimitError, json_depth
from aiworker.schemas.spec import WorkerSpec


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
    timeout_seconds: float | None = None
    usage: UsageBook = field(default_factory=UsageBook)

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
        self.usage.spend(input_tokens, output_tokens)

    def spend_usage(self, usage: Usage, model: str = "") -> None:
        """Book a model reply's whole usage (tokens, cached tokens and ``cost_usd``) as
        soon as it is known; ``model`` labels the ``aiworker_cost_usd`` metric."""
        self.usage.spend_usage(usage, model)

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


def item_error(error: ApplicationError, worker_id: str, attempt: int) -> ErrorInfo:
    """An item's failure (as :func:`~aiworker.activities.errors.map_failures` raised it)
    as its ``ErrorInfo``: the stable code, retryable as the error says, usage so far."""
    detail = error.details[0] if error.details else None
    if isinstance(detail, dict):
        try:
            info = ErrorInfo.model_validate(detail)
            return info.model_copy(update={"retryable": not error.non_retryable})
        except ValidationError:
            pass
    return ErrorInfo(
        code=ErrorCode(code_of(error)),
        message=error.message,
        retryable=not error.non_retryable,
        worker_id=worker_id,
        context={"attempt": attempt},
    )


class Executes(Protocol):
    """What the runtime runs: a worker id and ``execute`` (an :class:`aiworker.Worker`,
    or a stand-in with the same two members). A worker that carries its own
    ``spec`` runs under it; otherwise the runtime's specs name it."""

    @property
    def worker_id(self) -> str: ...

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult: ...  # noqa: A002 (Worker.execute's documented signature)


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc) or "$"


# What a schema check raises, and the field its paths start from.
_CONTRACTS: dict[str, tuple[type[InvalidInputError | InvalidOutputError], str]] = {
    "input": (InvalidInputError, "input"),
    "output": (InvalidOutputError, "outputs"),
}


def conform(
    validator: Validator | Contract,
    value: Any,
    what: Literal["input", "output"],
    max_depth: int,
) -> None:
    """Check ``value`` against a spec's ``input_schema`` or ``output_schema`` (compiled,
    or a :class:`~aiworker.activities.contracts.Contract`: the same errors).

    ``invalid_input`` or ``invalid_output`` names the first failing field and
    rule, with every problem in ``reasons``. Nesting deeper than ``max_depth``
    is refused first: validation recurses per level.
    """
    error, root = _CONTRACTS[what]
    try:
        json_depth(value, max_depth)
    except ReferenceLimitError as e:
        raise error(f"{what}: {e} (AIWORKER_MAX_JSON_DEPTH)", field=root) from None
    with tracer.start_as_current_span(f"validate {what}") as span:
        try:
            if isinstance(validator, Contract):
                errors = validator.errors(value)
            else:
                errors = safe_schema.errors(validator, value)
        except SchemaError as e:
            raise error(f"{what}: {e.message}", field=root) from None
        span.set_attribute("aiworker.schema_errors", len(errors))
    if errors:
        problems = messages.reasons(errors)
        first = problems[0]
        raise error(
            f"{what} {first['path']}: {first['message']} (rule {first['validator']})",
            field=root + first["path"][1:],
            reasons=problems,
        )


class WorkerRuntime:
    """Runs workers under their specs; shared by every activity in a process."""

    def __init__(
        self,
        settings: Settings,
        specs: Mapping[str, WorkerSpec],
        *,
        tools: Mapping[str, Any] | None = None,
        metrics: WorkerMetrics | None = None,
        cache: StepCache | None = None,
    ) -> None:
        self.settings = settings
        self.specs = specs
        self.tools: dict[str, Any] = dict(tools or {})
        self.metrics = metrics
        self.cache = cache or StepCache.beside(self.tools.get("artifact_store"), settings.data_dir)
        self.redactor = Redactor([*settings.secret_values(), *tool_secrets(self.tools)])
        # Each spec's compiled contracts, found by the schema object itself: the
        # content-keyed cache would serialize the whole schema on every call to
        # find them. The contract keeps its schema so that the id is never another
        # object's.
        self._contracts: dict[tuple[int, bool], Contract] = {}

    def contract(self, schema: dict[str, Any], *, remember: bool = False) -> Contract:
        """The compiled contract of a spec's ``input_schema`` (``remember``: with the
        memo of valid parts, :mod:`~aiworker.activities.contracts`) or ``output_schema``."""
        hit = self._contracts.get((id(schema), remember))
        if hit is None or hit.schema is not schema:
            hit = Contract(schema, remember=remember)
            self._contracts[(id(schema), remember)] = hit
        return hit

    def validator(self, schema: dict[str, Any]) -> Validator:
        """The compiled validator of a spec's ``input_schema`` or ``output_schema``."""
        return self.contract(schema).validator

    def interceptor(self) -> CallTelemetryInterceptor:
        """The activity interceptor that emits the telemetry of this runtime's workers'
        calls into its metrics; register it on every Temporal worker serving them."""
        return CallTelemetryInterceptor(self.specs, self.metrics)

    def spec(self, worker_id: str) -> WorkerSpec:
        """The runtime's spec of ``worker_id``; ``invalid_input`` if it has none."""
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

    async def run(self, worker: Executes, raw: Any) -> WorkerResponse:
        """Run one attempt of ``worker`` on the request ``raw``; raise ``ApplicationError``.

        The steps of the runtime, in order: parse the request, validate
        input, (a step cache hit responds here), enforce constraints, execute,
        validate output, respond (a cached call stores the response). Every
        failure leaves as an ``ApplicationError`` whose type is a stable error
        code and whose ``ErrorInfo`` carries the call's usage so far; what the
        call tells its telemetry goes to the :class:`WorkerCall` the activity
        interceptor opened.
        """
        call = current_call(worker.worker_id)
        usage = UsageBook.of(call.info) if call.prior_usage else UsageBook()

        def failed(failure: Failure) -> ApplicationError:
            call.note({"error_code": failure.error.type, **failure.why})
            return usage.book(failure.error)

        with map_failures(
            worker.worker_id, call.attempt, redactor=self.redactor, on_failure=failed
        ):
            spec = self.spec_of(worker)
            request = self.parse_request(raw, spec)
            call.bind(request)
            policy = admit(self.settings, request)
            depth = self.settings.caps.max_json_depth
            conform(self.contract(spec.input_schema, remember=True), request.input, "input", depth)
            ctx = self._enforce_constraints(spec, request, call, usage)
            self._cover_lost(worker, ctx, call)
            model = self._cache_model(spec, request) if request.cache is not None else ""
            hit = await self.cache.lookup(request, spec, model)
            if hit is not None and (why := self._stale(spec, hit.outputs)) is not None:
                self.cache.refuse(self.cache.key(request, spec, model), why)
                call.note({"cache_refused": why})
                hit = None  # made under an output_schema that no longer holds: a miss
            if hit is not None:  # no tokens, no external calls: nothing for the budget
                call.note({"cached": True})
                kept = WorkerResult(hit.outputs, warnings=hit.warnings, artifacts=hit.artifacts)
                return self._respond(ctx, kept, call).model_copy(update={"cached": True})
            with (
                tenant_egress(policy.egress_allow if policy is not None else None),
                tenant_share(request.tenant),
            ):
                result = await self._execute(worker, ctx, call)
            conform(self.contract(spec.output_schema), result.outputs, "output", depth)
            response = self._respond(ctx, result, call)
            await self.cache.store(request, response, spec, model)
            return response

    @staticmethod
    def _cover_lost(worker: Executes, ctx: WorkerContext, call: WorkerCall) -> None:
        """Book earlier attempts that ended without reporting their usage at their
        maximum (:meth:`UsageBook.cover_lost`); a worker without ``usage_if_lost``
        (a stand-in) is booked at its caps."""
        if ctx.usage.attempt <= 1:
            return
        estimate_of = getattr(worker, "usage_if_lost", None)
        if estimate_of is not None:
            estimate = estimate_of(ctx, ctx.request.input)
        else:
            estimate = Usage(
                output_tokens=ctx.max_tokens or 0,
                external_calls=ctx.tools.max_external_calls or 0,
            )
        ctx.usage.cover_lost(estimate)
        if ctx.usage.lost:
            call.note({"usage_estimated_attempts": ctx.usage.lost})

    def _cache_model(self, spec: WorkerSpec, request: WorkerRequest) -> str:
        """The model behind a cached llm-call's or prompt worker's alias (provider,
        endpoint, model name), for the step cache's key; "" for other workers or an
        alias this process cannot resolve (the call itself reports that)."""
        alias: Any = None
        if spec.worker_id == names.LLM_CALL and isinstance(request.input, dict):
            alias = request.input.get("model")
        elif spec.kind == "prompt":
            alias = getattr(spec.implementation, "model", None)
        language_model = self.tools.get("language_model")
        if not isinstance(alias, str) or language_model is None:
            return ""
        try:
            cfg = language_model.resolve(alias)
        except WorkerError:
            return ""
        return f"{cfg.provider} {cfg.base_url} {cfg.model}"

    def _stale(self, spec: WorkerSpec, outputs: dict[str, Any]) -> str | None:
        """Why a cache hit's outputs fail the current ``output_schema`` (None: they pass)."""
        try:
            conform(
                self.contract(spec.output_schema),
                outputs,
                "output",
                self.settings.caps.max_json_depth,
            )
        except WorkerError as e:
            return str(e.message)
        return None

    async def run_items(self, worker: Executes, task: ItemsTask) -> ItemsResult:
        """Run the items of an items task (:mod:`~aiworker.schemas.batch`), at most
        ``task.max_parallel`` at once, each exactly as :meth:`run` runs one call
        (contracts, step cache, constraints, toolbox, its own telemetry at its own
        attempt); one outcome per item, in order. An item's failure is its outcome
        (the stable code, whether it may be retried, its usage), never the task's;
        only a cancellation leaves the task.

        Why not Temporal's retries per item: an activity succeeds or fails as a
        whole, so the items' retries are the calling workflow's (docs/foreach.md).
        """
        slots = asyncio.Semaphore(task.max_parallel)
        spec = self.spec_of(worker)

        async def one(raw: dict[str, Any], attempt: int) -> ItemOutcome:
            async with slots:
                try:
                    with observe_call(worker.worker_id, self.metrics) as call:
                        call.as_item(attempt)
                        return ItemOutcome(response=await self.run(worker, raw))
                except ApplicationError as e:
                    return ItemOutcome(error=item_error(e, worker.worker_id, attempt))

        async with heartbeating(spec.heartbeat_seconds):
            # each item in its own task: its telemetry's context stays its own
            outcomes = await asyncio.gather(
                *(one(r, a) for r, a in zip(task.requests, task.attempts, strict=True))
            )
        return ItemsResult(outcomes=list(outcomes))

    def _enforce_constraints(
        self, spec: WorkerSpec, request: WorkerRequest, call: WorkerCall, usage: UsageBook
    ) -> WorkerContext:
        """Enforce constraints: the context of one attempt under the tightened limits."""
        limits = tighten(spec, request.constraints)
        timeout = limits.timeout_seconds or spec.constraints.timeout_seconds
        usage.toolbox = Toolbox(
            self.tools,
            frozenset(limits.tools_allowed or ()),
            limits.max_external_calls,
            on_external_call=call.external_call,
        )
        usage.on_cost = call.cost
        info = call.info
        return WorkerContext(
            request=request,
            spec=spec,
            settings=self.settings,
            tools=usage.toolbox,
            attempt=call.attempt,
            deadline=call.started + timeout,
            max_tokens=limits.max_tokens,
            timeout_seconds=timeout,
            workflow_id=info.workflow_id if info else None,
            activity_id=info.activity_id if info else None,
            usage=usage,
        )

    async def _execute(
        self, worker: Executes, ctx: WorkerContext, call: WorkerCall
    ) -> WorkerResult:
        """Execute: the worker's own code, under its deadline, its lineage and heartbeats."""
        spec, request = ctx.spec, ctx.request
        call.note(
            {
                f"input.{k}": request.input[k]
                for k in spec.observability.log_fields
                if k in request.input
            }
        )
        deadline = asyncio.timeout(max(0.0, ctx.remaining()))
        lineage_of_call = lineage.CallLineage(
            tenant=request.tenant,
            worker_id=spec.worker_id,
            workflow_id=ctx.workflow_id,
            step_id=request.step_id or lineage.step_of(request.idempotency_key, ctx.workflow_id),
            attempt=ctx.attempt,
            trace_id=call.trace_id,
            idempotency_key=request.idempotency_key,
            activity_id=ctx.activity_id,
        )
        try:
            with lineage.bound(lineage_of_call):
                async with ctx.usage.heartbeats(spec.heartbeat_seconds), deadline:
                    result = await worker.execute(ctx, request.input)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise WorkerTimeoutError(
                f"worker {spec.worker_id} passed its deadline of {ctx.timeout_seconds:g}s",
                timeout_seconds=ctx.timeout_seconds,
            ) from None
        call.note(result.log_fields)
        if result.status not in names.OK_STATUSES:
            raise InternalError(f"worker returned status {result.status!r}")
        return result

    @staticmethod
    def _respond(ctx: WorkerContext, result: WorkerResult, call: WorkerCall) -> WorkerResponse:
        """The response to a successful attempt, with what the whole call cost."""
        status: Literal["succeeded", "partial"] = (
            "partial" if result.status == "partial" else "succeeded"
        )
        call.completed(
            status=status,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            model=str(result.log_fields.get("model") or ""),
        )
        spec = ctx.spec
        warnings = list(result.warnings)
        if ctx.usage.lost:
            warnings.append(
                WarningInfo(
                    code=USAGE_ESTIMATED, message=estimated_message(ctx.usage.lost), field="usage"
                )
            )
        return WorkerResponse(
            worker_id=spec.worker_id,
            version=spec.version,
            status=status,
            outputs=result.outputs,
            warnings=warnings,
            artifacts=result.artifacts,
            usage=ctx.usage.total(result.input_tokens, result.output_tokens),
            observability=Observability(
                trace_id=call.trace_id,
                span_id=call.span_id,
                worker_id=spec.worker_id,
                attempt=ctx.attempt,
                duration_ms=round(call.elapsed() * 1000, 3),
                timeout_seconds=ctx.timeout_seconds,
            ),
        )
