"""A large ``for_each`` on the embedded server: wall time, peak worker memory,
largest workflow history (parent or chunk child).

The items run the real validator worker through the runtime; history stays
bounded because items run in child workflows of ``chunk_size`` items.
"""

from __future__ import annotations

import math
import resource
import time
import uuid
from typing import Any

from temporalio.client import Client

from aiworker.activities.runtime import WorkerRuntime
from aiworker.schemas import names
from aiworker.schemas.catalog import load_specs
from aiworker.schemas.pipeline import Step
from aiworker.schemas.settings import Settings
from aiworker.workers.temporal_client import data_converter
from aiworker.workers.worker import build_workers
from bench.common import embedded_server


def _rss_mb() -> float:
    # ru_maxrss is in KiB on Linux: the peak of this process, which runs the worker
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _history_bytes(client: Client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.to_json().encode())


async def run(quick: bool = False) -> dict[str, Any]:
    """One pipeline with an N-item for_each (10,000; 1,000 when quick)."""
    n = 1000 if quick else 10000
    pipeline = {
        "name": "bench-foreach",
        "tenant": "bench",
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "max_parallel": 200,
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            }
        ],
        "output": {"succeeded": "${{ steps.each.outputs.succeeded }}"},
    }
    rss_before = _rss_mb()
    with embedded_server() as server:
        client = await Client.connect(server.address, data_converter=data_converter(None))
        settings = Settings(metrics_port=0, task_queue_suffix=f"-bench{uuid.uuid4().hex[:6]}")
        runtime = WorkerRuntime(settings, load_specs())
        workers = build_workers(client, settings, runtime, [names.PIPELINES_QUEUE])
        wid = f"bench-foreach-{uuid.uuid4().hex[:8]}"
        async with workers[0]:
            t0 = time.perf_counter()
            result = await client.execute_workflow(
                names.PIPELINE_WORKFLOW,
                pipeline,
                id=wid,
                task_queue=settings.queue(names.PIPELINES_QUEUE),
            )
            wall = time.perf_counter() - t0
        assert result["output"]["succeeded"] == n, result["output"]
        sizes = {wid: await _history_bytes(client, wid)}
        chunk = Step.model_fields["chunk_size"].default
        for k in range(math.ceil(n / chunk)):
            child = f"{wid}/each/{k}"
            sizes[child] = await _history_bytes(client, child)
    largest = max(sizes, key=lambda k: sizes[k])
    return {
        "items": n,
        "wall_seconds": round(wall, 2),
        "items_per_second": round(n / wall, 1),
        "peak_worker_rss_mb": round(_rss_mb(), 1),
        "rss_before_mb": round(rss_before, 1),
        "workflows": len(sizes),
        "largest_history_bytes": sizes[largest],
        "largest_history": "parent" if largest == wid else "chunk child",
        "parent_history_bytes": sizes[wid],
    }
