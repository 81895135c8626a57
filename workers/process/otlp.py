"""Metrics and logs over OTLP, beside the traces :mod:`.telemetry` exports.

Metrics: one source of truth, the ``prometheus_client`` registry
    Everything a worker process measures is already in one
    ``prometheus_client`` registry: aiworker's own metrics
    (:mod:`aiworker.activities.metrics`) and Temporal's worker and client
    metrics, which :mod:`.sdk_metrics` drains into it from the SDK's
    ``MetricBuffer``. :class:`RegistryMetricsExporter` reads that registry
    every ``OTEL_METRIC_EXPORT_INTERVAL`` milliseconds, turns each family
    into OpenTelemetry's metric data model (counters into monotonic
    cumulative sums, gauges into gauges, histograms into explicit-bucket
    histograms) and hands it to the OpenTelemetry SDK's own OTLP exporter.

    Why not the alternatives: registering every instrument a second time on
    an OpenTelemetry ``MeterProvider`` would make two sets of counters that
    every call site must keep in step (and drift silently when one is
    forgotten); and the SDK's ``OpenTelemetryConfig`` on the Temporal
    ``Runtime`` takes the runtime's single metrics slot, which the
    ``MetricBuffer`` behind ``/metrics`` already holds, and would cover only
    Temporal's metrics, not aiworker's. The SDK we run (opentelemetry-sdk
    1.45) has no public ``MetricProducer`` hook to feed external data into a
    ``MetricReader``, so the periodic read is this module's own small loop
    (one daemon thread), with the exporter, its batching, headers, TLS and
    retries all the SDK's. Values are cumulative since the process started,
    as Prometheus keeps them; ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``
    does not apply.

Logs: the JSON lines' records as OTLP log records
    :class:`OtlpLogHandler` sits on the root logger beside the JSON line
    handler and sends each record through the OpenTelemetry SDK's
    ``LoggerProvider`` (batched) to its OTLP exporter. Its attributes are the
    same stable fields the JSON line carries (``event``, ``worker_id``,
    ``attempt``, ``status``, ``error_code``, ``tenant``, ``workflow_id``...),
    taken from :meth:`~aiworker.workers.process.logs.JsonFormatter.fields` so
    the two never disagree, and redacted the same way; the record's trace and
    span ids are the line's ``trace_id`` and ``span_id``. The SDK's own
    ``LoggingHandler`` is deprecated and would export every ``LogRecord``
    attribute (``args``, ``msg``, the nested ``aiworker`` dict) rather than
    the stable fields.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as PromMetric

log = logging.getLogger("aiworker.telemetry")

SCOPE = InstrumentationScope("aiworker", None)

# Loggers whose records never go to OTLP: the exporter's own (an export failure
# logged and exported again would feed itself) and its HTTP stack's.
_SELF_LOGGERS = ("opentelemetry", "urllib3", "requests")


# --------------------------------------------------------------------- metrics


def _labels_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def registry_to_metrics(
    registry: CollectorRegistry, resource: Resource, start_ns: int, now_ns: int | None = None
) -> MetricsData:
    """One reading of ``registry`` in OpenTelemetry's metric data model.

    Args:
        registry: the process's registry (aiworker's metrics and the SDK's).
        resource: ``service.name`` and the other resource attributes.
        start_ns: when counting began, for series without a ``_created`` sample.
        now_ns: the reading's time (default now).
    """
    now = now_ns or time.time_ns()
    metrics: list[Metric] = []
    for family in registry.collect():
        converted = _convert(family, start_ns, now)
        if converted is not None:
            metrics.append(converted)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")],
                schema_url="",
            )
        ]
    )


def _created(family: PromMetric, start_ns: int) -> dict[tuple[tuple[str, str], ...], int]:
    out: dict[tuple[tuple[str, str], ...], int] = {}
    for s in family.samples:
        if s.name.endswith("_created"):
            out[_labels_key(s.labels)] = int(s.value * 1e9)
    return out


def _convert(family: PromMetric, start_ns: int, now: int) -> Metric | None:
    created = _created(family, start_ns)
    unit = family.unit or ""
    if family.type == "counter":
        points = [
            NumberDataPoint(
                attributes=dict(s.labels),
                start_time_unix_nano=created.get(_labels_key(s.labels), start_ns),
                time_unix_nano=now,
                value=_number(s.value),
            )
            for s in family.samples
            if s.name == family.name + "_total"
        ]
        data: Sum | Gauge | Histogram = Sum(
            data_points=points,
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=True,
        )
    elif family.type == "gauge":
        data = Gauge(
            data_points=[
                NumberDataPoint(
                    attributes=dict(s.labels),
                    start_time_unix_nano=start_ns,
                    time_unix_nano=now,
                    value=_number(s.value),
                )
                for s in family.samples
                if s.name == family.name
            ]
        )
    elif family.type == "histogram":
        data = Histogram(
            data_points=_histogram_points(family, created, start_ns, now),
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        )
    else:  # summary, info, stateset: nothing aiworker or the SDK records
        return None
    if not data.data_points:
        return None
    return Metric(name=family.name, description=family.documentation, unit=unit, data=data)


def _histogram_points(
    family: PromMetric, created: dict[tuple[tuple[str, str], ...], int], start_ns: int, now: int
) -> list[HistogramDataPoint]:
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    counts: dict[tuple[tuple[str, str], ...], float] = {}
    for s in family.samples:
        if s.name == family.name + "_bucket":
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            buckets.setdefault(_labels_key(labels), []).append((float(s.labels["le"]), s.value))
        elif s.name == family.name + "_sum":
            sums[_labels_key(s.labels)] = s.value
        elif s.name == family.name + "_count":
            counts[_labels_key(s.labels)] = s.value
    points = []
    for key, cumulative in buckets.items():
        cumulative.sort()
        bounds = [b for b, _ in cumulative if not math.isinf(b)]
        per_bucket: list[int] = []
        previous = 0.0
        for _, n in cumulative:  # Prometheus buckets count "<= le"; OTLP counts each bucket
            per_bucket.append(int(n - previous))
            previous = n
        if not cumulative or not math.isinf(cumulative[-1][0]):
            per_bucket.append(int(counts.get(key, previous) - previous))
        points.append(
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=created.get(key, start_ns),
                time_unix_nano=now,
                count=int(counts.get(key, previous)),
                sum=sums.get(key, 0.0),
                bucket_counts=per_bucket,
                explicit_bounds=bounds,
                # Prometheus keeps no min or max; None leaves OTLP's optional fields unset.
                min=None,  # type: ignore[arg-type]
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


class RegistryMetricsExporter:
    """Reads a ``prometheus_client`` registry periodically and exports it over OTLP.

    Args:
        registry: the registry ``/metrics`` serves.
        exporter: an OpenTelemetry SDK metric exporter (OTLP, console).
        resource: the process's resource (``service.name``...).
        interval: seconds between exports (``OTEL_METRIC_EXPORT_INTERVAL``).
        timeout: seconds one export may take (``OTEL_METRIC_EXPORT_TIMEOUT``).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        exporter: MetricExporter,
        resource: Resource,
        *,
        interval: float = 60.0,
        timeout: float = 30.0,
    ) -> None:
        self.registry = registry
        self.exporter = exporter
        self.resource = resource
        self.interval = interval
        self.timeout = timeout
        self.start_ns = time.time_ns()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def export_once(self) -> bool:
        """Read the registry and export it now; whether the exporter took it."""
        data = registry_to_metrics(self.registry, self.resource, self.start_ns)
        with self._lock:
            try:
                result = self.exporter.export(data, timeout_millis=self.timeout * 1000)
            except Exception:  # an exporter bug must not end the loop or the process
                log.exception(
                    "metrics export failed", extra={"aiworker": {"event": "otlp_export_failed"}}
                )
                return False
        return bool(result.name == "SUCCESS")

    def start(self) -> RegistryMetricsExporter:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="aiworker-otlp-metrics", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.export_once()

    def shutdown(self) -> None:
        """Stop the loop, export one last reading, and close the exporter."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout)
            self._thread = None
        self.export_once()
        self.exporter.shutdown(timeout_millis=self.timeout * 1000)


# ------------------------------------------------------------------------ logs


def _severity(levelno: int) -> SeverityNumber:
    if levelno >= logging.CRITICAL:
        return SeverityNumber.FATAL
    if levelno >= logging.ERROR:
        return SeverityNumber.ERROR
    if levelno >= logging.WARNING:
        return SeverityNumber.WARN
    if levelno >= logging.INFO:
        return SeverityNumber.INFO
    return SeverityNumber.DEBUG


_SEVERITY_TEXT = {"WARNING": "WARN", "CRITICAL": "FATAL"}


def _attribute(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    import json

    return json.dumps(value, default=str, ensure_ascii=False)


def _trace_context(fields: dict[str, Any]) -> otel_context.Context:
    """A context whose span is the line's ``trace_id``/``span_id`` (or the empty one)."""
    try:
        trace_id = int(str(fields.get("trace_id", "")), 16)
        span_id = int(str(fields.get("span_id", "")), 16)
    except ValueError:
        return otel_context.Context()
    if not trace_id or not span_id:
        return otel_context.Context()
    span = NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )
    return trace.set_span_in_context(span, otel_context.Context())


