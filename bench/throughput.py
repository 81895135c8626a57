"""aiworker pipelines against bare temporalio workflows on the embedded server.

Same server, same worker settings, same run, interleaved rounds: a bare
workflow with N no-op activities (the floor Temporal sets) against
``PipelineWorkflow`` running the same shape through the worker runtime
(validator steps with a trivial schema). Like is compared with like
(``SHAPES``): every step a regular activity against bare regular activities
(``regular``), validator steps as local activities against bare local
activities (``local``), and the first headline, validator steps local against
bare regular activities (``validator``). Reports pipelines/s, end-to-end
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
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

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

    def bare_path(local: bool, on: str = queue) -> Starter:
        async def bare() -> str:
            wid = f"bare{'-local' * local}-{kind}-{n}-{uuid.uuid4().hex}"
            await client.execute_workflow(
                BareBenchWorkflow.run,
                {"kind": kind, "n": n, "local": local},
                id=wid,
                task_queue=on,
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

    return {
        "bare": bare_path(False),
        "bare_local": bare_path(True),
        "bare_unsandboxed": bare_path(False, unsandboxed_queue(queue)),
        "aiworker": ours,
    }


def unsandboxed_queue(queue: str) -> str:
    """The queue of the bare workflow with the sandbox off (``bare_unsandboxed``)."""
    return f"{queue}-unsandboxed"


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


async def run_paths(
    paths: dict[str, Starter],
    count: int,
    concurrency: int,
    rounds: int,
    server_pid: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Pipelines/s of every path in bursts of ``count`` at ``concurrency``, rounds
    interleaved (each round starts with the next path, so drift hits all alike):
    each path's median round (:func:`_merge`)."""
    # warm up every path, then interleave rounds
    for start in paths.values():
        await _burst(start, 5, 5, None)
    names_ = list(paths)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names_}
    for i in range(rounds):
        shift = i % len(names_)
        for name in names_[shift:] + names_[:shift]:
            runs[name].append(await _burst(paths[name], count, concurrency, server_pid))
    return {name: _merge(r) for name, r in runs.items()}


def compare(case: str, merged: dict[str, dict[str, Any]], base: str = "bare") -> dict[str, Any]:
    """aiworker's figures of ``case`` against the ``base`` path's: ``ratio`` of
    pipelines/s and ``worker_cpu_ratio`` of the worker process's CPU per pipeline
    (the ``bare_*`` keys are the base path's)."""
    b, o = merged[base], merged["aiworker"]
    return {
        "case": case,
        "baseline": base,
        "bare_per_s": b["per_s"],
        "aiworker_per_s": o["per_s"],
        "ratio": o["per_s"] / b["per_s"],
        "worker_cpu_ratio": round(o["worker_cpu_s"] / b["worker_cpu_s"], 3),
        "bare_latency_ms": b["latency_ms"],
        "aiworker_latency_ms": o["latency_ms"],
        "bare_worker_cpu_s": b["worker_cpu_s"],
        "aiworker_worker_cpu_s": o["worker_cpu_s"],
        "bare_server_cpu_s": b["server_cpu_s"],
        "aiworker_server_cpu_s": o["server_cpu_s"],
    }


