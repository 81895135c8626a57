"""What one OTLP metrics export costs beside a Prometheus scrape of the same registry.

A worker process's registry is filled as a busy one would be (aiworker's
metrics over many workers, tenants, statuses and error codes; histograms with
all their buckets). The same registry is then read both ways, interleaved:
``generate_latest`` (what one ``/metrics`` scrape costs) and
:func:`aiworker.workers.process.otlp.registry_to_metrics` plus the OTLP
protobuf encoding (what one OTLP export costs before the network; the export
runs every ``OTEL_METRIC_EXPORT_INTERVAL``, 60 s by default). ``ratio`` is
OTLP / scrape at the median.

Run: ``.venv/bin/python -m bench.otlp_export`` (``BENCH_QUICK=1`` for fewer series).
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from aiworker.activities.metrics import WorkerMetrics
from aiworker.workers.process.otlp import registry_to_metrics
from bench.common import percentiles, standalone

COMMAND = ".venv/bin/python -m bench.otlp_export"


def _filled(workers: int, tenants: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    for w in range(workers):
        wid = f"worker-{w}"
        for t in range(tenants):
            tenant = f"tenant-{t}"
            for status, code in (("succeeded", ""), ("failed", "timeout"), ("failed", "internal")):
                m.requests.labels(wid, status, code, tenant).inc(7)
            m.retries.labels(wid, tenant).inc(2)
            m.cost_usd.labels(tenant, "model").inc(0.01)
        for status in ("succeeded", "failed"):
            for i in range(20):
                m.duration.labels(wid, status).observe(0.01 * (i + 1))
        m.tokens.labels(wid, "model", "input").inc(1000)
        m.in_flight.labels(wid).set(3)
    return registry


async def run(quick: bool = False) -> dict[str, Any]:
    workers, tenants = (10, 5) if quick else (40, 20)
    runs = 30 if quick else 100
    registry = _filled(workers, tenants)
    resource = Resource.create({"service.name": "bench"})
    start = time.time_ns()

    def scrape() -> int:
        return len(generate_latest(registry))

    def otlp() -> int:
        return len(
            encode_metrics(registry_to_metrics(registry, resource, start)).SerializeToString()
        )

    paths = {"scrape": scrape, "otlp": otlp}
    sizes = {name: f() for name, f in paths.items()}  # warm-up, and the payload sizes
    samples: dict[str, list[float]] = {name: [] for name in paths}
    order = list(paths)
    for i in range(runs):
        for name in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            paths[name]()
            samples[name].append((time.perf_counter() - t0) * 1000)
    stats = {name: percentiles(s) for name, s in samples.items()}
    series = sum(len(f.samples) for f in registry.collect())
    return {
        "ratio": round(stats["otlp"]["p50"] / stats["scrape"]["p50"], 3),
        **{f"{n}_ms": {k: round(v, 2) for k, v in s.items()} for n, s in stats.items()},
        "bytes": sizes,
        "prometheus_samples": series,
        "runs": runs,
        "command": COMMAND + (" (BENCH_QUICK=1)" if quick else ""),
    }


if __name__ == "__main__":
    standalone(run)
