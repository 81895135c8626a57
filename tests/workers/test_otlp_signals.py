"""Metrics and logs over OTLP beside the traces, against a real OTLP receiver (rotel)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import running_stack
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from support.pipelines import one_step_pipeline
from support.rotel import Block, Rotel, running_rotel
from support.waiting import wait_until
from telemetry_helpers import (
    flaky_validator,
    span_provider,
    telemetry_client,
    workflow_id,
)
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.process.otlp import OtlpLogHandler
from aiworker.workers.process.telemetry import (
    Telemetry,
    log_exporter_from_env,
    metric_exporter_from_env,
)


@pytest.fixture
def rotel(tmp_path: Path) -> Iterator[Rotel]:
    with running_rotel(tmp_path) as r:
        yield r


def test_metrics_and_logs_export_only_when_configured() -> None:
    assert metric_exporter_from_env({}) is None
    assert log_exporter_from_env({}) is None
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert metric_exporter_from_env({**base, "OTEL_METRICS_EXPORTER": "none"}) is None
    assert log_exporter_from_env({**base, "OTEL_LOGS_EXPORTER": "none"}) is None
    assert metric_exporter_from_env({**base, "OTEL_SDK_DISABLED": "true"}) is None
    m = metric_exporter_from_env(base)
    assert isinstance(m, OTLPMetricExporter)
    assert m._endpoint == "http://127.0.0.1:4318/v1/metrics"
    lg = log_exporter_from_env(base)
    assert isinstance(lg, OTLPLogExporter)
    assert lg._endpoint == "http://127.0.0.1:4318/v1/logs"
    # A signal's own endpoint is used as it is.
    own = log_exporter_from_env({"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://h:1/logs-in"})
    assert isinstance(own, OTLPLogExporter) and own._endpoint == "http://h:1/logs-in"
    # Without an OTLP log exporter, no handler joins the root logger.
    t = Telemetry(environ={}, sdk_metrics=False, tracer_provider=span_provider())
    assert t.log_handler is None
    assert not any(isinstance(h, OtlpLogHandler) for h in logging.getLogger().handlers)
    t.shutdown()


def test_log_records_carry_the_stable_fields_redacted_and_the_span() -> None:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import (
        InMemoryLogRecordExporter,
        SimpleLogRecordProcessor,
    )

    from aiworker.workers.process.logs import configure_logging

    exporter = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    handler = OtlpLogHandler(provider)
    root = logging.getLogger()
    old = list(root.handlers), root.level
    root.addHandler(handler)
    try:
        # A reconfiguration keeps the OTLP handler and hands it the new secrets.
        configure_logging("INFO", ["s3cr3t-value"], stream=io.StringIO())
        assert handler in root.handlers
        with span_provider().get_tracer("t").start_as_current_span("call") as span:
            logging.getLogger("aiworker.worker").warning(
                "calling with s3cr3t-value",
                extra={
                    "aiworker": {"event": "worker_call", "worker_id": "validator", "attempt": 2}
                },
            )
        logging.getLogger("opentelemetry.exporter").warning("not sent back to itself")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in old[0]:
            root.addHandler(h)
        root.setLevel(old[1])
    (record,) = [r.log_record for r in exporter.get_finished_logs()]
    assert record.body == "calling with [REDACTED]"
    attrs = dict(record.attributes or {})
    assert attrs["event"] == "worker_call" and attrs["worker_id"] == "validator"
    assert attrs["attempt"] == 2 and attrs["logger"] == "aiworker.worker"
    assert attrs["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert record.trace_id == span.get_span_context().trace_id
    assert record.span_id == span.get_span_context().span_id
    assert record.severity_text == "WARN"
    assert "s3cr3t-value" not in repr(attrs)


def _metric(blocks: list[Block], name: str) -> list[dict[str, str]]:
    return [p for b in blocks if b.header.get("Name") == name for p in b.points]


async def test_worker_metrics_and_log_records_reach_an_otlp_receiver(
    env: WorkflowEnvironment, settings: Settings, rotel: Rotel
) -> None:
    await wait_until(rotel.ready, "rotel to listen")
    otel_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.endpoint,
        "OTEL_SERVICE_NAME": "aiworker-otlp-test",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
    }
    telemetry = Telemetry(environ=otel_env, tracer_provider=span_provider(), drain_interval=0.2)
    root = logging.getLogger()
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        assert telemetry.log_handler in root.handlers
        client = await telemetry_client(env, telemetry)
        async with running_stack(
            client, settings, replace_activities={names.VALIDATOR: flaky_validator(settings)}
        ) as stack:
            # The registry the stack's workers count in, as a worker process's /metrics.
            telemetry.register(stack.metrics.registry)
            telemetry.start()
            handle = await stack.start(one_step_pipeline(), id=workflow_id("otlp"))
            result = await handle.result()
        assert result.status == "succeeded"

        def requests_by_worker() -> list[dict[str, str]]:
            points = _metric(rotel.blocks("Metric"), "aiworker_requests")
            return [p for p in points if p.get("worker_id") == names.VALIDATOR]

        # Both attempts counted (an export may come between the two).
        points = await wait_until(
            lambda: (
                {p["status"] for p in requests_by_worker()} >= {"failed", "succeeded"}
                and requests_by_worker()
            ),
            "aiworker_requests of both attempts over OTLP",
        )
        assert all(p["tenant"] == "acme" for p in points)
        # The SDK's own metrics come through the same registry.
        await wait_until(
            lambda: any(
                b.header.get("Name", "").startswith("temporal_") for b in rotel.blocks("Metric")
            ),
            "a temporal_* SDK metric over OTLP",
        )
        metric = next(
            b for b in rotel.blocks("Metric") if b.header.get("Name") == "aiworker_requests"
        )
        assert metric.resource["service.name"] == "aiworker-otlp-test"
        assert metric.header.get("IsMonotonic") == "true"
        assert "duration" in " ".join(
            b.header.get("Name", "") for b in rotel.blocks("Metric") if b.points
        )

        def call_records() -> list[Block]:
            return [
                b
                for b in rotel.blocks("LogRecord")
                if b.attributes.get("event") == "worker_call"
                and b.attributes.get("workflow_id") == handle.id
            ]

        records = await wait_until(
            lambda: len(call_records()) >= 2 and call_records(), "worker_call log records"
        )
    finally:
        root.setLevel(old_level)
        telemetry.shutdown()
    assert telemetry.log_handler is None
    assert not any(isinstance(h, OtlpLogHandler) for h in root.handlers)
    for r in records:
        assert r.attributes["worker_id"] == names.VALIDATOR
        assert r.attributes["trace_id"] == result.trace_id
        assert r.header["Trace ID"] == result.trace_id
        assert r.header["Span ID"] == r.attributes["span_id"]
        assert r.resource["service.name"] == "aiworker-otlp-test"
    assert sorted(r.attributes["attempt"] for r in records) == ["1", "2"]
    failed = next(r for r in records if r.attributes["status"] == "failed")
    assert failed.attributes["error_code"] == "upstream_error"
    assert failed.header["SeverityText"] in ("WARN", "INFO", "ERROR")