async def run_case(
    paths: dict[str, Starter],
    case: str,
    count: int,
    concurrency: int,
    rounds: int,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """aiworker against bare (:func:`run_paths`, then :func:`compare`)."""
    merged = await run_paths(paths, count, concurrency, rounds, server_pid)
    return compare(case, merged)


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round by pipelines/s, and the median CPU per pipeline."""
    mid = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
    return {
        "per_s": mid["per_s"],
        "latency_ms": mid["latency_ms"],
        "worker_cpu_s": statistics.median(r["worker_cpu_s"] for r in runs),
        "server_cpu_s": statistics.median(r["server_cpu_s"] for r in runs),
    }


_WORKER_OPTIONS: dict[str, Any] = {
    "max_concurrent_activity_task_polls": 20,
    "max_concurrent_workflow_task_polls": 20,
    "max_concurrent_activities": 200,
    "max_concurrent_workflow_tasks": 200,
}


def bench_worker(client: Client, queue: str, runtime: WorkerRuntime) -> Worker:
    """One worker for both paths: the bare workflow and its no-op activity next to
    ``PipelineWorkflow`` and the pipelines queue's activities, with the production
    runner (``workflow_runner()``): the bare workflow in the SDK's sandbox, as a
    Temporal user's workflow runs by default, aiworker's own unsandboxed."""
    return Worker(
        client,
        task_queue=queue,
        workflows=[PipelineWorkflow, BareBenchWorkflow],
        activities=[noop, *activities_for(names.PIPELINES_QUEUE, runtime, builtin_set())],
        workflow_runner=workflow_runner(),
        **_WORKER_OPTIONS,
    )


def bare_unsandboxed_worker(client: Client, queue: str) -> Worker:
    """The bare workflow with the sandbox off (``UnsandboxedWorkflowRunner``), as
    aiworker's own workflows run: the ``regular_unsandboxed`` shape's baseline."""
    return Worker(
        client,
        task_queue=unsandboxed_queue(queue),
        workflows=[BareBenchWorkflow],
        activities=[noop],
        workflow_runner=UnsandboxedWorkflowRunner(),
        **_WORKER_OPTIONS,
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
        async with bench_worker(client, queue, runtime), bare_unsandboxed_worker(client, queue):
            yield client, queue, server.process.pid if server.process else None


SHAPES: dict[str, tuple[bool, str, str]] = {
    # key: (aiworker's validator steps local, the baseline path, what it compares)
    "validator": (
        True,
        "bare",
        "validator steps as local activities (their spec's default) against bare "
        "regular activities: the headline since issue 17",
    ),
    "regular": (
        False,
        "bare",
        "every step a regular activity (AIWORKER_LOCAL_ACTIVITIES=0), as web-scrape, "
        "llm-call, publish, prompt, plugin and external workers always are, against "
        "bare regular activities",
    ),
    "regular_unsandboxed": (
        False,
        "bare_unsandboxed",
        "every step a regular activity against bare regular activities with the sandbox "
        "off on both sides: aiworker runs its own workflows unsandboxed "
        "(AIWORKER_WORKFLOW_SANDBOX), the bare baseline above runs in the SDK's sandbox, "
        "Temporal's default",
    ),
    "local": (
        True,
        "bare_local",
        "validator steps as local activities against a bare workflow of local activities",
    ),
}
"""The engine's shapes, each under its own key of ``latest.json``: like against like."""


async def _stack_figures(
    local: bool, count: int, rounds: int, idle_runs: int
) -> dict[str, dict[str, Any]]:
    """Every SHAPES entry whose aiworker side has ``local``, from one fresh stack:
    throughput per case (every path interleaved), then one-at-a-time latency, then
    the counts of a few of those idle runs' histories."""
    keys = [k for k, (is_local, _, _) in SHAPES.items() if is_local == local]
    bases = sorted({SHAPES[k][1] for k in keys})
    figures: dict[str, dict[str, Any]] = {
        k: {"about": SHAPES[k][2], "cases": [], "idle": {}} for k in keys
    }
    counts: dict[str, dict[str, dict[str, Any]]] = {}
    async with bench_stack(local=local) as (client, queue, server_pid):
        shapes = {
            f"{k}-{n}": {
                name: start
                for name, start in starters(client, queue, k, n).items()
                if name in bases or name == "aiworker"
            }
            for k, n in CASES
        }
        for case, paths in shapes.items():
            merged = await run_paths(paths, count, 20, rounds, server_pid)
            for k in keys:
                figures[k]["cases"].append(compare(case, merged, SHAPES[k][1]))
        for case, paths in shapes.items():
            idle = await idle_latency(paths, idle_runs, bases=bases)
            ids = idle.pop("ids")
            counts[case] = {
                name: median_counts([await pipeline_counts(client, wid) for wid in ids[name]])
                for name in paths
            }
            for k in keys:
                base = SHAPES[k][1]
                figures[k]["idle"][case] = {
                    "bare_ms": idle[f"{base}_ms"],
                    "aiworker_ms": idle["aiworker_ms"],
                    "runs": idle["runs"],
                    "ratio": idle["ratios"][base],
                }
    for k in keys:
        base = SHAPES[k][1]
        per_case = {}
        for c in figures[k]["cases"]:
            found = counts[c["case"]]
            pair = {"bare": dict(found[base]), "aiworker": dict(found["aiworker"])}
            for name in ("bare", "aiworker"):  # the CPU of the throughput rounds' bursts
                pair[name]["worker_cpu_s"] = c[f"{name}_worker_cpu_s"]
                pair[name]["server_cpu_s"] = c[f"{name}_server_cpu_s"]
            per_case[c["case"]] = pair
        figures[k]["per_pipeline"] = per_pipeline(per_case)
    return figures


async def run(quick: bool = False) -> dict[str, Any]:
    """Every SHAPES entry: the local ones on one fresh embedded server, the regular
    one on another. Each has ``cases`` (throughput under load, with worker and
    server CPU per pipeline), ``idle`` (one at a time) and ``per_pipeline`` (the
    histories' counts and the CPU, against its baseline)."""
    count, rounds = (40, 2) if quick else (150, 3)
    idle_runs = 25 if quick else 60
    out: dict[str, Any] = {}
    for local in (True, False):
        out.update(await _stack_figures(local, count, rounds, idle_runs))
    return out


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
