"""Workers for the step-cache tests (``AIWORKER_WORKER_MODULES=support.cache_workers``).

They run through the real worker runtime, as any plugin does, and count in
:data:`CALLS` how often their code actually ran, by input text, so a test
can tell a cache hit (the count stays) from a run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiworker

CALLS: Counter[str] = Counter()


def _spec(worker_id: str) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "version": "1.0.0",
        "purpose": "a step-cache test worker",
        "task_queue": "aiworker-pipelines",
        "input_schema": {
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}, "feedback": {}},
        },
        "output_schema": {
            "type": "object",
            "required": ["reply"],
            "properties": {"reply": {"type": "string"}},
        },
        "constraints": {"timeout_seconds": 5},
        "retries": {"max_attempts": 1},
    }


class Echo(aiworker.Worker):
    """``{"text": t}`` -> ``{"reply": t}``; with ``feedback``, ``t + " (fixed)"``."""

    spec = _spec("cache-echo")

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        CALLS[f"{self.worker_id}:{ctx.tenant}:{input['text']}"] += 1
        fixed = " (fixed)" if input.get("feedback") else ""
        return aiworker.Result(outputs={"reply": input["text"] + fixed})


class Gone(aiworker.Worker):
    """Always fails ``not_found`` (so that a step's fallback runs)."""

    spec = _spec("cache-gone")

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        CALLS[f"{self.worker_id}:{ctx.tenant}:{input['text']}"] += 1
        raise aiworker.NotFoundError("nothing here")


WORKERS = [Echo, Gone]
