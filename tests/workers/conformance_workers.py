"""Workers for the conformance kit's tests (tests/workers/test_conformance.py),
also loadable as ``AIWORKER_WORKER_MODULES=conformance_workers`` by an
``aiworker conformance`` subprocess. ``WORKERS`` holds the one that keeps its
contract; the broken ones are served by the tests themselves."""

from __future__ import annotations

from typing import Any

import aiworker


def spec(worker_id: str, **overrides: Any) -> dict[str, Any]:
    """A small contract: ``{"text"}`` -> ``{"length"}``, retried up to 3 times, quickly."""
    raw: dict[str, Any] = {
        "worker_id": worker_id,
        "version": "1.2.0",
        "purpose": "Measure a text.",
        "task_queue": "aiworker-pipelines",
        "input_schema": {
            "type": "object",
            "required": ["text"],
            "properties": {"text": {"type": "string", "maxLength": 1000}},
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "required": ["length"],
            "properties": {"length": {"type": "integer", "minimum": 0}},
            "additionalProperties": False,
        },
        "constraints": {"timeout_seconds": 8},
        "retries": {"max_attempts": 3, "initial_interval_ms": 50, "max_interval_ms": 100},
        "examples": [{"input": {"text": "abc"}, "description": "three letters"}],
    }
    return raw | overrides


class TextLength(aiworker.Worker):
    """Keeps its contract."""

    spec = spec("text-length")

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        return aiworker.Result(outputs={"length": len(input["text"])})


class WrongOutput(aiworker.Worker):
    """Returns a length as words: its output breaks its own output_schema."""

    spec = spec("wrong-output")

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        return aiworker.Result(outputs={"length": f"{len(input['text'])} letters"})


class LaxInput(aiworker.Worker):
    """Served under a looser input schema than the published one (an outdated
    deployment): a request without ``text`` reaches ``execute``, which raises a
    plain ``KeyError`` (``internal``, retried) instead of refusing the input."""

    spec = spec("lax-input", input_schema={"type": "object"})

    async def execute(self, ctx: aiworker.Context, input: dict[str, Any]) -> aiworker.Result:  # noqa: A002 (Worker.execute's documented signature)
        return aiworker.Result(outputs={"length": len(input["text"])})


WORKERS = [TextLength]
