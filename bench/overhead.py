"""The worker runtime's own cost per call, in-process, without Temporal.

The same validator logic is timed twice in one run: called directly (the
baseline) and through ``WorkerRuntime.run`` (envelope parsing, input and
output schema validation, constraints, toolbox, log line, metrics, span).
The difference is what the runtime adds per call.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry

from aiworker.activities.call_telemetry import observe_call
from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerContext, WorkerRuntime
from aiworker.activities.toolbox import Toolbox
from aiworker.activities.validator import Validator
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.protocol import WorkerRequest
from bench.common import percentiles

REQUEST: dict[str, Any] = {
    "worker_id": "validator",
    "idempotency_key": "bench/step",
    "tenant": "bench",
    "input": {
        "data": {"title": "x", "price": 3.5},
        "schema": {
            "type": "object",
            "required": ["title"],
            "properties": {"price": {"type": "number"}},
        },
    },
}


async def run(quick: bool = False) -> dict[str, Any]:
    n = 2000 if quick else 10000
    settings = Settings(metrics_port=0)
    specs = load_specs()
    runtime = WorkerRuntime(settings, specs, metrics=WorkerMetrics(CollectorRegistry()))
    worker = Validator()
    # the log line is part of the cost, but not its terminal I/O
    logging.getLogger("aiworker.worker").addHandler(logging.NullHandler())
    logging.getLogger("aiworker.worker").propagate = False
    ctx = WorkerContext(
        request=WorkerRequest.model_validate(REQUEST),
        spec=specs["validator"],
        settings=settings,
        tools=Toolbox({}, frozenset(), None),
        attempt=1,
        deadline=time.monotonic() + 1e9,
        max_tokens=None,
    )

    async def through_runtime() -> None:
        # the call's telemetry, as the activity interceptor opens it in a worker process
        with observe_call(worker.worker_id, runtime.metrics):
            await runtime.run(worker, REQUEST)

    for _ in range(200):  # warm caches on both paths
        await worker.execute(ctx, REQUEST["input"])
        await through_runtime()
    direct, wrapped = [], []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await worker.execute(ctx, REQUEST["input"])
        t1 = time.perf_counter_ns()
        await through_runtime()
        t2 = time.perf_counter_ns()
        direct.append((t1 - t0) / 1000)
        wrapped.append((t2 - t1) / 1000)
    d, w = percentiles(direct), percentiles(wrapped)
    return {
        "calls": n,
        "direct_us": d,
        "runtime_us": w,
        "overhead_p50_us": w["p50"] - d["p50"],
        "overhead_p99_us": w["p99"] - d["p99"],
    }