class OtlpLogHandler(logging.Handler):
    """Sends every log record to a :class:`LoggerProvider` as an OTLP log record.

    Its formatter is a :class:`~aiworker.workers.process.logs.JsonFormatter`
    (so :func:`~aiworker.workers.process.logs.redact_also` reaches it too);
    the record's body is the message, its attributes the JSON line's fields.

    Args:
        provider: the logger provider whose processor batches to the exporter.
        secrets: values to redact, as the JSON lines do.
    """

    #: configure_logging keeps handlers that say this (it replaces the others).
    keep_on_reconfigure = True

    def __init__(self, provider: LoggerProvider, secrets: Iterable[str] = ()) -> None:
        from aiworker.workers.process.logs import JsonFormatter, Redactor

        super().__init__()
        self.provider = provider
        self._closed = False
        self.setFormatter(JsonFormatter(Redactor(secrets)))

    def emit(self, record: logging.LogRecord) -> None:
        from aiworker.workers.process.logs import JsonFormatter

        if record.name.startswith(_SELF_LOGGERS):
            return
        formatter = self.formatter
        if not isinstance(formatter, JsonFormatter):
            return
        try:
            fields = formatter.fields(record)
            fields = formatter.redact.value(fields)
            body = formatter.redact(record.getMessage())
            attributes = {
                k: _attribute(v)
                for k, v in fields.items()
                if k not in ("ts", "level", "message") and v is not None
            }
            self.provider.get_logger(record.name).emit(
                timestamp=int(record.created * 1e9),
                context=_trace_context(fields),
                severity_number=_severity(record.levelno),
                severity_text=_SEVERITY_TEXT.get(record.levelname, record.levelname),
                body=body,
                attributes=attributes,
            )
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        if not self._closed:
            self.provider.force_flush()

    def close(self) -> None:
        """No more flushes (logging flushes every handler again at exit)."""
        self._closed = True
        super().close()
