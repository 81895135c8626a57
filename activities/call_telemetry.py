"""The telemetry of each worker call: its span, its one log line, its metrics.

Cross-cutting, so it sits in an activity interceptor (as sdk-python's
``contrib/opentelemetry`` does for its spans), not in the runtime's body.
Every ``temporalio.worker.Worker`` that serves workers registers
:class:`CallTelemetryInterceptor` (``workers.process.worker.build_workers``, the
Lambda handler); around each attempt of a worker's activity it opens a
:class:`WorkerCall`, the runtime fills in what it learns on the way, and when
the activity returns or raises the call is emitted::

    RunActivity:<worker_id>            the SDK's TracingInterceptor (on the client)
    └── worker <worker_id>             this module: attributes, status, error code
        ├── validate input / output    the runtime
        └── fetch, model call, ...     the worker's own ``ctx.span(...)``
    then one log line (``event=worker_call``) and the metrics: requests,
    duration, retries, in-flight and tokens (external calls count as they happen)

:func:`observe_call` is that one piece of code: the interceptor calls it, and
so does :func:`aiworker.testing.run_worker`, which runs a worker without a
server. A runtime call outside both writes into a detached :class:`WorkerCall`
that nobody emits.

The outcome comes from what the activity raised: the runtime maps every
failure to an ``ApplicationError`` whose type is the stable error code
(:func:`~aiworker.activities.errors.map_failures`), and notes why on the call
(the message, a traceback for a bug) for the log line.

That line is the one line of a failed attempt: the SDK logs the same failure
again from the same task ("Completing activity as failed", a warning with a
traceback), which :class:`AlreadyLogged` drops for a failure the line already
told (every interceptor installs it on the ``temporalio.activity`` logger).
Activities that are no worker keep the SDK's line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Container, Iterator, Mapping
from contextvars import ContextVar
from decimal import Decimal
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from aiworker.activities.errors import code_of
from aiworker.activities.metrics import WorkerMetrics
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.protocol import WorkerRequest

log = logging.getLogger("aiworker.worker")
tracer = trace.get_tracer("aiworker.runtime")

_current: ContextVar[WorkerCall | None] = ContextVar("aiworker_worker_call", default=None)

# The stable log fields of the attempt running in this asyncio task. Set and
# never reset: the SDK logs an attempt's outcome ("Completing activity as
# failed") after the activity and its spans have returned, in the same task,
# and that line should still say which trace and tenant it belongs to.
_attempt_fields: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "aiworker_attempt_fields", default=None
)


# The failure this task's worker call logged; the SDK's own line about it is dropped.
_logged_failure: ContextVar[BaseException | None] = ContextVar(
    "aiworker_logged_failure", default=None
)


class AlreadyLogged(logging.Filter):
    """Drops a log record about a failure this task's ``worker_call`` line told."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record unless its exception is the one already logged."""
        told = _logged_failure.get()
        return told is None or record.exc_info is None or record.exc_info[1] is not told


def drop_sdk_duplicates() -> None:
    """Install :class:`AlreadyLogged` on the SDK's activity logger (once)."""
    sdk = logging.getLogger("temporalio.activity")
    if not any(isinstance(f, AlreadyLogged) for f in sdk.filters):
        sdk.addFilter(AlreadyLogged())


def attempt_log_fields() -> Mapping[str, Any]:
    """Trace and request fields of the worker attempt this task runs (empty if none)."""
    return _attempt_fields.get() or {}


