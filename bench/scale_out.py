"""One worker process against two and four, on the same embedded server, same run.

The workload is ``bench.throughput``'s chain-3 pipeline (three validator
steps): CPU-light work that still goes the whole step path (limiter plan,
budget, resolution, the worker runtime, schema checks, the result), so what
is measured is the engine and the server, not the work. The workers are real
``aiworker worker`` processes, started as a user starts them and stopped by
PID; this process only starts pipelines and awaits their results.

Each round runs one, two and four processes, forwards and backwards in
turn (1, 2, 4, 4, 2, 1, ...): processes are started before a round that needs
more and stopped (SIGTERM, drained) before one that needs fewer, so drift on
a shared machine hits all alike. Each run is a burst of ``count`` pipelines
with ``concurrency`` in flight. Reports pipelines/s per setup, ``ratio`` =
two / one and ``ratio_four`` = four / one (median rounds), CPU seconds per
pipeline of the worker processes, the server and this client process, the
share of the machine's cores they kept busy, and ``ceiling``: for each
setup, what the cores allow and which bound binds (a worker's event loop,
one core per process, or the machine's cores, shared with the server).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import stop_child
from bench.common import (
    embedded_server,
    percentiles,
    process_cpu_seconds,
    standalone,
    worker_env,
)
from bench.throughput import pipeline

AIWORKER = str(Path(sys.executable).parent / "aiworker")
COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.scale_out"


class _Proc:
    """One ``aiworker worker`` process, stopped by its PID."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [AIWORKER, "worker"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_child(self.proc, timeout=30)


