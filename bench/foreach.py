"""A large ``for_each`` on the embedded server: items per second, the largest
workflow history (the parent, or any chunk child at any level), and the worker
process's memory.

The worker is a separate ``aiworker worker`` process, as in production, so its
memory is its own (``ru_maxrss`` of this process would carry every earlier
bench's peak). A thread samples its ``VmRSS`` while the pipeline runs; the
idle figure is taken after the worker has started and run a small warm-up
for_each. The items run the real validator worker through the runtime;
payloads above the threshold (and every for_each chunk's items and results)
travel through the external payload storage under a temporary data directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from bench.common import embedded_server
from bench.counts import run_histories

QUICK_ITEMS = 10_000
FULL_ITEMS = 100_000
_SAMPLE_SECONDS = 0.2


def _rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` now, in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _PeakRss:
    """Samples a process's RSS from a thread until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, _rss_mb(self.pid))
            except OSError:  # the process ended
                return
            self._stop.wait(_SAMPLE_SECONDS)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _pipeline(n: int) -> dict[str, Any]:
    return {
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


async def _histories(client: Client, wid: str) -> dict[str, int]:
    """The history size (JSON bytes) of the pipeline and of every workflow it started,
    at any depth (the for_each chunk children)."""
    return {h.workflow_id: len(h.to_json().encode()) async for h in run_histories(client, wid)}


async def _wait_ready(client: Client, queue: str, proc: subprocess.Popen[bytes]) -> None:
    """Warm the worker up with a small for_each (which also waits for it to poll)."""
    await client.execute_workflow(
        names.PIPELINE_WORKFLOW,
        _pipeline(20),
        id=f"bench-foreach-warmup-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    if proc.poll() is not None:
        raise RuntimeError(f"the worker process exited with {proc.returncode}")


async def run(quick: bool = False) -> dict[str, Any]:
    """One pipeline with an N-item for_each (100,000; 10,000 when quick)."""
    n = QUICK_ITEMS if quick else FULL_ITEMS
    with embedded_server() as server, tempfile.TemporaryDirectory(prefix="bench-fe-") as tmp:
        suffix = f"-bench{uuid.uuid4().hex[:6]}"
        settings = Settings(data_dir=Path(tmp), metrics_port=0, task_queue_suffix=suffix)
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": server.address,
            "AIWORKER_DATA_DIR": tmp,
            "AIWORKER_METRICS_PORT": "0",
            "AIWORKER_TASK_QUEUE_SUFFIX": suffix,
            "AIWORKER_LOG_LEVEL": "WARNING",
        }
        cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "worker"]
        cmd += ["--task-queue", names.PIPELINES_QUEUE]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = await Client.connect(server.address, data_converter=data_converter(settings))
            queue = settings.queue(names.PIPELINES_QUEUE)
            await _wait_ready(client, queue, proc)
            rss_before = _rss_mb(proc.pid)
            wid = f"bench-foreach-{uuid.uuid4().hex[:8]}"
            with _PeakRss(proc.pid) as peak:
                t0 = time.perf_counter()
                result = await client.execute_workflow(
                    names.PIPELINE_WORKFLOW, _pipeline(n), id=wid, task_queue=queue
                )
                wall = time.perf_counter() - t0
            if result["output"]["succeeded"] != n:
                raise RuntimeError(f"for_each bench: {result['output']} of {n} items")
            sizes = await _histories(client, wid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    largest = max(sizes, key=lambda k: sizes[k])
    return {
        "items": n,
        "wall_seconds": round(wall, 2),
        "items_per_second": round(n / wall, 1),
        "peak_worker_rss_mb": round(peak.peak, 1),
        "rss_before_mb": round(rss_before, 1),
        "rss_ratio": round(peak.peak / rss_before, 2),
        "workflows": len(sizes),
        "largest_history_bytes": sizes[largest],
        "largest_history": "parent" if largest == wid else "chunk child",
        "parent_history_bytes": sizes[wid],
    }


if __name__ == "__main__":
    import asyncio
    import json

    quick = os.environ.get("BENCH_QUICK") == "1"
    items = int(sys.argv[1]) if len(sys.argv) > 1 else None
    if items:
        QUICK_ITEMS = FULL_ITEMS = items
    print(json.dumps(asyncio.run(run(quick)), indent=2))
