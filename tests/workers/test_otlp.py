"""OTLP export configured only by the standard OTEL_* variables."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from support.loopback import Exchange, serve

from aiworker.workers.process.telemetry import (
    otlp_header_secrets,
    span_exporter_from_env,
    tracer_provider_from_env,
)


class _Collector:
    """An OTLP/HTTP endpoint that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str, bytes, str]] = []

    def handle(self, ex: Exchange) -> None:
        body = ex.body()
        self.received.append(
            (
                ex.target,
                ex.headers.get("Content-Type", ""),
                body,
                ex.headers.get("x-tenant-key", ""),
            )
        )
        ex.send(200, b"", "application/x-protobuf")


def test_nothing_is_exported_when_unconfigured() -> None:
    assert span_exporter_from_env({}) is None
    assert span_exporter_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert (
        span_exporter_from_env(
            {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}
        )
        is None
    )
    assert tracer_provider_from_env({"OTEL_SDK_DISABLED": "true"}) is None
    provider = tracer_provider_from_env({})
    assert provider is not None
    # Spans still get ids (for logs and responses) without going anywhere.
    with provider.get_tracer("t").start_as_current_span("s") as span:
        assert span.get_span_context().is_valid
    assert provider.resource.attributes["service.name"] == "aiworker"
    provider.shutdown()
    assert isinstance(
        span_exporter_from_env({"OTEL_TRACES_EXPORTER": "console"}), ConsoleSpanExporter
    )
    assert isinstance(
        span_exporter_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}),
        OTLPSpanExporter,
    )


def test_spans_reach_an_otlp_http_endpoint(monkeypatch: Any) -> None:
    collector = _Collector()
    with serve(collector.handle) as server:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": server.base_url,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant-key=otlp-secret-123",
            "OTEL_SERVICE_NAME": "aiworker-test",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        provider = tracer_provider_from_env(env)
        assert provider is not None
        assert provider.resource.attributes["service.name"] == "aiworker-test"
        with provider.get_tracer("t").start_as_current_span("exported-span"):
            pass
        assert provider.force_flush(10_000)
        provider.shutdown()
    assert len(collector.received) >= 1
    path, ctype, body, key = collector.received[0]
    assert path == "/v1/traces"
    assert ctype == "application/x-protobuf"
    assert b"exported-span" in body
    assert key == "otlp-secret-123"
    assert otlp_header_secrets(env) == ["otlp-secret-123"]
