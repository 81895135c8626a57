"""Telemetry wiring of every aiworker process: traces, SDK metrics, Core logs.

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
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
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

from aiworker.workers.process.sdk_metrics import SdkMetricsCollector

log = logging.getLogger("aiworker.telemetry")

DEFAULT_SERVICE_NAME = "aiworker"
PIPELINES_METRIC = "aiworker_pipelines"


# --------------------------------------------------------------------- traces


def _env_true(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def span_exporter_from_env(environ: Mapping[str, str]) -> SpanExporter | None:
    """The span exporter the ``OTEL_*`` variables ask for, or None to export nothing."""
    kinds = [
        k.strip().lower()
        for k in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        if k.strip()
    ]
    if "console" in kinds:
        return ConsoleSpanExporter()
    if "otlp" not in kinds:
        return None
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return None
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc, "
                "which is not installed; traces are not exported (use http/protobuf)",
                extra={"aiworker": {"event": "otlp_exporter_missing"}},
            )
            return None
        exporter: SpanExporter = GrpcExporter()
        return exporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if not environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    # Headers, timeout, TLS and compression: the exporter reads its variables itself.
    return OTLPSpanExporter(endpoint=endpoint)


def tracer_provider_from_env(
    environ: Mapping[str, str] | None = None, service_name: str = DEFAULT_SERVICE_NAME
) -> TracerProvider | None:
    """A tracer provider configured by the ``OTEL_*`` variables (None if the SDK is disabled)."""
    env = os.environ if environ is None else environ
    if _env_true(env, "OTEL_SDK_DISABLED"):
        return None
    resource = Resource.create()
    if env.get("OTEL_SERVICE_NAME"):
        resource = resource.merge(Resource({SERVICE_NAME: env["OTEL_SERVICE_NAME"]}))
    elif str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith(
        "unknown_service"
    ):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
    provider = TracerProvider(resource=resource)
    exporter = span_exporter_from_env(env)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


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

    @property
    def interceptors(self) -> list[Any]:
        """Client interceptors; workers built from the client inherit them."""
        return [self.tracing]

    def register(self, registry: CollectorRegistry) -> None:
        """Expose the SDK's metrics on ``registry`` (the one ``/metrics`` serves)."""
        if self.sdk_metrics is not None:
            registry.register(self.sdk_metrics)

    def start(self) -> Telemetry:
        """Start draining SDK metrics in the background."""
        if self.sdk_metrics is not None:
            self.sdk_metrics.start()
        return self

    def shutdown(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Stop draining and flush spans waiting for export (bounded by ``timeout``)."""
        if self.sdk_metrics is not None:
            self.sdk_metrics.stop()
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(int(timeout.total_seconds() * 1000))