async def _polling(client: Client, queue: str, pid: int, timeout: float = 90) -> None:
    """Until process ``pid`` polls the pipelines queue (workflow and activity side)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = 0
        for kind in (
            TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        ):
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=queue),
                    task_queue_type=kind,
                )
            )
            seen += any(p.identity.startswith(f"{pid}@") for p in resp.pollers)
        if seen == 2:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"worker process {pid} did not poll {queue} within {timeout}s")


async def _burst(
    client: Client,
    queue: str,
    spec: dict[str, Any],
    count: int,
    concurrency: int,
    pids: dict[str, list[int]],
) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            result = await client.execute_workflow(
                names.PIPELINE_WORKFLOW,
                spec,
                id=f"scale-{uuid.uuid4().hex}",
                task_queue=queue,
            )
            if result["status"] != "succeeded":
                raise RuntimeError(f"pipeline ended {result['status']}: {result.get('error')}")
            latencies.append((time.perf_counter() - t0) * 1000)

    def cpu() -> dict[str, float]:
        return {
            role: sum(process_cpu_seconds(p) for p in ps) if ps else process_cpu_seconds()
            for role, ps in pids.items()
        }

    before, machine0 = cpu(), _machine_busy_seconds()
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    wall = time.perf_counter() - t0
    after, machine1 = cpu(), _machine_busy_seconds()
    spent = {role: after[role] - before[role] for role in before}
    # everything else on the machine (other work sharing the cores)
    spent["others"] = max(0.0, machine1 - machine0 - sum(spent.values()))
    return {
        "per_s": count / wall,
        "wall_s": wall,
        "latency_ms": percentiles(latencies),
        "cpu_s_per_pipeline": {role: s / count for role, s in spent.items()},
        # cores kept busy during the burst (2.0 = both cores of this machine)
        "cores_busy": {role: s / wall for role, s in spent.items()},
    }


def _machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (``/proc/stat``; NaN elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    mid = sorted(rounds, key=lambda r: r["per_s"])[len(rounds) // 2]
    roles = rounds[0]["cpu_s_per_pipeline"]
    return {
        "per_s": mid["per_s"],
        "rounds_per_s": [round(r["per_s"], 2) for r in rounds],
        "latency_ms": mid["latency_ms"],
        "cpu_s_per_pipeline": {
            k: statistics.median(r["cpu_s_per_pipeline"][k] for r in rounds) for k in roles
        },
        "cores_busy": {k: statistics.median(r["cores_busy"][k] for r in rounds) for k in roles},
    }


SETUPS = (1, 2, 4)
"""How many worker processes each round runs."""
_WORDS = {1: "one", 2: "two", 4: "four"}


def _ceiling(cost: dict[str, float], n: int, cores: int) -> dict[str, Any]:
    """What the cores allow ``n`` worker processes, from the CPU a pipeline cost
    (``cost``: CPU seconds per pipeline by role): each worker process runs its
    event loop on at most one core (``n / workers``), and every process together
    on at most every core (``cores / (workers + server + client)``). ``binds``
    names the lower bound: the worker's event loop or the machine's cores, and
    ``server_share`` is the server's part of the CPU a pipeline cost."""
    own = cost["workers"] + cost["server"] + cost["client"]
    loop, machine = n / cost["workers"], cores / own
    return {
        "per_s": min(loop, machine),
        "binds": "worker event loop" if loop < machine else "cores (server, workers, client)",
        "server_share": round(cost["server"] / own, 3),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    """Chain-3 pipelines/s with one, two and four worker processes (see the module doc)."""
    count, rounds, concurrency = (200, 3, 100) if quick else (500, 5, 100)
    spec = pipeline("chain", 3)
    samples: dict[int, list[dict[str, Any]]] = {n: [] for n in SETUPS}
    with (
        embedded_server() as server,
        tempfile.TemporaryDirectory(prefix="aiworker-scale-") as tmp,
    ):
        client = await Client.connect(server.address, data_converter=data_converter(None))
        suffix = f"-scale{uuid.uuid4().hex[:6]}"
        queue = f"{names.PIPELINES_QUEUE}{suffix}"
        env = worker_env(server.address, suffix, Path(tmp) / "data")
        server_pid = server.process.pid if server.process else None
        procs: list[_Proc] = [_Proc(env, Path(tmp) / "worker0.log")]
        started = 1

        def roles() -> dict[str, list[int]]:
            return {
                "workers": [p.pid for p in procs],
                "server": [server_pid] if server_pid else [],
                "client": [],
            }

        try:
            await _polling(client, queue, procs[0].pid)
            # warm-up: imports, sandbox caches and the server's queues
            await _burst(client, queue, spec, 20, 10, roles())
            # each round runs every setup, in turn forwards and backwards, so drift
            # on a shared machine hits all alike
            order = [n for i in range(rounds) for n in (SETUPS if i % 2 == 0 else SETUPS[::-1])]
            for n in order:
                while len(procs) > n:  # drained: SIGTERM, then wait
                    procs.pop().stop()
                if len(procs) < n:
                    while len(procs) < n:
                        procs.append(_Proc(env, Path(tmp) / f"worker{started}.log"))
                        started += 1
                        await _polling(client, queue, procs[-1].pid)
                    await _burst(client, queue, spec, 40, 20, roles())  # warm the new ones
                samples[n].append(await _burst(client, queue, spec, count, concurrency, roles()))
        finally:
            for p in procs:
                p.stop()
    cores = os.cpu_count() or 1
    summaries = {n: _summary(samples[n]) for n in SETUPS}
    for summary in summaries.values():
        # what the cores could do if nothing else ran: cores / CPU-seconds per pipeline
        # of the workers, the server and this client together
        own = sum(v for k, v in summary["cpu_s_per_pipeline"].items() if k != "others")
        summary["cpu_ceiling_per_s"] = cores / own if own else float("nan")
    # The bound the cores set for each setup, from the CPU each pipeline cost in the
    # two-process rounds (see _ceiling)
    cost = summaries[2]["cpu_s_per_pipeline"]
    ceilings = {n: _ceiling(cost, n, cores) for n in SETUPS}
    one, two, four = summaries[1], summaries[2], summaries[4]
    return {
        "ratio": two["per_s"] / one["per_s"],
        "ratio_four": four["per_s"] / one["per_s"],
        "one_per_s": one["per_s"],
        "two_per_s": two["per_s"],
        "four_per_s": four["per_s"],
        **{_WORDS[n]: summaries[n] for n in SETUPS},
        # what the cores allow if nothing else ran (see docs/benchmarks.md, "Scale out")
        "bound_one_per_s": ceilings[1]["per_s"],
        "bound_two_per_s": ceilings[2]["per_s"],
        "bound_four_per_s": ceilings[4]["per_s"],
        "ratio_bound": ceilings[2]["per_s"] / ceilings[1]["per_s"],
        "ceiling": {_WORDS[n]: c for n, c in ceilings.items()},
        "workload": f"chain-3 validator pipelines, {count} per round at {concurrency} in flight",
        "rounds": rounds,
        "cores": cores,
        "command": COMMAND if quick else ".venv/bin/python -m bench.scale_out",
    }


if __name__ == "__main__":
    standalone(run)
