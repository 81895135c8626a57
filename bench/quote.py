"""The cost quote's error against the measured cost of the run it quoted.

One local model (llama.cpp's ``llama-server`` with SmolLM2-135M, as ``aiworker
dev`` starts it), one embedded Temporal server, one ``aiworker worker`` process
serving ``examples/prompts/classify-ticket.json``. Its ``default`` alias is that
model, priced in a models file at :data:`PRICES` (a local model costs 0 unless
priced: the figures are the quote's arithmetic on real token counts, not a
provider's bill).

1. ``recorded`` runs of a one-step pipeline (one ticket each) are the history.
2. ``aiworker check --quote``'s figures for a pipeline whose step runs
   ``for_each`` over ``items`` other tickets (a size known at check time):
   :func:`aiworker.workers.quote.step_history` plus :func:`~aiworker.workers.quote.quote`,
   what the command prints with ``--json``.
3. That pipeline runs; its result's ``usage`` is the measured cost and tokens.

``quote_history_read_seconds`` (reading the recorded calls) and
``quote_math_seconds`` (the bootstrap) are what a start held to a tenant's
threshold waits for before it starts.

``ratio`` is measured cost over the quote's p50 cost (1.0: exact; tokens give
the same ratio up to the price split between input and output tokens:
``ratio_tokens``); ``error`` is ``|ratio - 1|``; ``within_p95`` whether the
measured cost is at most the quote's p95. The quote's duration is reported
next to the measured one, not used for the ratio (queueing is not modelled).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineSpec
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer
from aiworker.workers.quote import quote, step_history
from bench.common import embedded_server, standalone, worker_env
from bench.eval import SPEC_FILE, SUBJECTS
from bench.scale_out import _polling, _Proc

COMMAND = "BENCH_QUICK=1 .venv/bin/python -m bench.quote"
PRICES = {"input": 0.15, "output": 0.60}  # US dollars per million tokens (gpt-4o-mini's)
TENANT = "bench"
WORKER = "classify-ticket"


def pipeline(name: str, tickets: list[tuple[str, str]]) -> dict[str, Any]:
    """A step of the worker over ``tickets``: one call, or ``for_each`` over all."""
    step: dict[str, Any] = {"id": "triage", "worker": WORKER, "max_parallel": 2}
    if len(tickets) == 1:
        subject, body = tickets[0]
        step["input"] = {"subject": subject, "body": body}
    else:
        step["for_each"] = [{"subject": s, "body": b} for s, b in tickets]
        step["input"] = {"subject": "${{ item.subject }}", "body": "${{ item.body }}"}
    return {"name": name, "tenant": TENANT, "steps": [step], "output": {}}


def tickets(start: int, n: int) -> list[tuple[str, str]]:
    return [
        (f"{SUBJECTS[i % len(SUBJECTS)][0]} (#{i})", SUBJECTS[i % len(SUBJECTS)][1])
        for i in range(start, start + n)
    ]


async def run(quick: bool = False) -> dict[str, Any]:
    """Record, quote, run the quoted pipeline, compare (see the module doc)."""
    recorded, n_items = (6, 4) if quick else (16, 8)
    with (
        tempfile.TemporaryDirectory(prefix="aiworker-bench-quote-") as tmp,
        embedded_server() as server,
    ):
        model = ModelServer(Path(tmp) / "model-server.log").start()
        specs = Path(tmp) / "specs"
        specs.mkdir()
        (specs / SPEC_FILE.name).write_text(SPEC_FILE.read_text("utf-8"), "utf-8")
        models = Path(tmp) / "models.json"
        alias = {"provider": "openai", "base_url": model.base_url, "model": MODEL_NAME}
        models.write_text(
            json.dumps({"models": {"default": alias | {"usd_per_million_tokens": PRICES}}})
        )
        suffix = f"-quote{uuid.uuid4().hex[:6]}"
        env = worker_env(
            server.address,
            suffix,
            Path(tmp) / "data",
            AIWORKER_MODELS_FILE=str(models),
            AIWORKER_WORKER_SPECS=str(specs),
        )
        proc = _Proc(env, Path(tmp) / "worker.log")
        try:
            client = await Client.connect(server.address, data_converter=data_converter(None))
            await _polling(client, names.PIPELINES_QUEUE + suffix, proc.pid)
            pipelines = PipelineClient(client, Settings(task_queue_suffix=suffix))
            for i, ticket in enumerate(tickets(0, recorded)):
                h = await pipelines.start(pipeline(f"record-{i}", [ticket]), check=False)
                if (await pipelines.result(h.id)).status != "succeeded":
                    raise RuntimeError(f"recorded run {h.id} did not succeed")
            quoted = pipeline("quoted", tickets(recorded, n_items))
            spec = PipelineSpec.model_validate(quoted)
            deadline = time.monotonic() + 60
            while True:  # visibility lists ended runs a moment after they end
                read_start = time.perf_counter()
                history = await step_history(client, spec)
                read_seconds = time.perf_counter() - read_start
                if len(history["triage"]) >= recorded or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            started = time.perf_counter()
            q = quote(spec, history)
            quote_seconds = time.perf_counter() - started
            begin = time.perf_counter()
            h = await pipelines.start(quoted, check=False, accept_quote=True)
            result = await pipelines.result(h.id)
            measured_seconds = time.perf_counter() - begin
        finally:
            proc.stop()
            model.stop()
    usage = result.usage
    cost = float(usage.cost_usd)
    tokens = usage.input_tokens + usage.output_tokens
    ratio = cost / q.cost_usd.p50 if q.cost_usd.p50 else float("nan")
    ratio_tokens = tokens / q.tokens.p50 if q.tokens.p50 else float("nan")
    return {
        "ratio": ratio,
        "error": abs(ratio - 1),
        "ratio_tokens": ratio_tokens,
        "error_tokens": abs(ratio_tokens - 1),
        "within_p95": cost <= q.cost_usd.p95 and tokens <= q.tokens.p95,
        "measured": {"cost_usd": cost, "tokens": tokens, "duration_s": measured_seconds},
        "quote": q.as_dict(),
        "quote_from_calls": len(history["triage"]),
        "quote_math_seconds": quote_seconds,
        "quote_history_read_seconds": read_seconds,
        "status": result.status,
        "recorded_runs": recorded,
        "items": n_items,
        "prices_usd_per_million_tokens": PRICES,
        "command": COMMAND if quick else ".venv/bin/python -m bench.quote",
    }


if __name__ == "__main__":
    standalone(run)
