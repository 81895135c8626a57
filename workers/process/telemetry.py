"""Telemetry wiring of every aiworker process: traces, SDK metrics, Core logs,
and metrics and logs over OTLP.

Traces
    The SDK's own OpenTelemetry integration,
    :class:`temporalio.contrib.opentelemetry.TracingInterceptor`, sits on every
    client (and through the client on every worker built from it), so one
    trace runs from ``aiworker run`` (``StartWorkflow``) through the workflow
    (``RunWorkflow``, ``StartActivity``) to every activity attempt
    (``RunActivity``), under which each worker call has its own span
    (:mod:`aiworker.activities.call_telemetry`, an activity interceptor). We
    use the SDK's interceptor rather than its ``OpenTelemetryPlugin``: the
    plugin is marked experimental and only shows workflow spans once the
    workflow has completed, while operators want to see a long pipeline's
    activity spans while it runs; the interceptor's workflow spans have zero
    duration instead, which the activity spans make up for.

    The tracer provider is the OpenTelemetry SDK's, configured only by the
    standard ``OTEL_*`` variables (``OTEL_SERVICE_NAME``,
    ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``..._TRACES_ENDPOINT``, ``..._HEADERS``,
    ``..._PROTOCOL``, ``OTEL_TRACES_EXPORTER``, ``OTEL_SDK_DISABLED``). Spans
    are always created, so trace and span ids reach logs and worker
    responses; they are exported over OTLP (http/protobuf) only when an OTLP
    endpoint is set, so an unconfigured process exports nothing and reports
    no error.

SDK metrics
    Temporal's own worker and client metrics (and anything recorded through
    ``workflow.metric_meter()``) are recorded into a
    :class:`temporalio.runtime.MetricBuffer` and drained into the process's
    ``prometheus_client`` registry (:mod:`aiworker.workers.process.sdk_metrics`), so
    one ``/metrics`` port serves both aiworker's and the SDK's metrics.

Core logs
    Temporal Core (Rust) writes its warnings straight to stderr unless told
    otherwise; the runtime forwards them into the ``temporalio.core`` Python
    logger so they come out as JSON lines like everything else.

OTLP metrics and logs
    Configured by the standard variables like the traces
    (``OTEL_METRICS_EXPORTER`` / ``OTEL_LOGS_EXPORTER``, default ``otlp``;
    ``OTEL_EXPORTER_OTLP_[METRICS_|LOGS_]ENDPOINT``, ``..._PROTOCOL``,
    ``..._HEADERS``; ``OTEL_METRIC_EXPORT_INTERVAL``), exported only when an
    endpoint is set. Metrics are the process's ``prometheus_client``
    registry (aiworker's and the SDK's metrics) read periodically; log
    records are the JSON lines' records with their stable fields as
    attributes (:mod:`aiworker.workers.process.otlp` says why so).

Pipelines by terminal status
    ``PipelineWorkflow`` counts itself (``aiworker_pipelines``, labels status,
    pipeline, tenant) through the replay-safe ``workflow.metric_meter()``; the
    SDK metrics collector is what brings that counter to ``/metrics``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from aiworker.workers.process.otlp import OtlpLogHandler, RegistryMetricsExporter
from aiworker.workers.process.sdk_metrics import SdkMetricsCollector

log = logging.getLogger("aiworker.telemetry")

DEFAULT_SERVICE_NAME = "aiworker"
PIPELINES_METRIC = "aiworker_pipelines"


# --------------------------------------------------------------------- traces


def _env_true(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# The OpenTelemetry SDK's exporter class of each signal, by protocol and module.
_EXPORTERS: dict[str, dict[str, tuple[str, str]]] = {
    "traces": {
        "http/protobuf": (
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
            "OTLPSpanExporter",
        ),
        "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
        "console": ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
    },
    "metrics": {
        "http/protobuf": (
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            "OTLPMetricExporter",
        ),
        "grpc": ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
        "console": ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
    },
    "logs": {
        "http/protobuf": (
            "opentelemetry.exporter.otlp.proto.http._log_exporter",
            "OTLPLogExporter",
        ),
        "grpc": ("opentelemetry.exporter.otlp.proto.grpc._log_exporter", "OTLPLogExporter"),
        "console": ("opentelemetry.sdk._logs.export", "ConsoleLogRecordExporter"),
    },
}


def _exporter_from_env(environ: Mapping[str, str], signal: str) -> Any | None:
    """The exporter ``OTEL_<SIGNAL>_EXPORTER`` and the OTLP variables ask for, or None.

    ``otlp`` (the default) exports only when an endpoint is set
    (``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` as is, or
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` plus ``/v1/<signal>`` over http/protobuf);
    the protocol is ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]PROTOCOL``. Headers,
    timeout, TLS and compression the exporter reads from its variables itself.
    """
    import importlib

    upper = signal.upper()
    kinds = [
        k.strip().lower()
        for k in environ.get(f"OTEL_{upper}_EXPORTER", "otlp").split(",")
        if k.strip()
    ]
    if "console" in kinds:
        module, name = _EXPORTERS[signal]["console"]
        return getattr(importlib.import_module(module), name)()
    if "otlp" not in kinds:
        return None
    own_endpoint = environ.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    endpoint = own_endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    protocol = (
        environ.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        module, name = _EXPORTERS[signal]["grpc"]
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc, "
                "which is not installed; %s are not exported (use http/protobuf)",
                signal,
                extra={"aiworker": {"event": "otlp_exporter_missing"}},
            )
            return None
        return cls()
    module, name = _EXPORTERS[signal]["http/protobuf"]
    if not own_endpoint:
        endpoint = endpoint.rstrip("/") + f"/v1/{signal}"
    return getattr(importlib.import_module(module), name)(endpoint=endpoint)


def span_exporter_from_env(environ: Mapping[str, str]) -> SpanExporter | None:
    """The span exporter the ``OTEL_*`` variables ask for, or None to export nothing."""
    exporter: SpanExporter | None = _exporter_from_env(environ, "traces")
    return exporter


def metric_exporter_from_env(environ: Mapping[str, str]) -> MetricExporter | None:
    """The metric exporter ``OTEL_METRICS_EXPORTER`` and the OTLP variables ask for."""
    if _env_true(environ, "OTEL_SDK_DISABLED"):
        return None
    exporter: MetricExporter | None = _exporter_from_env(environ, "metrics")
    return exporter


def log_exporter_from_env(environ: Mapping[str, str]) -> LogRecordExporter | None:
    """The log record exporter ``OTEL_LOGS_EXPORTER`` and the OTLP variables ask for."""
    if _env_true(environ, "OTEL_SDK_DISABLED"):
        return None
    exporter: LogRecordExporter | None = _exporter_from_env(environ, "logs")
    return exporter


def resource_from_env(
    environ: Mapping[str, str], service_name: str = DEFAULT_SERVICE_NAME
) -> Resource:
    """``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``, else ``service_name``."""
    resource = Resource.create()
    if environ.get("OTEL_SERVICE_NAME"):
        resource = resource.merge(Resource({SERVICE_NAME: environ["OTEL_SERVICE_NAME"]}))
    elif str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith(
        "unknown_service"
    ):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    return resource


def tracer_provider_from_env(
    environ: Mapping[str, str] | None = None, service_name: str = DEFAULT_SERVICE_NAME
) -> TracerProvider | None:
    """A tracer provider configured by the ``OTEL_*`` variables (None if the SDK is disabled)."""
    env = os.environ if environ is None else environ
    if _env_true(env, "OTEL_SDK_DISABLED"):
        return None
    # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
    provider = TracerProvider(resource=resource_from_env(env, service_name))
    exporter = span_exporter_from_env(env)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _millis(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, default))
    except ValueError:
        return default / 1000
    return (value if value > 0 else default) / 1000


def install_tracer_provider(provider: TracerProvider | None) -> trace.TracerProvider:
    """Make ``provider`` the global one unless an SDK provider is already installed.

    OpenTelemetry allows one global provider per process; a second call (tests,
    ``aiworker dev`` after ``aiworker run`` in one interpreter) keeps the first.
    """
    current = trace.get_tracer_provider()
    if provider is not None and isinstance(current, trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return trace.get_tracer_provider()


def otlp_header_secrets(environ: Mapping[str, str]) -> list[str]:
    """Values of ``OTEL_EXPORTER_OTLP_*HEADERS`` (often API keys), for log redaction."""
    out = []
    for key, value in environ.items():
        if key.startswith("OTEL_EXPORTER_OTLP") and key.endswith("HEADERS"):
            for pair in value.split(","):
                if "=" in pair:
                    v = pair.split("=", 1)[1].strip()
                    if v:
                        out.append(v)
    return out


# ----------------------------------------------------------------- bundle


class Telemetry:
    """One process's telemetry: Temporal runtime, interceptors, SDK metrics, tracer.

    Build it once in ``main()`` before connecting; pass it to
    :func:`workers.client.temporal_client.connect`. ``start()`` begins draining SDK
    metrics; ``shutdown()`` flushes spans still waiting for export.

    Args:
        environ: where the ``OTEL_*`` variables come from (default ``os.environ``).
        sdk_metrics: collect the SDK's metrics (worker processes); a one-shot
            CLI client has no ``/metrics`` and leaves this off.
        tracer_provider: an explicit provider (tests); default from ``environ``.
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` says otherwise.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        sdk_metrics: bool = True,
        tracer_provider: TracerProvider | None = None,
        service_name: str = DEFAULT_SERVICE_NAME,
        drain_interval: float = 1.0,
    ) -> None:
        env = os.environ if environ is None else environ
        self.secrets = otlp_header_secrets(env)
        self.resource = resource_from_env(env, service_name)
        self._metric_exporter = metric_exporter_from_env(env)
        self._metric_interval = _millis(env, "OTEL_METRIC_EXPORT_INTERVAL", 60_000)
        self._metric_timeout = _millis(env, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000)
        self.metrics_export: RegistryMetricsExporter | None = None
        self.logger_provider: LoggerProvider | None = None
        self.log_handler: OtlpLogHandler | None = None
        log_exporter = log_exporter_from_env(env)
        if log_exporter is not None:
            self._install_log_handler(log_exporter)
        installed = install_tracer_provider(
            tracer_provider or tracer_provider_from_env(env, service_name)
        )
        # The global provider wins: the runtime's spans come from it too, and
        # one process must not split its spans over two providers.
        self.tracer_provider = installed if isinstance(installed, TracerProvider) else None
        self.tracing = TracingInterceptor(
            tracer=installed.get_tracer("temporalio.contrib.opentelemetry")
        )
        self.buffer = (
            MetricBuffer(100_000, MetricBufferDurationFormat.SECONDS) if sdk_metrics else None
        )
        self.runtime = Runtime(
            telemetry=TelemetryConfig(
                metrics=self.buffer,
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                    forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")),
                ),
            )
        )
        self.sdk_metrics = (
            SdkMetricsCollector(self.buffer, interval=drain_interval) if self.buffer else None
        )

    def _install_log_handler(self, exporter: LogRecordExporter) -> None:
        """Every log record of the process also as an OTLP log record (one handler a process)."""
        from aiworker.workers.process.logs import JsonFormatter

        root = logging.getLogger()
        if any(isinstance(h, OtlpLogHandler) for h in root.handlers):
            return  # an earlier Telemetry of this process sends them already
        # The secrets the JSON lines redact (configure_logging ran first, or adds them later).
        secrets = list(self.secrets)
        for h in root.handlers:
            if isinstance(h.formatter, JsonFormatter):
                secrets.extend(h.formatter.redact.secrets)
        self.logger_provider = LoggerProvider(resource=self.resource)
        self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
        self.log_handler = OtlpLogHandler(self.logger_provider, secrets)
        root.addHandler(self.log_handler)

    @property
    def interceptors(self) -> list[Any]:
        """Client interceptors; workers built from the client inherit them."""
        return [self.tracing]

    def register(self, registry: CollectorRegistry) -> None:
        """Expose the SDK's metrics on ``registry`` (the one ``/metrics`` serves)."""
        if self.sdk_metrics is not None:
            registry.register(self.sdk_metrics)
        if self._metric_exporter is not None and self.metrics_export is None:
            # The same registry /metrics serves, so OTLP and Prometheus never disagree.
            self.metrics_export = RegistryMetricsExporter(
                registry,
                self._metric_exporter,
                self.resource,
                interval=self._metric_interval,
                timeout=self._metric_timeout,
            )

    def start(self) -> Telemetry:
        """Start draining SDK metrics in the background."""
        if self.sdk_metrics is not None:
            self.sdk_metrics.start()
        if self.metrics_export is not None:
            self.metrics_export.start()
        return self

    def shutdown(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Stop draining, export the last metrics, flush spans and log records
        waiting for export (each bounded by ``timeout``)."""
        if self.sdk_metrics is not None:
            self.sdk_metrics.stop()
        if self.metrics_export is not None:
            self.metrics_export.shutdown()
            self.metrics_export = None
        if self.log_handler is not None and self.logger_provider is not None:
            logging.getLogger().removeHandler(self.log_handler)
            self.log_handler.close()
            self.logger_provider.shutdown()
            self.log_handler = None
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(int(timeout.total_seconds() * 1000))
