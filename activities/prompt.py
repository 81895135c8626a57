"""Prompt workers: a spec file with a template is a worker, with no code.

A spec whose ``implementation.kind`` is ``prompt`` names a model alias, a
system and a user template (``${{ input.<path> }}`` references into the
worker's input) and optional few-shot examples. :class:`PromptWorker` renders
them into one llm-call request and runs it through the llm-call machinery
(:class:`~aiworker.activities.llm_call.LlmCall`: model registry, limits,
breaker, usage booking), with the spec's ``output_schema`` as the
structured-output schema. A reply that misses the schema is
``invalid_output`` with the validator's reasons, so a pipeline's ``validate``
loop sends them back as ``feedback`` (every prompt worker's input accepts it)
and the next attempt shows them to the model.
"""

from __future__ import annotations

import json
from typing import Any

from aiworker.activities.llm_call import LlmCall
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.schemas.refs import TEMPLATE_ROOTS, resolve
from aiworker.schemas.spec import PromptImplementation, WorkerSpec


def render(template: str, input: dict[str, Any]) -> str:
    """``template`` with every ``${{ input.<path> }}`` replaced from ``input``."""
    value = resolve(template, {"input": input}, TEMPLATE_ROOTS)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class PromptWorker(Worker):
    """The worker a prompt spec describes; one instance per spec file."""

    def __init__(self, spec: WorkerSpec) -> None:
        if not isinstance(spec.implementation, PromptImplementation):
            raise TypeError(f"worker {spec.worker_id!r} is not a prompt worker")
        self.spec = spec  # type: ignore[misc]  # per instance: one class, many specs
        self.prompt: PromptImplementation = spec.implementation
        self._llm = LlmCall()

    def llm_input(self, input: dict[str, Any]) -> dict[str, Any]:
        """The llm-call input for one call: few-shot turns, then this input's prompt."""
        p = self.prompt
        messages: list[dict[str, str]] = []
        for shot in p.few_shot:
            messages.append({"role": "user", "content": render(p.prompt, shot.input)})
            messages.append(
                {"role": "assistant", "content": json.dumps(shot.output, ensure_ascii=False)}
            )
        messages.append({"role": "user", "content": render(p.prompt, input)})
        out: dict[str, Any] = {
            "messages": messages,
            "model": p.model,
            "response_schema": self.spec.output_schema,
        }
        if p.system:
            out["system"] = render(p.system, input)
        if p.temperature is not None:
            out["temperature"] = p.temperature
        if input.get("feedback"):
            out["feedback"] = input["feedback"]
        return out

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:
        result = await self._llm.execute(ctx, self.llm_input(input))
        outputs = result.outputs["json"]
        return WorkerResult(
            outputs=outputs,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            log_fields=result.log_fields,
        )
