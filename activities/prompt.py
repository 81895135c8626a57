"""Prompt workers: a spec file with a template is a worker, with no code.

A spec whose ``implementation.kind`` is ``prompt`` names a model alias, a
system and a user template (``${{ input.<path> }}`` references into the
worker's input) and optional few-shot examples. :class:`PromptWorker` renders
them into one llm-call request and runs it through the llm-call machinery
(:class:`~aiworker.activities.llm_call.LlmCall`: model registry, limits,
breaker, usage booking) under the prompt worker's own spec: its worker id,
timeout, ``max_tokens``, tool allow-list, call quota and retries, never
llm-call's. The spec's ``output_schema`` is the structured-output schema.

The conversation sent::

    system    system template, rendered with the input      (if any)
    user      prompt template, rendered with few_shot[0].input
    assistant few_shot[0].output as JSON
    ...                                                     (each example)
    user      prompt template, rendered with the input
    user      "Your previous answer was rejected ..."        (with feedback)

A reply that misses the schema is ``invalid_output`` with the validator's
reasons, so a pipeline's ``validate`` loop sends them back as ``feedback``
(every prompt worker's input accepts it, see
:data:`~aiworker.schemas.spec.FEEDBACK_SCHEMA`) and the next attempt shows
them to the model.
"""

from __future__ import annotations

import json
from typing import Any

from aiworker.activities.errors import InvalidInputError, PayloadTooLargeError
from aiworker.activities.llm_call import LlmCall
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker

# The one reference syntax of aiworker (pipelines and templates), so that the
# load-time check (find_refs) and rendering agree on what is a reference.
from aiworker.schemas.caps import DEFAULT_MAX_RESOLVED_BYTES
from aiworker.schemas.refs import TEMPLATE_ROOTS, parse_template
from aiworker.schemas.spec import FEEDBACK_FIELD, PromptImplementation, WorkerSpec

# llm-call shows at most this many reasons (and 4000 characters of them).
_FEEDBACK_ITEMS = 50
_ABSENT = object()


def _lookup(worker_input: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    """The value at ``path`` in ``worker_input``, or ``_ABSENT``."""
    if not path:
        # The whole input (defaults filled in), without feedback: that has a turn of its own.
        return {k: v for k, v in worker_input.items() if k != FEEDBACK_FIELD}
    cur: Any = worker_input
    for seg in path:
        if isinstance(cur, dict) and str(seg) in cur:
            cur = cur[str(seg)]
        elif isinstance(cur, list) and isinstance(seg, int) and -len(cur) <= seg < len(cur):
            cur = cur[seg]
        else:
            return _ABSENT
    return cur


def _text(value: Any) -> str:
    if value is _ABSENT:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def render(
    template: str, worker_input: dict[str, Any], max_chars: int = DEFAULT_MAX_RESOLVED_BYTES
) -> str:
    """``template`` with every ``${{ input.<path> }}`` replaced from ``worker_input``.

    A string value goes in as it is, any other value as compact JSON, a value
    ``worker_input`` does not have as empty text; ``${{ input }}`` is the whole input
    (without ``feedback``). ``$${{`` is a literal ``${{``. Only the template
    is scanned: a ``${{`` inside the input's text stays text. A malformed
    reference raises ``ReferenceError_`` (specs are checked at load, so a
    prompt worker never meets one). A text longer than ``max_chars`` (the cap
    on a resolved value) is ``payload_too_large``, refused before it is
    joined: a template may repeat a large input many times.
    """
    parts = parse_template(template, TEMPLATE_ROOTS)
    if not parts:
        return template
    pieces: list[str] = []
    size = 0
    for p in parts:
        piece = p if isinstance(p, str) else _text(_lookup(worker_input, p.path))
        size += len(piece)
        if size > max_chars:
            raise PayloadTooLargeError(
                f"the rendered prompt passes {max_chars} characters; the cap is {max_chars} "
                "(AIWORKER_MAX_RESOLVED_BYTES)",
                field="input",
                limit_bytes=max_chars,
            )
        pieces.append(piece)
    return "".join(pieces)


class PromptWorker(Worker):
    """The worker a prompt spec describes; one instance per spec file.

    Args:
        spec: a checked spec whose ``implementation.kind`` is ``prompt``.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        if not isinstance(spec.implementation, PromptImplementation):
            raise TypeError(f"worker {spec.worker_id!r} is not a prompt worker")
        self.spec = spec  # type: ignore[misc]  # per instance: one class, many specs
        self.prompt: PromptImplementation = spec.implementation
        # JSON Schema does not fill in defaults; a template should see them.
        props = spec.input_schema.get("properties") or {}
        self.defaults: dict[str, Any] = {
            k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v
        }
        self._llm = LlmCall()

    def llm_input(
        self, worker_input: dict[str, Any], max_chars: int = DEFAULT_MAX_RESOLVED_BYTES
    ) -> dict[str, Any]:
        """The llm-call input for one call: system, few-shot turns, this input's prompt,
        the model alias, the output schema as ``response_schema``, and any feedback.

        Templates see the input with the ``default`` of each top-level property
        the input leaves out; each rendered text is at most ``max_chars``.
        """
        p = self.prompt
        messages: list[dict[str, str]] = []
        for shot in p.few_shot:
            messages.append(
                {"role": "user", "content": render(p.prompt, {**self.defaults, **shot.input})}
            )
            messages.append(
                {"role": "assistant", "content": json.dumps(shot.output, ensure_ascii=False)}
            )
        filled = {**self.defaults, **worker_input}
        messages.append({"role": "user", "content": render(p.prompt, filled, max_chars)})
        out: dict[str, Any] = {
            "messages": messages,
            "model": p.model,
            "response_schema": self.spec.output_schema,
        }
        if p.system:
            out["system"] = render(p.system, filled, max_chars)
        if p.temperature is not None:
            out["temperature"] = p.temperature
        feedback = worker_input.get(FEEDBACK_FIELD)
        if feedback:
            out["feedback"] = list(feedback)[:_FEEDBACK_ITEMS]
        return out

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        """Render the prompt, call the model once, return the reply's JSON as the outputs.

        The output tokens are capped by the spec's ``constraints.max_tokens``
        (tightened by the request, which is how a pipeline's budget applies).
        """
        try:
            cap = ctx.settings.caps.max_resolved_bytes
            result = await self._llm.execute(ctx, self.llm_input(input, cap))
        except InvalidInputError as e:
            if e.field != "input.model":
                raise
            # The caller sent no model: the spec names it. Say which file to fix.
            raise InvalidInputError(
                f"prompt worker {self.worker_id!r} names model alias {self.prompt.model!r} "
                f"(implementation.model), which this process's model registry does not have: "
                f"{e.message}; define it in AIWORKER_MODELS_FILE or change the spec",
                field="implementation.model",
                model=self.prompt.model,
            ) from None
        return WorkerResult(
            outputs=result.outputs["json"],
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            log_fields=result.log_fields,
        )
