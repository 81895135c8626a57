"""OTLP export configured only by the standard OTEL_* variables."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from aiworker.workers.telemetry import (
    otlp_header_secrets,
    span_exporter_from_env,
    tracer_provider_from_env,
)


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes, str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append(
            (
                self.path,
                self.headers.get("Content-Type", ""),
                body,
                self.headers.get("x-tenant-key", ""),
            )
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


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
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
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
    finally:
        server.shutdown()
        server.server_close()
    assert len(_Collector.received) >= 1
    path, ctype, body, key = _Collector.received[0]
    assert path == "/v1/traces"
    assert ctype == "application/x-protobuf"
    assert b"exported-span" in body
    assert key == "otlp-secret-123"
    assert otlp_header_secrets(env) == ["otlp-secret-123"]
