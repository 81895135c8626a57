"""Prometheus metrics of the worker runtime.

Names and labels are part of the interface: dashboards and alert rules in
``deploy/monitoring`` use them. A :class:`WorkerMetrics` is built on one
registry and injected into the runtime, so tests can use their own.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

# 5 ms .. 120 s, dense enough for p50/p95/p99 by histogram_quantile.
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.35,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    3.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    90.0,
    120.0,
)

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}


class WorkerMetrics:
    """The runtime's metrics on one registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.requests = Counter(
            "aiworker_requests",
            "Worker calls by outcome (status is succeeded, partial or failed).",
            ["worker_id", "status", "error_code", "tenant"],
            registry=registry,
        )
        self.retries = Counter(
            "aiworker_retries",
            "Worker attempts after the first (attempt > 1).",
            ["worker_id", "tenant"],
            registry=registry,
        )
        self.duration = Histogram(
            "aiworker_request_duration_seconds",
            "Wall time of one worker attempt, validation included.",
            ["worker_id", "status"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "aiworker_tokens",
            "Model tokens by model and direction (input or output).",
            ["worker_id", "model", "direction"],
            registry=registry,
        )
        # model: the alias's model name, as on aiworker_tokens (bounded by the models
        # file); tenant as on aiworker_requests.
        self.cost_usd = Counter(
            "aiworker_cost_usd",
            "US dollars model calls cost, priced from the model alias's prices, by tenant "
            "and model (every attempt that got a reply counted).",
            ["tenant", "model"],
            registry=registry,
        )
        self.external_calls = Counter(
            "aiworker_external_calls",
            "External calls made through tools.",
            ["worker_id", "tool"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "aiworker_activities_in_flight",
            "Worker calls running now.",
            ["worker_id"],
            registry=registry,
        )
        self.breaker_state = Gauge(
            "aiworker_breaker_state",
            "Circuit breaker state per target: 0 closed, 1 half-open, 2 open.",
            ["kind", "target"],
            registry=registry,
        )
        # Pipelines by terminal status (aiworker_pipelines_total{status,pipeline,tenant})
        # are counted by PipelineWorkflow itself through the SDK's replay-safe
        # workflow.metric_meter() and reach the same /metrics through
        # workers.process.sdk_metrics.SdkMetricsCollector.
