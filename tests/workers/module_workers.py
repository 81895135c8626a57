"""A module for ``AIWORKER_WORKER_MODULES``: its ``WORKERS`` lists the workers
it adds (tests/workers/test_plugins.py). The spec is written inline, as a
dict, which the SDK accepts beside a spec file."""

from __future__ import annotations

from typing import Any

import aiworker

SPEC: dict[str, Any] = {
    "worker_id": "word-count",
    "version": "1.0.0",
    "purpose": "Count the words of a text.",
    "task_queue": "aiworker-pipelines",
    "input_schema": {
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string", "maxLength": 100000}},
    },
    "output_schema": {
        "type": "object",
        "required": ["words"],
        "properties": {"words": {"type": "integer", "minimum": 0}},
    },
    "constraints": {"timeout_seconds": 5},
    "retries": {"max_attempts": 1},
    "examples": [{"input": {"text": "one two three"}}],
}


class WordCount(aiworker.Worker):
    """``{"text": ...}`` -> ``{"words": <count>}``."""

    spec = SPEC

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        return aiworker.Result(outputs={"words": len(input["text"].split())})


WORKERS = [WordCount]
