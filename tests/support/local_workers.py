"""A plugin worker that runs as a local activity
(``AIWORKER_WORKER_MODULES=support.local_workers``): a short CPU-only worker on the
pipelines queue whose spec says ``"execution": "local"``."""

from __future__ import annotations

from typing import Any

import aiworker


class UpperLocal(aiworker.Worker):
    """``{"text": t}`` -> ``{"text": t.upper()}``, in the process running the pipeline."""

    spec = {
        "worker_id": "upper-local",
        "version": "1.0.0",
        "purpose": "upper-case a text (a local-activity test worker)",
        "task_queue": "aiworker-pipelines",
        "execution": "local",
        "input_schema": {
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        },
        "output_schema": {
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string"}},
        },
        "constraints": {"timeout_seconds": 5},
        "retries": {"max_attempts": 2},
    }

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        return aiworker.Result(outputs={"text": input["text"].upper()})


WORKERS = [UpperLocal]
