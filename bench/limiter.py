"""The limiter's ceiling: one rate-limit key driven with rising permit demand.

One ``aiworker worker`` process on the embedded server runs pipelines with a
``for_each`` of the trivial ``validator`` worker at rising ``max_parallel``
(the demand), for three tenants in the same run:

- ``free``: no rate limit, so no item asks a limiter (the baseline);
- ``far``: ``validator:far`` limited far above any demand (100,000,000/min): every
  item takes a permit from the key's limiter, which never makes one wait;
- ``tight`` (full runs only): ``validator:tight`` at 100/s, below demand: the
  limiter decides the pace, which must not pass the limit.

Each case reports items/s (each limited item is one permit, so for ``far``
that is the key's permits/s) and the grant latency of its items: from the
moment the ``limiter-acquire`` local activity took the request (``asked_at``
in its recorded result) to the moment the item could go: its ``permit``
signal in the chunk's history, or the permit taken from the process's leased
block (``granted_at``). A chunk's queued asks and permits are paired in order
(the limiter grants in arrival order), so those latencies are a distribution,
not per-item truths.

Headline ``ratio``: ``far`` permits/s over ``free`` steps/s at
``max_parallel`` 200, from alternating rounds of both (3 quick, 5 full; 1.0:
the limit costs nothing), with the grant latency of those rounds; at 400 in
flight this 2-core machine is saturated either way (the ``cases`` rows).
Quick mode (``BENCH_QUICK=1``) runs fewer items and no ``tight`` case (about
a minute).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from bench.common import embedded_server, percentiles, standalone, worker_env
from bench.counts import run_histories

COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.limiter"
_FAR = "100000000/min"
_TIGHT_PER_S = 100
_LOCAL_MARKER = "core_local_activity"
LEVELS = [16, 64, 200, 400]  # max_parallel: the demand, rising
HEADLINE_PARALLEL = 200


def _pipeline(tenant: str, n: int, parallel: int) -> dict[str, Any]:
    return {
        "name": "bench-limiter",
        "tenant": tenant,
        "inputs": {"items": list(range(n))},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.items }}",
                "max_parallel": parallel,
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            }
        ],
        "output": {"succeeded": "${{ steps.each.outputs.succeeded }}"},
    }


def _latencies(history: WorkflowHistory) -> list[float]:
    """Grant latencies (seconds) of one chunk's items (see the module docstring)."""
    pooled: list[float] = []
    queued: list[float] = []  # when each queued request was asked
    permits: list[float] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            a = e.marker_recorded_event_attributes
            if a.marker_name != _LOCAL_MARKER:
                continue
            kind = json.loads(a.details["data"].payloads[0].data)["activity_type"]
            if not a.details["result"].payloads:
                continue
            answer = json.loads(a.details["result"].payloads[0].data)
            if kind == names.LIMITER_ACQUIRE:
                answers = [answer]
            elif kind == names.LIMITER_ACQUIRE_MANY:
                answers = answer["results"]
            else:
                continue
            for r in answers:
                if r.get("pooled"):
                    pooled.append(r["granted_at"] - r["asked_at"])
                elif r.get("limited"):
                    # an answer from before asked_at: the marker's time
                    queued.append(r.get("asked_at") or e.event_time.ToDatetime().timestamp())
        elif (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == names.PERMIT_SIGNAL
        ):
            permits.append(e.event_time.ToDatetime().timestamp())
    # the limiter grants in arrival order: pair a chunk's asks and permits in order
    return pooled + [p - a for a, p in zip(sorted(queued), sorted(permits), strict=False)]


async def _case(client: Client, queue: str, tenant: str, n: int, parallel: int) -> dict[str, Any]:
    wid = f"bench-limiter-{tenant}-{parallel}-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    result = await client.execute_workflow(
        names.PIPELINE_WORKFLOW, _pipeline(tenant, n, parallel), id=wid, task_queue=queue
    )
    wall = time.perf_counter() - t0
    if result["output"]["succeeded"] != n:
        raise RuntimeError(f"limiter bench {tenant}: {result['output']} of {n} items")
    lat: list[float] = []
    async for h in run_histories(client, wid):
        if h.workflow_id != wid:
            lat += _latencies(h)
    return {"tenant": tenant, "max_parallel": parallel, "items": n, "seconds": wall, "lat": lat}


def _row(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """One tenant's figures over one or more runs of the same demand."""
    lat = [x for c in cases for x in c["lat"]]
    items, seconds = sum(c["items"] for c in cases), sum(c["seconds"] for c in cases)
    p = percentiles(lat) if lat else {"p50": 0.0, "p95": 0.0}
    return {
        "tenant": cases[0]["tenant"],
        "max_parallel": cases[0]["max_parallel"],
        "items": items,
        "seconds": round(seconds, 2),
        "per_s": round(items / seconds, 1),
        "grant_p50_ms": round(p["p50"] * 1000, 1),
        "grant_p95_ms": round(p["p95"] * 1000, 1),
        "asks": len(lat),
    }


async def run(quick: bool = False) -> dict[str, Any]:
    """Rising demand on one key (``far``) against no limit (``free``), same run; the
    headline from alternating rounds at ``HEADLINE_PARALLEL``."""
    n = 600 if quick else 3000
    rounds = 3 if quick else 5
    with embedded_server() as server, tempfile.TemporaryDirectory(prefix="bench-lim-") as tmp:
        suffix = f"-bench{uuid.uuid4().hex[:6]}"
        settings = Settings(metrics_port=0, task_queue_suffix=suffix)
        env = worker_env(
            server.address,
            suffix,
            Path(tmp),
            AIWORKER_RATE_LIMITS=f"validator:far={_FAR},validator:tight={_TIGHT_PER_S}/s",
        )
        cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "worker"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = await Client.connect(server.address, data_converter=data_converter(settings))
            queue = settings.queue(names.PIPELINES_QUEUE)
            for tenant in ("free", "far"):  # warm-up (also waits for the worker to poll)
                await _case(client, queue, tenant, 20, 20)
            rows = []
            # alternate the order so load from elsewhere hits both alike
            for i, parallel in enumerate(LEVELS):
                for tenant in ("free", "far") if i % 2 else ("far", "free"):
                    rows.append(_row([await _case(client, queue, tenant, n, parallel)]))
            head: dict[str, list[dict[str, Any]]] = {"free": [], "far": []}
            for i in range(rounds):
                for tenant in ("free", "far") if i % 2 else ("far", "free"):
                    head[tenant].append(await _case(client, queue, tenant, n, HEADLINE_PARALLEL))
            if not quick:
                rows.append(_row([await _case(client, queue, "tight", n, LEVELS[-1])]))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    free, far = _row(head["free"]), _row(head["far"])
    out: dict[str, Any] = {
        "ratio": round(far["per_s"] / free["per_s"], 3),
        "permits_per_s": far["per_s"],
        "unlimited_steps_per_s": free["per_s"],
        "grant_p50_ms": far["grant_p50_ms"],
        "grant_p95_ms": far["grant_p95_ms"],
        "max_parallel": HEADLINE_PARALLEL,
        "rounds": rounds,
        "cases": rows,
        "command": COMMAND if quick else COMMAND.replace("BENCH_QUICK=1 ", ""),
    }
    tight = [r for r in rows if r["tenant"] == "tight"]
    if tight:
        out["tight_limit_per_s"] = _TIGHT_PER_S
        out["tight_per_s"] = tight[0]["per_s"]
    return out


if __name__ == "__main__":
    standalone(run)
