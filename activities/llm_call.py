"""The ``llm-call`` worker: one model call, a token budget, structured output.

Input: ``messages`` (or ``prompt`` + ``system``), ``model`` (an alias of the
model registry), ``max_tokens``, ``temperature``, ``stop``, ``seed``,
``response_schema``, ``feedback``, ``tools`` and ``stream`` (read the reply
as the provider streams it, heartbeating the partial text:
``activities.llm._stream``). Output: ``text``, ``json`` (with a schema),
``finish_reason``, ``model``, ``alias``, ``usage`` and ``tool_calls`` (when
the model asked for some).

Tool use (what ``llm-agent`` drives, one turn per call): ``tools`` are
``{name, description, parameters}``; a reply that calls tools returns them
in ``tool_calls`` (``{id, name, arguments}``) and is not checked against
``response_schema`` (it is no answer yet); the conversation goes on with an
``assistant`` message carrying those ``tool_calls`` and one ``tool`` message
per call (``tool_call_id``, ``content``, ``is_error``). The wire formats of
both providers are in :mod:`activities.llm._tools`.

``max_tokens`` sent is the smallest of the spec's, the request constraint's
(what the pipeline budget has left), the input's and the model's own limit;
a prompt that cannot fit the model's context is ``budget_exceeded`` before
the call. With ``response_schema`` the reply is always validated here (a
```json fence is tolerated); a reply that fails, or that stopped at
``length``, is ``invalid_output`` whose reasons are the validator's, so the
pipeline's validation loop can pass them back as ``feedback`` on the next
attempt. Without a schema a reply cut at ``length`` is a ``partial`` result
with a ``truncated`` warning.

Provider calls, limits, breaker and error mapping live in
:mod:`activities.llm` (the ``language_model`` tool).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from jsonschema.exceptions import SchemaError

from aiworker.activities.errors import InvalidInputError, InvalidOutputError
from aiworker.activities.llm import (
    ChatRequest,
    LanguageModel,
    Message,
    StreamProgress,
    call_to_json,
    message_from_json,
    tool_def_from_json,
)
from aiworker.activities.llm._pricing import priced
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.sdk import Worker
from aiworker.config.catalog import builtin_spec
from aiworker.schemas import messages, safe_schema
from aiworker.schemas.protocol import Usage, WarningInfo

TOOL = "language_model"
# Leaves the runtime's own deadline to fire only for a call that ignores ours.
_DEADLINE_MARGIN_SECONDS = 0.25
_FEEDBACK_LIMIT_CHARS = 4000
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n(.*?)\r?\n?[ \t]*```", re.S)


def build_messages(worker_input: dict[str, Any]) -> tuple[Message, ...]:
    """The conversation: ``system``, then ``messages`` or ``prompt``, then ``feedback``."""
    out: list[Message] = []
    if worker_input.get("system"):
        out.append(Message("system", worker_input["system"]))
    if "messages" in worker_input:
        out.extend(message_from_json(m) for m in worker_input["messages"])
    else:
        out.append(Message("user", worker_input["prompt"]))
    feedback = worker_input.get("feedback") or []
    if feedback:
        out.append(Message("user", feedback_message(feedback)))
    return tuple(out)


def feedback_message(reasons: list[Any]) -> str:
    """Validator reasons as a request to fix the previous reply."""
    lines = []
    for r in reasons:
        if isinstance(r, dict):
            path, msg = r.get("path", "$"), r.get("message", json.dumps(r, sort_keys=True))
            lines.append(f"- {path}: {msg}")
        else:
            lines.append(f"- {r}")
    text = "\n".join(lines)[:_FEEDBACK_LIMIT_CHARS]
    return (
        "Your previous answer was rejected for these reasons. "
        "Answer again and fix every one of them:\n" + text
    )


def parse_reply_json(text: str) -> Any:
    """The JSON in a reply: the whole text, or the first fenced block; ``ValueError``."""
    try:
        return json.loads(text)
    except ValueError as first:
        m = _FENCE.search(text)
        if m is None:
            raise first from None
        return json.loads(m.group(1))


def _heartbeat(ctx: WorkerContext) -> Callable[[StreamProgress], None]:
    """What a streaming call heartbeats: its partial text beside the call's usage so
    far, earlier attempts included (the details object of ``activities.llm._stream``)."""

    def beat(progress: StreamProgress) -> None:
        streamed = progress.billed() or Usage()
        so_far = (
            ctx.usage.prior
            + ctx.usage.this_attempt()
            + Usage(input_tokens=streamed.input_tokens, output_tokens=streamed.output_tokens)
        )
        details = progress.details(ctx.step_id, so_far)
        # which attempt is running and what was settled before it (activities/usage.py)
        for marks in ctx.usage.running_details(so_far):
            details.update(marks)
        ctx.heartbeat(details)

    return beat


def _reason(message: str, validator: str) -> dict[str, str]:
    return {"path": "$", "message": message, "validator": validator, "schema_path": ""}


def _chat_request(ctx: WorkerContext, input: dict[str, Any]) -> ChatRequest:  # noqa: A002 (as execute)
    caps = [c for c in (ctx.max_tokens, input.get("max_tokens")) if c is not None]
    stop = input.get("stop")
    return ChatRequest(
        messages=build_messages(input),
        alias=input.get("model", "default"),
        max_tokens=min(caps) if caps else None,
        temperature=input.get("temperature"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        seed=input.get("seed"),
        response_schema=input.get("response_schema"),
        tools=tuple(tool_def_from_json(t) for t in input.get("tools") or ()),
        stream=bool(input.get("stream")),
    )


class LlmCall(Worker):
    """Calls a language model once; validates structured output when asked."""

    spec = builtin_spec("llm-call")

    def usage_if_lost(self, ctx: WorkerContext, input: dict[str, Any]) -> Usage:  # noqa: A002 (as execute)
        """The prompt estimate plus ``max_tokens`` as this call sends them, priced at
        the alias's prices, and its one external call (the caps when the call
        cannot be planned: its alias unknown, its prompt too large)."""
        lm: LanguageModel | None = ctx.tools.peek(TOOL)
        if lm is None:
            return super().usage_if_lost(ctx, input)
        try:
            request = _chat_request(ctx, input)
            cfg = lm.resolve(request.alias)
            max_tokens, est = lm.plan(cfg, request)
        except Exception:  # the attempt itself reports what is wrong; book the caps
            return super().usage_if_lost(ctx, input)
        return priced(
            Usage(input_tokens=est, output_tokens=max_tokens, external_calls=1), cfg.prices
        )

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        schema = input.get("response_schema")
        if schema is not None:
            try:
                safe_schema.cached_validator(schema)
            except SchemaError as e:
                raise InvalidInputError(
                    f"input.response_schema: {safe_schema.described(schema, e)}",
                    field="input.response_schema",
                ) from None
        if input.get("stream") and input.get("tools"):
            # a streamed reply is read as text; tool calls arrive whole (llm-agent's turns)
            raise InvalidInputError(
                "input.stream: a call with tools is not streamed; remove stream or tools",
                field="input.stream",
            )
        request = _chat_request(ctx, input)
        lm: LanguageModel = ctx.tools.use(TOOL)
        progress = StreamProgress(_heartbeat(ctx) if request.stream else None)
        try:
            reply = await lm.complete(
                request,
                deadline_seconds=ctx.remaining() - _DEADLINE_MARGIN_SECONDS,
                progress=progress,
            )
        except BaseException:
            # What the provider billed before the failure (a stream cut mid-way, a reply
            # it could not finish): booked once, here, at the alias's prices; the
            # failure carries it on.
            if (billed := progress.billed()) is not None:
                cfg = lm.resolve(request.alias)
                ctx.spend_usage(priced(billed, cfg.prices), model=cfg.model)
            raise
        cfg = lm.resolve(request.alias)
        ctx.spend_usage(reply.usage, model=cfg.model)
        usage = {
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": reply.usage.output_tokens,
        }
        outputs: dict[str, Any] = {
            "text": reply.text,
            "finish_reason": reply.finish_reason,
            "model": reply.model,
            "alias": cfg.alias,
            "usage": usage,
        }
        log_fields = {
            "model": cfg.model,
            "alias": cfg.alias,
            "finish_reason": reply.finish_reason,
            "max_tokens": reply.max_tokens,
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": reply.usage.output_tokens,
        }
        status = "succeeded"
        warnings: list[WarningInfo] = []
        if reply.tool_calls:
            outputs["tool_calls"] = [call_to_json(c) for c in reply.tool_calls]
            log_fields["tool_calls"] = len(reply.tool_calls)
        elif schema is not None:
            outputs["json"] = self._structured(schema, reply, usage, cfg.alias)
        elif reply.finish_reason == "length":
            status = "partial"
            warnings.append(
                WarningInfo(
                    code="truncated",
                    message=f"the reply stopped at max_tokens={reply.max_tokens}",
                    field="text",
                )
            )
        return WorkerResult(
            outputs=outputs,
            status=status,
            warnings=warnings,
            input_tokens=reply.usage.input_tokens,
            output_tokens=reply.usage.output_tokens,
            log_fields=log_fields,
        )

    @staticmethod
    def _structured(schema: dict[str, Any], reply: Any, usage: dict[str, int], alias: str) -> Any:
        # Tokens were spent even when the reply is rejected: the error carries them.
        context = {**usage, "model": alias, "finish_reason": reply.finish_reason}
        if reply.finish_reason == "length":
            raise InvalidOutputError(
                f"the reply was cut off at max_tokens={reply.max_tokens} before the JSON was "
                "complete",
                field="outputs.json",
                reasons=[
                    _reason(
                        f"the reply was cut off at max_tokens={reply.max_tokens} "
                        "(finish_reason length); give a shorter answer",
                        "finish_reason",
                    )
                ],
                **context,
            )
        if reply.has_structured:
            value = reply.structured
        else:
            try:
                value = parse_reply_json(reply.text)
            except ValueError as e:
                raise InvalidOutputError(
                    f"the reply is not JSON: {e}",
                    field="outputs.json",
                    reasons=[_reason(f"the reply is not valid JSON ({e})", "json")],
                    **context,
                ) from None
        try:
            errors = safe_schema.errors(safe_schema.cached_validator(schema), value)
        except SchemaError as e:
            raise InvalidOutputError(
                f"the reply cannot be checked against response_schema: {e.message}",
                field="outputs.json",
                reasons=[_reason(e.message, "schema")],
                **context,
            ) from None
        if errors:
            reasons = messages.reasons(errors)
            raise InvalidOutputError(
                f"the reply does not match response_schema: {len(errors)} error(s); first: "
                f"{reasons[0]['path']}: {reasons[0]['message']}",
                field="outputs.json",
                reasons=reasons,
                **context,
            )
        return value
