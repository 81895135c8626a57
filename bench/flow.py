"""Flow control's cost: a start's latency through the keyed flow workflow against a
plain start of the same pipeline, and the start rate a keyed batch sustains.

One embedded Temporal server and one ``aiworker worker`` process (versioned, as
``aiworker worker`` runs by default) on the pipelines queue. The pipeline is one
validator step (a local activity). Rounds alternate, one start at a time, in a
rotating order, between:

- **plain**: ``PipelineClient.start`` of the pipeline without ``flow``;
- **singleton**: the same pipeline with ``"singleton": "wait"`` on one key (the
  previous round's run has ended, so the start runs at once: update-with-start to
  the flow workflow, which starts the run as its child and answers);
- **debounce**: ``"debounce": {"seconds": 1}`` on one key: the run starts once the
  key has been quiet a second.

Each figure is from the bench's ``start`` call to the run's result (the run's
whole life, the same step in each). ``ratio`` = singleton p50 / plain p50: the
extra a caller pays for flow control when nothing has to wait;
``ratio_debounce`` = (debounce p50 minus the configured quiet period) / plain
p50, the quiet period reported apart (``debounce_quiet_ms``).

Batch: ``starts`` starts of a ``"batch": {"max_items": 100, "max_seconds": 60}``
pipeline on one key, ``concurrency`` in flight, timed to the last answer
(``batch_starts_per_s``); against the same number of plain starts at the same
concurrency to a queue no worker polls (the server's own start rate:
``plain_starts_per_s``), ``ratio_batch_vs_plain_starts``. Every batch's run is
awaited after the timing, and their collected starts counted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.flow_start import FlowHandle, wait_started
from aiworker.workers.client.temporal_client import data_converter
from bench.common import embedded_server, percentiles, standalone, worker_env
from bench.scale_out import _polling, _Proc

COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.flow"
QUIET_SECONDS = 1
BATCH_ITEMS = 100


def _pipeline(name: str, n: int, flow: dict[str, Any] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "tenant": "bench",
        "inputs": {"customer": "c1", "n": n},
        "steps": [
            {
                "id": "check",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.n }}", "schema": {"type": "integer"}},
            }
        ],
    }
    if flow is not None:
        raw["flow"] = {"key": "${{ inputs.customer }}", **flow}
    return raw


MODES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "singleton": {"singleton": "wait"},
    "debounce": {"debounce": {"seconds": QUIET_SECONDS}},
}


async def _round(pc: PipelineClient, mode: str, n: int) -> float:
    """One start to its run's result (ms)."""
    t0 = time.perf_counter()
    handle = await pc.start(_pipeline(f"bench-flow-{mode}", n, MODES[mode]), check=False)
    if isinstance(handle, FlowHandle):
        await wait_started(handle, poll_seconds=0.02)
    result = await pc.result(handle.id, handle.result_run_id)
    if result.status != "succeeded":
        raise RuntimeError(f"{mode} round {n}: {result.status}")
    return (time.perf_counter() - t0) * 1000


async def _rate(starts: int, concurrency: int, one: Any) -> float:
    """Starts per second of ``starts`` calls of ``one(i)``, ``concurrency`` in flight."""
    gate = asyncio.Semaphore(concurrency)

    async def go(i: int) -> None:
        async with gate:
            await one(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(go(i) for i in range(starts)))
    return starts / (time.perf_counter() - t0)


async def _batch(pc: PipelineClient, starts: int, concurrency: int) -> dict[str, Any]:
    name = f"bench-flow-batch-{uuid.uuid4().hex[:6]}"
    flow = {"batch": {"max_items": BATCH_ITEMS, "max_seconds": 60}}
    handles: list[FlowHandle] = []

    async def one(i: int) -> None:
        h = await pc.start(_pipeline(name, i, flow), check=False)
        assert isinstance(h, FlowHandle)
        handles.append(h)

    rate = await _rate(starts, concurrency, one)
    runs = sorted({h.id for h in handles})
    collected = 0
    for wid in runs:
        handle = next(h for h in handles if h.id == wid)
        await wait_started(handle, poll_seconds=0.05)
        raw = await pc.started_input(wid)
        collected += len((raw or {}).get("inputs", {}).get("starts", []))
        if (await pc.result(wid, handle.result_run_id)).status != "succeeded":
            raise RuntimeError(f"batch run {wid} did not succeed")
    if collected != starts:
        raise RuntimeError(f"the batch runs collected {collected} of {starts} starts")
    return {"rate": rate, "runs": len(runs)}


