"""A streamed ``llm-call`` step against the same request streamed directly.

One local model (llama.cpp's ``llama-server`` with SmolLM2-135M, started as
``aiworker dev`` starts it: ``workers/devstack/modelserver.py``), one embedded Temporal
server, one ``aiworker worker`` process whose ``default`` alias is that model.
Rounds alternate, one request at a time, between:

- **direct**: httpx posts the OpenAI-compatible ``/v1/chat/completions`` with
  ``stream: true`` and reads the server-sent events;
- **step**: ``PipelineWorkflow`` with one ``llm-call`` step, ``"stream": true``,
  the same prompt, ``max_tokens``, ``temperature: 0`` and ``seed``.

How the step's first token is seen: the step publishes its stream as the
heartbeat details of the running attempt (docs/streaming.md); the first
heartbeat goes out with the first content delta. The bench polls
``describe()`` while the step runs and takes, from the first description whose
details hold a token, the server's own ``last_heartbeat_time``: the moment
Temporal received that first heartbeat, the first moment any client can read
the token. So the figure does not depend on how often the bench polls.
Time to first token (TTFT) runs from the request: for the step, from the
client's ``start_workflow`` call, so it includes starting the pipeline, its
first workflow task, scheduling the activity and the worker taking it.

Tokens/s is the stream's rate after its first token: ``(tokens - 1) /
(last - first)``. Direct: the last content chunk read. Step: the attempt's
``ActivityTaskCompleted`` (the whole reply recorded in Temporal, after the
stream's usage chunk and the output's checks). ``ratio`` = step tokens/s over
direct tokens/s, and ``first_token_overhead_ms`` = step TTFT minus direct TTFT,
each the median over rounds of the two runs of one round (back to back, so
the load other work puts on the shared cores hits both alike); the ratio of
the p50s is reported beside them, and so is end to end (request to the
pipeline's result).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer
from bench.common import embedded_server, percentiles, standalone, worker_env
from bench.scale_out import _polling, _Proc

PROMPT = "Write a short story about a lighthouse keeper and a cat who live by the sea."
SEED = 7
COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.llm_stream"


async def direct(base_url: str, max_tokens: int) -> dict[str, Any]:
    """One streamed request straight to llama-server: TTFT, rate, tokens.

    A fresh connection each time: llama-server drops idle keep-alive
    connections, and a dropped pooled one would fail the round (loopback
    connects in well under a millisecond)."""
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": SEED,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    tokens = 0
    async with httpx.AsyncClient(timeout=120) as http:
        t0 = time.perf_counter()
        async with http.stream("POST", f"{base_url}/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                for choice in doc.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                if doc.get("usage"):
                    tokens = doc["usage"]["completion_tokens"]
        end = time.perf_counter()
    if first is None or last is None:
        raise RuntimeError("the model streamed no content")
    return {
        "ttft_ms": (first - t0) * 1000,
        "tokens": tokens,
        "tokens_per_s": (tokens - 1) / (last - first),
        "total_s": end - t0,
    }


def pipeline(max_tokens: int) -> dict[str, Any]:
    return {
        "name": "bench-llm-stream",
        "tenant": "bench",
        "steps": [
            {
                "id": "ask",
                "worker": names.LLM_CALL,
                "input": {
                    "prompt": PROMPT,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "seed": SEED,
                    "stream": True,
                },
            }
        ],
    }


async def step(client: Client, queue: str, max_tokens: int) -> dict[str, Any]:
    """One pipeline with the streamed step: TTFT as Temporal saw the first
    heartbeat, the rate up to the attempt's completion, tokens."""
    wid = f"llm-stream-{uuid.uuid4().hex}"
    t0_wall, t0 = time.time(), time.perf_counter()
    handle = await client.start_workflow(
        names.PIPELINE_WORKFLOW, pipeline(max_tokens), id=wid, task_queue=queue
    )
    result_task = asyncio.ensure_future(handle.result())
    first_beat: float | None = None
    first_tokens = 1
    while first_beat is None and not result_task.done():
        desc = await handle.describe()
        for act in desc.raw_description.pending_activities:
            if act.activity_type.name != names.LLM_CALL or not act.heartbeat_details.payloads:
                continue
            (details,) = await client.data_converter.decode(act.heartbeat_details.payloads)
            if details.get("tokens", 0) >= 1:
                first_beat = act.last_heartbeat_time.ToDatetime().timestamp()
                first_tokens = details["tokens"]
        if first_beat is None:
            await asyncio.sleep(0.005)
    result = await result_task
    end = time.perf_counter()
    # a reply cut at max_tokens is "partial" (finish_reason "length"): still a full stream
    if result["status"] not in ("succeeded", "partial"):
        raise RuntimeError(f"the step ended {result['status']}: {result.get('error')}")
    if first_beat is None:
        raise RuntimeError("no heartbeat with a token was seen before the step ended")
    at: dict[int, float] = {}
    async for e in handle.fetch_history_events():
        at.setdefault(e.event_type, e.event_time.ToDatetime().timestamp())
    completed = at.get(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    scheduled = at.get(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    started = at.get(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    if completed is None or scheduled is None or started is None:
        raise RuntimeError("no completed llm-call activity in the history")
    tokens = result["steps"]["ask"]["outputs"]["usage"]["output_tokens"]
    return {
        "ttft_ms": (first_beat - t0_wall) * 1000,
        "tokens": tokens,
        "tokens_per_s": (tokens - first_tokens) / (completed - first_beat),
        "total_s": end - t0,
        # where the time to the first token goes (server timestamps)
        "to_scheduled_ms": (scheduled - t0_wall) * 1000,
        "to_started_ms": (started - scheduled) * 1000,
        "to_first_beat_ms": (first_beat - started) * 1000,
    }


def _p50(rounds: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(float(r[key]) for r in rounds))


async def run(quick: bool = False) -> dict[str, Any]:
    """Streamed step against streamed direct, alternating rounds (see the module doc)."""
    rounds, max_tokens = (8, 128) if quick else (20, 256)
    out: dict[str, list[dict[str, Any]]] = {"direct": [], "step": []}
    with (
        tempfile.TemporaryDirectory(prefix="aiworker-llm-stream-") as tmp,
        embedded_server() as server,
    ):
        model = ModelServer(Path(tmp) / "model-server.log").start()
        suffix = f"-llms{uuid.uuid4().hex[:6]}"
        env = worker_env(server.address, suffix, Path(tmp) / "data")
        env.update(AIWORKER_LLM_BASE_URL=model.base_url, AIWORKER_LLM_MODEL=MODEL_NAME)
        worker = _Proc(env, Path(tmp) / "worker.log")
        try:
            client = await Client.connect(server.address, data_converter=data_converter(None))
            queue = f"{names.PIPELINES_QUEUE}{suffix}"
            await _polling(client, queue, worker.pid)
            # warm-up: the model's first answer and the worker's first call are slower
            await direct(model.base_url, 16)
            await step(client, queue, 16)
            for i in range(rounds):
                order = ("direct", "step") if i % 2 == 0 else ("step", "direct")
                for path in order:
                    if path == "direct":
                        out[path].append(await direct(model.base_url, max_tokens))
                    else:
                        out[path].append(await step(client, queue, max_tokens))
        finally:
            worker.stop()
            model.stop()
    d, s = out["direct"], out["step"]
    # Each round's two runs ran back to back, so their ratio cancels the load other
    # work puts on the shared cores at that moment; the median of those is the figure.
    paired = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(d, s, strict=True)]
    overhead = [b["ttft_ms"] - a["ttft_ms"] for a, b in zip(d, s, strict=True)]
    return {
        "ratio": statistics.median(paired),
        "first_token_overhead_ms": statistics.median(overhead),
        "ratio_of_p50s": _p50(s, "tokens_per_s") / _p50(d, "tokens_per_s"),
        "first_token_overhead_of_p50s_ms": _p50(s, "ttft_ms") - _p50(d, "ttft_ms"),
        "rounds_ratio": [round(r, 3) for r in paired],
        "direct": {
            "ttft_ms": percentiles([r["ttft_ms"] for r in d]),
            "tokens_per_s_p50": _p50(d, "tokens_per_s"),
            "total_s_p50": _p50(d, "total_s"),
            "tokens": sorted({r["tokens"] for r in d}),
            "rounds_tokens_per_s": [round(r["tokens_per_s"], 1) for r in d],
        },
        "step": {
            "ttft_ms": percentiles([r["ttft_ms"] for r in s]),
            "tokens_per_s_p50": _p50(s, "tokens_per_s"),
            "total_s_p50": _p50(s, "total_s"),
            "tokens": sorted({r["tokens"] for r in s}),
            "rounds_tokens_per_s": [round(r["tokens_per_s"], 1) for r in s],
            # p50s: request -> activity scheduled (pipeline start, first workflow
            # task, limiter plan) -> taken by the worker -> first heartbeat received
            "ttft_parts_ms": {
                k: _p50(s, k) for k in ("to_scheduled_ms", "to_started_ms", "to_first_beat_ms")
            },
        },
        "end_to_end_ratio": _p50(d, "total_s") / _p50(s, "total_s"),
        "rounds": rounds,
        "max_tokens": max_tokens,
        "targets": {"ratio": ">= 0.95", "first_token_overhead_ms": "< 50"},
        "command": COMMAND if quick else ".venv/bin/python -m bench.llm_stream",
    }


if __name__ == "__main__":
    standalone(run)