class WorkerCall:
    """One attempt of a worker call as its telemetry sees it, filled in as it runs.

    Args:
        worker_id: the worker (the activity's name).
        span: the attempt's span (a non-recording one for a detached call).
        metrics: where the call counts (None: not counted).
    """

    def __init__(
        self, worker_id: str, span: trace.Span, metrics: WorkerMetrics | None = None
    ) -> None:
        self.started = time.monotonic()
        self.info = activity.info() if activity.in_activity() else None
        info = self.info
        self.worker_id = worker_id
        self.attempt = info.attempt if info else 1
        self.span = span
        self.metrics = metrics
        self.tenant = "unknown"
        self.trace_id: str | None = None
        self.span_id: str | None = None
        self.fields: dict[str, Any] = {
            "worker_id": worker_id,
            "attempt": self.attempt,
            "workflow_id": info.workflow_id if info else None,
            "run_id": info.workflow_run_id if info else None,
            "activity_id": info.activity_id if info else None,
        }
        self.status = "succeeded"
        self.error_code: str | None = None
        self._tokens: tuple[str, int, int] | None = None
        # False for an item of an items task: its earlier attempts were other tasks,
        # whose usage the workflow booked already (the task's heartbeats are not its own).
        self.prior_usage = True

    def as_item(self, attempt: int) -> None:
        """Make this call one item of an items task, at the item's own ``attempt``."""
        self.attempt = attempt
        self.prior_usage = False
        self.fields["attempt"] = attempt
        self.span.set_attribute("aiworker.attempt", attempt)

    def bind(self, request: WorkerRequest) -> None:
        """Note the parsed request: tenant, idempotency key and the trace ids it runs under."""
        self.tenant = request.tenant
        self.fields.update(tenant=request.tenant, idempotency_key=request.idempotency_key)
        self.span.set_attribute("aiworker.tenant", request.tenant)
        self.span.set_attribute("aiworker.idempotency_key", request.idempotency_key)
        sc = self.span.get_span_context()
        if sc.is_valid:
            self.trace_id, self.span_id = format(sc.trace_id, "032x"), format(sc.span_id, "016x")
        elif request.trace is not None:
            self.trace_id, self.span_id = request.trace.trace_id, request.trace.span_id
        self.fields.update(trace_id=self.trace_id, span_id=self.span_id)
        _attempt_fields.set(
            {
                "trace_id": self.trace_id,
                "span_id": self.span_id,
                "worker_id": self.worker_id,
                "tenant": request.tenant,
                "idempotency_key": request.idempotency_key,
            }
        )

    def note(self, fields: Mapping[str, Any]) -> None:
        """Add ``fields`` to the call's log line."""
        self.fields.update(fields)

    def external_call(self, tool: str) -> None:
        """Count one external call through ``tool`` (the toolbox calls this)."""
        if self.metrics:
            self.metrics.external_calls.labels(self.worker_id, tool).inc()

    def cost(self, model: str, usd: Decimal) -> None:
        """Count ``usd`` a model call of this attempt cost, as soon as it is booked:
        money is spent whatever the attempt's outcome."""
        if self.metrics:
            self.metrics.cost_usd.labels(self.tenant, model).inc(float(usd))

    def completed(self, *, status: str, input_tokens: int, output_tokens: int, model: str) -> None:
        """Note a successful outcome (``succeeded`` or ``partial``) and the tokens it used."""
        self.status = status
        if input_tokens or output_tokens:
            self.span.set_attribute("aiworker.input_tokens", input_tokens)
            self.span.set_attribute("aiworker.output_tokens", output_tokens)
            self._tokens = (model, input_tokens, output_tokens)
        if model:
            self.span.set_attribute("aiworker.model", model)

    def elapsed(self) -> float:
        """Seconds since the attempt started."""
        return time.monotonic() - self.started

    def _end(self, error: BaseException | None) -> None:
        """Emit the call: span status, the log line, the metrics."""
        if isinstance(error, asyncio.CancelledError):
            self.status = self.error_code = "cancelled"
        elif error is not None:
            self.status, self.error_code = "failed", code_of(error)
        duration = self.elapsed()
        status, code, span = self.status, self.error_code, self.span
        if code is not None:
            self.fields["error_code"] = code
        self.fields.update(status=status, duration_ms=round(duration * 1000, 3))
        span.set_attribute("aiworker.status", status)
        if code is not None:
            span.set_attribute("aiworker.error_code", code)
            span.set_status(Status(StatusCode.ERROR, code))
        if "trace_id" not in self.fields:
            # Failed before the envelope parsed: still findable in traces.
            sc = span.get_span_context()
            if sc.is_valid:
                self.fields.update(
                    trace_id=format(sc.trace_id, "032x"), span_id=format(sc.span_id, "016x")
                )
        level = logging.INFO if code is None else logging.WARNING
        if code == ErrorCode.INTERNAL.value:
            level = logging.ERROR
        log.log(
            level,
            "worker.%s",
            "completed" if code is None else "failed",
            extra={"aiworker": {"event": "worker_call", **self.fields}},
        )
        if error is not None and code is not None:
            _logged_failure.set(error)
        m = self.metrics
        if m is None:
            return
        wid = self.worker_id
        m.in_flight.labels(wid).dec()
        m.requests.labels(wid, status, code or "", self.tenant).inc()
        m.duration.labels(wid, status).observe(duration)
        if self.attempt > 1:
            m.retries.labels(wid, self.tenant).inc()
        if self._tokens and code is None:
            model, inp, out = self._tokens
            m.tokens.labels(wid, model, "input").inc(inp)
            m.tokens.labels(wid, model, "output").inc(out)