async def _plain_rate(client: Client, starts: int, concurrency: int) -> float:
    """Plain starts to a queue no worker polls (terminated after)."""
    queue = f"bench-flow-nobody-{uuid.uuid4().hex[:6]}"
    ids: list[str] = []

    async def one(i: int) -> None:
        wid = f"bench-flow-plain-{uuid.uuid4().hex[:10]}"
        await client.start_workflow(
            names.PIPELINE_WORKFLOW, _pipeline("bench-flow-plain", i), id=wid, task_queue=queue
        )
        ids.append(wid)

    rate = await _rate(starts, concurrency, one)
    for wid in ids:
        await client.get_workflow_handle(wid).terminate("bench over")
    return rate


async def run(quick: bool = False) -> dict[str, Any]:
    """Latency rounds, then the batch start rate (see the module doc)."""
    rounds = 6 if quick else 24
    starts = 300 if quick else 1000
    concurrency = 20
    out: dict[str, list[float]] = {m: [] for m in MODES}
    with (
        tempfile.TemporaryDirectory(prefix="aiworker-bench-flow-") as tmp,
        embedded_server() as server,
    ):
        suffix = f"-fl{uuid.uuid4().hex[:6]}"
        env = worker_env(server.address, suffix, Path(tmp) / "data")
        worker = _Proc(env, Path(tmp) / "worker.log")
        try:
            settings = Settings(metrics_port=0, task_queue_suffix=suffix, data_dir=Path(tmp))
            client = await Client.connect(server.address, data_converter=data_converter(None))
            pc = PipelineClient(client, settings)
            await _polling(client, settings.queue(names.PIPELINES_QUEUE), worker.pid)
            for mode in MODES:  # warm-up: first workflow tasks, the flow workflows created
                await _round(pc, mode, -1)
            order = list(MODES)
            for i in range(rounds):
                for mode in order[i % 3 :] + order[: i % 3]:
                    out[mode].append(await _round(pc, mode, i))
            batch = await _batch(pc, starts, concurrency)
            plain_rate = await _plain_rate(client, starts, concurrency)
        finally:
            worker.stop()
    p = {m: percentiles(v) for m, v in out.items()}
    quiet_ms = QUIET_SECONDS * 1000
    plain50 = p["plain"]["p50"]
    debounce_extra = [d - quiet_ms for d in out["debounce"]]
    return {
        "ratio": round(p["singleton"]["p50"] / plain50, 3),
        "ratio_debounce": round((p["debounce"]["p50"] - quiet_ms) / plain50, 3),
        "plain_start_to_result_ms": {k: round(v, 1) for k, v in p["plain"].items()},
        "singleton_start_to_result_ms": {k: round(v, 1) for k, v in p["singleton"].items()},
        "debounce_start_to_result_ms": {k: round(v, 1) for k, v in p["debounce"].items()},
        "debounce_quiet_ms": quiet_ms,
        "debounce_extra_ms_p50": round(statistics.median(debounce_extra), 1),
        "batch_starts_per_s": round(batch["rate"], 1),
        "plain_starts_per_s": round(plain_rate, 1),
        "ratio_batch_vs_plain_starts": round(batch["rate"] / plain_rate, 3),
        "batch_runs": batch["runs"],
        "batch_max_items": BATCH_ITEMS,
        "starts": starts,
        "concurrency": concurrency,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "command": COMMAND if quick else ".venv/bin/python -m bench.flow",
    }


if __name__ == "__main__":
    standalone(run)
