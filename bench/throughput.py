"""aiworker pipelines against bare temporalio workflows on the embedded server.

Same server, same worker settings, same run, interleaved rounds: a bare
workflow with N no-op activities (the floor Temporal sets) against
``PipelineWorkflow`` running the same shape through the worker runtime
(validator steps with a trivial schema). Reports pipelines/s, end-to-end
latency percentiles and the ratio aiworker/bare, CPU seconds per pipeline
of this process (the worker and the client that starts and awaits the
workflows) and of the server, one-at-a-time latency (``bench.idle``) and
what each pipeline leaves in its history (``bench.counts``).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.process.plugin import workflow_runner
from aiworker.workers.process.task_queues import activities_for
from aiworker.workers.process.worker_set import builtin_set
from aiworker.workflows.pipeline import PipelineWorkflow
from bench.bare_workflow import BareBenchWorkflow, noop
from bench.common import embedded_server, percentiles, process_cpu_seconds
from bench.counts import median_counts, pipeline_counts
from bench.idle import idle_latency


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


Starter = Callable[[], Awaitable[str]]
CASES = (("chain", 1), ("chain", 3), ("fanout", 5))


def starters(client: Client, queue: str, kind: str, n: int) -> dict[str, Starter]:
    """Run one pipeline of the shape to its end: bare with regular activities
    (``bare``), bare with local activities (``bare_local``) and through aiworker;
    each returns the workflow id (to fetch its history)."""

    def bare_path(local: bool) -> Starter:
        async def bare() -> str:
            wid = f"bare{'-local' * local}-{kind}-{n}-{uuid.uuid4().hex}"
            await client.execute_workflow(
                BareBenchWorkflow.run,
                {"kind": kind, "n": n, "local": local},
                id=wid,
                task_queue=queue,
            )
            return wid

        return bare

    spec = pipeline(kind, n)

    async def ours() -> str:
        wid = f"aiw-{kind}-{n}-{uuid.uuid4().hex}"
        result = await client.execute_workflow(
            names.PIPELINE_WORKFLOW, spec, id=wid, task_queue=queue
        )
        assert result["status"] == "succeeded", result
        return wid

    return {"bare": bare_path(False), "bare_local": bare_path(True), "aiworker": ours}


async def _burst(
    start: Starter, count: int, concurrency: int, server_pid: int | None
) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            await start()
            latencies.append((time.perf_counter() - t0) * 1000)

    cpu0, server0 = process_cpu_seconds(), process_cpu_seconds(server_pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    wall = time.perf_counter() - t0
    cpu = process_cpu_seconds() - cpu0
    server = process_cpu_seconds(server_pid) - server0 if server_pid else float("nan")
    return {
        "per_s": count / wall,
        "latency_ms": percentiles(latencies),
        "n": count,
        "worker_cpu_s": cpu / count,
        "server_cpu_s": server / count,
    }


async def run_case(
    paths: dict[str, Starter],
    case: str,
    count: int,
    concurrency: int,
    rounds: int,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Pipelines/s of both paths in bursts of ``count`` at ``concurrency``,
    alternating rounds; the median round of each path."""
    # warm up both paths, then interleave rounds so drift hits both alike
    for start in paths.values():
        await _burst(start, 5, 5, None)
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "aiworker": []}
    for i in range(rounds):
        for name in ("bare", "aiworker") if i % 2 == 0 else ("aiworker", "bare"):
            runs[name].append(await _burst(paths[name], count, concurrency, server_pid))
    b, o = _merge(runs["bare"]), _merge(runs["aiworker"])
    return {
        "case": case,
        "bare_per_s": b["per_s"],
        "aiworker_per_s": o["per_s"],
        "ratio": o["per_s"] / b["per_s"],
        "bare_latency_ms": b["latency_ms"],
        "aiworker_latency_ms": o["latency_ms"],
        "bare_worker_cpu_s": b["worker_cpu_s"],
        "aiworker_worker_cpu_s": o["worker_cpu_s"],
        "bare_server_cpu_s": b["server_cpu_s"],
        "aiworker_server_cpu_s": o["server_cpu_s"],
    }


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round by pipelines/s, and the median CPU per pipeline."""
    mid = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
    return {
        "per_s": mid["per_s"],
        "latency_ms": mid["latency_ms"],
        "worker_cpu_s": statistics.median(r["worker_cpu_s"] for r in runs),
        "server_cpu_s": statistics.median(r["server_cpu_s"] for r in runs),
    }


def bench_worker(client: Client, queue: str, runtime: WorkerRuntime) -> Worker:
    """One worker for both paths: the bare workflow and its no-op activity next to
    ``PipelineWorkflow`` and the pipelines queue's activities, in the production
    sandbox (``workflow_runner()`` and its pass-through modules)."""
    return Worker(
        client,
        task_queue=queue,
        workflows=[PipelineWorkflow, BareBenchWorkflow],
        activities=[noop, *activities_for(names.PIPELINES_QUEUE, runtime, builtin_set())],
        max_concurrent_activity_task_polls=20,
        max_concurrent_workflow_task_polls=20,
        max_concurrent_activities=200,
        max_concurrent_workflow_tasks=200,
        workflow_runner=workflow_runner(),
    )


@asynccontextmanager
async def bench_stack(local: bool = True) -> AsyncIterator[tuple[Client, str, int | None]]:
    """A fresh embedded server and a running bench worker: (client, queue, server pid).
    ``local=False`` runs the validator steps as regular activities
    (``AIWORKER_LOCAL_ACTIVITIES=0``), like every step that is not a validator."""
    with embedded_server() as server:
        client = await Client.connect(server.address, data_converter=data_converter(None))
        settings = Settings(
            metrics_port=0,
            task_queue_suffix=f"-bench{uuid.uuid4().hex[:6]}",
            local_activities=local,
        )
        runtime = WorkerRuntime(settings, load_specs())
        queue = settings.queue(names.PIPELINES_QUEUE)
        async with bench_worker(client, queue, runtime):
            yield client, queue, server.process.pid if server.process else None


async def run(quick: bool = False) -> dict[str, Any]:
    """Every case on one fresh embedded server: throughput under load (with worker
    and server CPU per pipeline), then one-at-a-time latency, then the counts of
    the histories of a few of those idle runs."""
    count, rounds = (40, 2) if quick else (150, 3)
    idle_runs = 25 if quick else 60
    concurrency = 20
    cases, idle, counts = [], {}, {}
    async with bench_stack() as (client, queue, server_pid):
        shapes = {f"{k}-{n}": starters(client, queue, k, n) for k, n in CASES}
        for case, paths in shapes.items():
            cases.append(await run_case(paths, case, count, concurrency, rounds, server_pid))
        for case, paths in shapes.items():
            idle[case] = await idle_latency(paths, idle_runs)
        for case, res in idle.items():
            ids = res.pop("ids")
            counts[case] = {
                name: median_counts([await pipeline_counts(client, wid) for wid in ids[name]])
                for name in ("bare", "aiworker")
            }
    for c in cases:
        for name in ("bare", "aiworker"):
            counts[c["case"]][name]["worker_cpu_s"] = c[f"{name}_worker_cpu_s"]
            counts[c["case"]][name]["server_cpu_s"] = c[f"{name}_server_cpu_s"]
    return {"cases": cases, "idle": idle, "per_pipeline": per_pipeline(counts)}


def per_pipeline(counts: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Both paths' counts per case with ``aiworker_vs_bare``: the ratio of each figure."""
    out: dict[str, Any] = {}
    for case, paths in counts.items():
        b, o = paths["bare"], paths["aiworker"]
        ratios = {
            k: round(o[k] / b[k], 3)
            for k in RATIO_KEYS
            if isinstance(b.get(k), int | float) and b[k] and not math.isnan(b[k])
        }
        out[case] = {"bare": b, "aiworker": o, "aiworker_vs_bare": ratios}
    return out


RATIO_KEYS = (
    "workflow_tasks",
    "events",
    "payload_bytes",
    "history_bytes",
    "worker_cpu_s",
    "server_cpu_s",
)