@contextlib.contextmanager
def observe_call(worker_id: str, metrics: WorkerMetrics | None = None) -> Iterator[WorkerCall]:
    """Open the telemetry of one attempt of ``worker_id`` for the block, and emit it after.

    The block's outcome is the call's: a clean exit is ``succeeded`` (or what
    the runtime noted), an exception fails it with the exception's stable
    code (see :func:`~aiworker.activities.errors.code_of`), a cancellation is
    ``cancelled``.
    """
    if metrics:
        metrics.in_flight.labels(worker_id).inc()
    # A child of the SDK's RunActivity span (TracingInterceptor on the worker's
    # client), so each attempt has its own span under the pipeline's trace.
    with tracer.start_as_current_span(
        f"worker {worker_id}", kind=trace.SpanKind.INTERNAL, set_status_on_exception=False
    ) as span:
        call = WorkerCall(worker_id, span, metrics)
        span.set_attribute("aiworker.worker_id", worker_id)
        span.set_attribute("aiworker.attempt", call.attempt)
        if call.info:
            span.set_attribute("aiworker.workflow_id", call.info.workflow_id or "")
            span.set_attribute("aiworker.activity_id", call.info.activity_id)
        token = _current.set(call)
        error: BaseException | None = None
        try:
            yield call
        except BaseException as e:
            error = e
            raise
        finally:
            _current.reset(token)
            call._end(error)


def current_call(worker_id: str) -> WorkerCall:
    """The call this task's interceptor opened, else a detached one nobody emits."""
    return _current.get() or WorkerCall(worker_id, trace.INVALID_SPAN)


class CallTelemetryInterceptor(Interceptor):
    """Emits the telemetry of each worker call (see the module doc).

    Activities whose name is not a worker id in ``worker_ids`` (the limiter's,
    say) run untouched.

    Args:
        worker_ids: the workers whose activities to observe (a spec mapping will do).
        metrics: where calls count (None: spans and log lines only).
    """

    def __init__(self, worker_ids: Container[str], metrics: WorkerMetrics | None = None) -> None:
        self.worker_ids = worker_ids
        self.metrics = metrics
        drop_sdk_duplicates()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:  # noqa: A002 (temporalio's interceptor signature)
        """Wrap each activity attempt (``temporalio.worker.Interceptor``)."""
        return _ObservedActivity(next, self)


class _ObservedActivity(ActivityInboundInterceptor):
    def __init__(self, inner: ActivityInboundInterceptor, root: CallTelemetryInterceptor) -> None:
        super().__init__(inner)
        self.root = root

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:  # noqa: A002 (temporalio's interceptor signature)
        worker_id = activity.info().activity_type
        if worker_id not in self.root.worker_ids:
            return await super().execute_activity(input)
        with observe_call(worker_id, self.root.metrics):
            return await super().execute_activity(input)
