"""Items/s of an eval run against calling the same model directly, same concurrency.

One local model (llama.cpp's ``llama-server`` with SmolLM2-135M, as ``aiworker
dev`` starts it), one embedded Temporal server, one ``aiworker worker`` process
serving ``examples/prompts/classify-ticket.json`` with ``default`` = that model.
Rounds alternate between:

- **direct**: httpx posts the prompt worker's own rendering of each item (the
  system text, the few-shot turns, the item's prompt, the output schema as
  ``response_format``; ``PromptWorker.llm_input``) to ``/v1/chat/completions``,
  ``concurrency`` requests at a time;
- **eval**: ``EvalWorkflow`` over the same items with the same spec as candidate
  (``eval-call`` activities: input and output contracts, usage booking, the
  history), ``concurrency`` items at a time, timed from ``start_workflow`` to
  its result.

``ratio_vs_direct`` (also ``ratio``) is the median over rounds of eval items/s
over direct items/s of the same round (back to back, so the load other work
puts on the shared cores hits both alike).
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
from temporalio.client import Client

from aiworker.activities.prompt import PromptWorker
from aiworker.schemas import names
from aiworker.schemas.evals import EvalCandidate, EvalInput, EvalItem, EvalResult
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer
from bench.common import embedded_server, standalone, worker_env
from bench.scale_out import _polling, _Proc

SPEC_FILE = Path(__file__).resolve().parent.parent / "examples" / "prompts" / "classify-ticket.json"
COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.eval"
SUBJECTS = [
    ("Checkout page returns 500", "Nobody can pay since 09:10."),
    ("Charged twice for March", "My card was charged two times for INV-2291."),
    ("Dark mode?", "Any plans for a dark theme in the dashboard?"),
    ("Cannot log in", "The login form rejects my password after a reset."),
    ("Export is empty", "The CSV export has headers but no rows."),
    ("Invoice address", "How do I change the address on my invoices?"),
    ("API rate limit", "We get 429 from the API at 10 requests a second."),
    ("Add SSO", "We would like to log in with our Okta."),
]


def items(n: int) -> list[dict[str, Any]]:
    return [
        {"subject": f"{s} (#{i})", "body": b}
        for i, (s, b) in ((i, SUBJECTS[i % len(SUBJECTS)]) for i in range(n))
    ]


def direct_body(worker: PromptWorker, item: dict[str, Any]) -> dict[str, Any]:
    rendered = worker.llm_input(item)
    messages = [{"role": "system", "content": rendered["system"]}, *rendered["messages"]]
    return {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": worker.spec.constraints.max_tokens,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": worker.spec.output_schema},
        },
    }


async def direct(base_url: str, worker: PromptWorker, batch: list[dict[str, Any]], c: int) -> float:
    """Seconds to answer every item of ``batch``, ``c`` at a time, straight to the model."""
    gate = asyncio.Semaphore(c)

    async def one(http: httpx.AsyncClient, item: dict[str, Any]) -> None:
        async with gate:
            r = await http.post(base_url + "/chat/completions", json=direct_body(worker, item))
            r.raise_for_status()
            json.loads(r.json()["choices"][0]["message"]["content"])

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(one(http, i) for i in batch))
    return time.perf_counter() - start


async def evaluated(
    client: Client, suffix: str, spec: WorkerSpec, batch: list[dict[str, Any]], c: int
) -> float:
    """Seconds from starting an EvalWorkflow over ``batch`` to its result."""
    inp = EvalInput(
        dataset_sha256="0" * 64,
        items=[EvalItem(id=f"i{n}", input=i) for n, i in enumerate(batch)],
        candidate=EvalCandidate(mode="spec", spec=spec),
        concurrency=c,
        queue_suffix=suffix,
    )
    start = time.perf_counter()
    result = await client.execute_workflow(
        names.EVAL_WORKFLOW,
        inp,
        id=f"bench-eval-{uuid.uuid4().hex[:8]}",
        task_queue=names.PIPELINES_QUEUE + suffix,
        result_type=EvalResult,
    )
    elapsed = time.perf_counter() - start
    failed = [r.error_code for r in result.items if r.status == "failed"]
    if failed:
        raise RuntimeError(f"eval items failed: {failed}")
    return elapsed


async def run(quick: bool = False) -> dict[str, Any]:
    """Eval items/s over direct items/s, alternating rounds (see the module doc)."""
    rounds, n, concurrency = (2, 8, 4) if quick else (4, 24, 4)
    spec = WorkerSpec.from_file(SPEC_FILE)
    worker = PromptWorker(spec)
    seconds: dict[str, list[float]] = {"direct": [], "eval": []}
    with (
        tempfile.TemporaryDirectory(prefix="aiworker-bench-eval-") as tmp,
        embedded_server() as server,
    ):
        model = ModelServer(Path(tmp) / "model-server.log").start()
        specs = Path(tmp) / "specs"
        specs.mkdir()
        (specs / SPEC_FILE.name).write_text(SPEC_FILE.read_text("utf-8"), "utf-8")
        suffix = f"-eval{uuid.uuid4().hex[:6]}"
        env = worker_env(
            server.address,
            suffix,
            Path(tmp) / "data",
            AIWORKER_LLM_BASE_URL=model.base_url,
            AIWORKER_LLM_MODEL=MODEL_NAME,
            AIWORKER_WORKER_SPECS=str(specs),
        )
        proc = _Proc(env, Path(tmp) / "worker.log")
        try:
            client = await Client.connect(server.address, data_converter=data_converter(None))
            await _polling(client, names.PIPELINES_QUEUE + suffix, proc.pid)
            # warm-up: the model's first answers and the worker's first calls are slower
            await direct(model.base_url, worker, items(concurrency), concurrency)
            await evaluated(client, suffix, spec, items(concurrency), concurrency)
            batch = items(n)
            for r in range(rounds):
                order = ("direct", "eval") if r % 2 == 0 else ("eval", "direct")
                for path in order:
                    if path == "direct":
                        s = await direct(model.base_url, worker, batch, concurrency)
                    else:
                        s = await evaluated(client, suffix, spec, batch, concurrency)
                    seconds[path].append(s)
        finally:
            proc.stop()
            model.stop()
    per_round = [d / e for d, e in zip(seconds["direct"], seconds["eval"], strict=True)]
    ratio = statistics.median(per_round)
    return {
        "ratio": ratio,
        "ratio_vs_direct": ratio,
        "rounds_ratio": [round(x, 3) for x in per_round],
        "eval_items_per_s_p50": n / statistics.median(seconds["eval"]),
        "direct_items_per_s_p50": n / statistics.median(seconds["direct"]),
        "rounds_seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
        "items": n,
        "rounds": rounds,
        "concurrency": concurrency,
        "command": COMMAND if quick else ".venv/bin/python -m bench.eval",
    }


if __name__ == "__main__":
    standalone(run)
