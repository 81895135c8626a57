"""aiworker pipelines against bare temporalio workflows on the embedded server.

Same server, same worker settings, same run, interleaved rounds: a bare
workflow with N no-op activities (the floor Temporal sets) against
``PipelineWorkflow`` running the same shape through the worker runtime
(validator steps with a trivial schema). Reports pipelines/s, end-to-end
latency percentiles and the ratio aiworker/bare.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.activities.runtime import WorkerRuntime
from aiworker.schemas import names
from aiworker.schemas.catalog import load_specs
from aiworker.schemas.settings import Settings
from aiworker.workers.plugins import builtin_set
from aiworker.workers.registry import activities_for
from aiworker.workers.temporal_client import data_converter
from aiworker.workers.worker import workflow_runner
from aiworker.workflows.pipeline import PipelineWorkflow
from bench.bare_workflow import BareBenchWorkflow, noop
from bench.common import embedded_server, percentiles


def pipeline(kind: str, n: int) -> dict[str, Any]:
    step = {"worker": "validator", "input": {"data": {"x": 1}, "schema": {"type": "object"}}}
    if kind == "fanout":
        steps = [{"id": f"b{i}", **step} for i in range(n)]
        steps.append({"id": "join", **step, "depends_on": [f"b{i}" for i in range(n)]})
    else:
        steps = [
            {"id": f"s{i}", **step, **({"depends_on": [f"s{i - 1}"]} if i else {})}
            for i in range(n)
        ]
    return {"name": f"bench-{kind}", "tenant": "bench", "steps": steps}


async def _burst(client: Client, start: Any, count: int, concurrency: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await start()
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    wall = time.perf_counter() - t0
    return {"per_s": count / wall, "latency_ms": percentiles(latencies), "n": count}


async def run_case(
    client: Client, queue: str, kind: str, n: int, count: int, concurrency: int, rounds: int
) -> dict[str, Any]:
    async def bare() -> None:
        await client.execute_workflow(
            BareBenchWorkflow.run,
            {"kind": kind, "n": n},
            id=f"bare-{uuid.uuid4().hex}",
            task_queue=queue,
        )

    spec = pipeline(kind, n)

    async def ours() -> None:
        result = await client.execute_workflow(
            names.PIPELINE_WORKFLOW, spec, id=f"aiw-{uuid.uuid4().hex}", task_queue=queue
        )
        assert result["status"] == "succeeded", result

    # warm up both paths, then interleave rounds so drift hits both alike
    await _burst(client, bare, 5, 5)
    await _burst(client, ours, 5, 5)
    bare_runs, our_runs = [], []
    for _ in range(rounds):
        bare_runs.append(await _burst(client, bare, count, concurrency))
        our_runs.append(await _burst(client, ours, count, concurrency))
    b = _merge(bare_runs)
    o = _merge(our_runs)
    return {
        "case": f"{kind}-{n}",
        "bare_per_s": b["per_s"],
        "aiworker_per_s": o["per_s"],
        "ratio": o["per_s"] / b["per_s"],
        "bare_latency_ms": b["latency_ms"],
        "aiworker_latency_ms": o["latency_ms"],
    }


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    per_s = sorted(r["per_s"] for r in runs)[len(runs) // 2]  # median round
    return {"per_s": per_s, "latency_ms": runs[len(runs) // 2]["latency_ms"]}


async def run(quick: bool = False) -> dict[str, Any]:
    """All throughput cases on one fresh embedded server."""
    count, rounds = (40, 2) if quick else (150, 3)
    concurrency = 20
    results = []
    with embedded_server() as server:
        client = await Client.connect(server.address, data_converter=data_converter(None))
        settings = Settings(metrics_port=0, task_queue_suffix=f"-bench{uuid.uuid4().hex[:6]}")
        runtime = WorkerRuntime(settings, load_specs())
        queue = settings.queue(names.PIPELINES_QUEUE)
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[PipelineWorkflow, BareBenchWorkflow],
            activities=[noop, *activities_for(names.PIPELINES_QUEUE, runtime, builtin_set())],
            max_concurrent_activity_task_polls=20,
            max_concurrent_workflow_task_polls=20,
            max_concurrent_activities=200,
            max_concurrent_workflow_tasks=200,
            # the sandbox production workers run in (its pass-through modules)
            workflow_runner=workflow_runner(),
        )
        async with worker:
            for kind, n in (("chain", 1), ("fanout", 5), ("chain", 3)):
                results.append(await run_case(client, queue, kind, n, count, concurrency, rounds))
    return {"cases": results}
