"""Tool use on the wire: OpenAI tool calling and Anthropic tool use.

The provider-neutral shape (:class:`~aiworker.activities.llm._types.ToolDef`,
:class:`ToolCall`, a :class:`Message` with ``tool_calls`` or role ``tool``)
is what ``llm-call``'s input and output carry (and ``llm-agent``'s
transcript); this module maps it both ways:

- OpenAI: ``tools: [{"type": "function", "function": {name, description,
  parameters}}]``; an assistant message carries ``tool_calls`` whose
  ``function.arguments`` is a JSON *string*; each result is a
  ``{"role": "tool", "tool_call_id", "content"}`` message.
- Anthropic: ``tools: [{name, description, input_schema}]``; an assistant
  message's content holds ``tool_use`` blocks (``id``, ``name``, ``input``);
  results go back as ``tool_result`` blocks (``tool_use_id``, ``content``,
  ``is_error``) in one user message, which a following user text joins.

A message without tool use maps to ``{"role", "content"}`` exactly as before
tools existed, so plain calls send the same bytes. A reply whose tool calls
are malformed (no name, not objects) raises ``ValueError``: the client maps it
to ``upstream_error``. Arguments that are not JSON are kept as text, so the
caller can tell the model (a tool error), not fail the turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from aiworker.activities.llm._types import ChatRequest, Message, ToolCall, ToolDef

# Schema keywords no provider wants in a function's parameters.
_DROP = ("$schema", "$id")


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in _DROP}


def tool_chars(req: ChatRequest) -> int:
    """Characters the tool definitions and calls add to a request (token estimates)."""
    n = sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in req.tools)
    for m in req.messages:
        n += sum(len(c.name) + len(json.dumps(c.arguments)) for c in m.tool_calls)
    return n


def message_from_json(doc: Mapping[str, Any]) -> Message:
    """A message of ``llm-call``'s input (``role``, ``content`` and the tool fields)."""
    calls = tuple(
        ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=c.get("arguments"))
        for c in doc.get("tool_calls") or ()
    )
    return Message(
        doc["role"],
        doc["content"],
        tool_calls=calls,
        tool_call_id=doc.get("tool_call_id"),
        name=doc.get("name"),
        is_error=bool(doc.get("is_error", False)),
    )


def call_to_json(call: ToolCall) -> dict[str, Any]:
    """A tool call as ``llm-call``'s output (and the transcript) carries it."""
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def tool_def_from_json(doc: Mapping[str, Any]) -> ToolDef:
    """A tool of ``llm-call``'s ``tools`` input."""
    return ToolDef(
        name=str(doc["name"]),
        description=str(doc.get("description") or ""),
        parameters=dict(doc.get("parameters") or {"type": "object"}),
    )


# --- OpenAI -------------------------------------------------------------------------


def openai_tools(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": _parameters(t.parameters),
            },
        }
        for t in tools
    ]


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def openai_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": _arguments_text(c.arguments)},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _decoded(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw if raw is not None else {}
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # the model's broken JSON, for the caller to report back


def openai_tool_calls(message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    """The tool calls of an OpenAI reply's ``choices[0].message``."""
    raw = message.get("tool_calls")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("choices[0].message.tool_calls is not a list")
    calls = []
    for i, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"choices[0].message.tool_calls[{i}] has no function name")
        call_id = c.get("id")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{i}",
                name=fn["name"],
                arguments=_decoded(fn.get("arguments")),
            )
        )
    return tuple(calls)


# --- Anthropic ----------------------------------------------------------------------


def anthropic_tools(tools: Iterable[ToolDef]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": _parameters(t.parameters)}
        for t in tools
    ]


def anthropic_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Non-system messages as Anthropic turns; tool results (and a user text right
    after them) share one user turn, as the API wants."""
    out: list[dict[str, Any]] = []
    for m in messages:
        last = out[-1] if out else None
        joins = last is not None and last["role"] == "user" and isinstance(last["content"], list)
        if m.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": m.content,
                **({"is_error": True} if m.is_error else {}),
            }
            if joins and last is not None:
                last["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.role == "user" and joins and last is not None:
            last["content"].append({"type": "text", "text": m.content})
        elif m.tool_calls:
            content: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content else []
            )
            content += [
                {
                    "type": "tool_use",
                    "id": c.id,
                    "name": c.name,
                    "input": c.arguments if isinstance(c.arguments, dict) else {},
                }
                for c in m.tool_calls
            ]
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def anthropic_tool_call(block: Mapping[str, Any], index: int) -> ToolCall:
    """One ``tool_use`` content block of an Anthropic reply."""
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"content[{index}] (tool_use) has no name")
    call_id = block.get("id")
    return ToolCall(
        id=call_id if isinstance(call_id, str) and call_id else f"toolu_{index}",
        name=name,
        arguments=_decoded(block.get("input")),
    )
