"""Tool use on the wire (``activities/llm/_tools.py``) for both providers."""

from __future__ import annotations

from typing import Literal

import pytest

from aiworker.activities.llm import (
    AnthropicProvider,
    ChatRequest,
    Message,
    OpenAIProvider,
    ToolCall,
    ToolDef,
)
from aiworker.activities.llm._registry import ModelConfig
from aiworker.activities.llm._tools import openai_tool_calls

TOOL = ToolDef("validator", "check data", {"$schema": "x", "type": "object"})
CALL = ToolCall("c1", "validator", {"data": 1})
TALK = (
    Message("system", "be brief"),
    Message("user", "go"),
    Message("assistant", "checking", tool_calls=(CALL,)),
    Message("tool", '{"valid": true}', tool_call_id="c1", name="validator"),
    Message("tool", '{"error": {}}', tool_call_id="c2", name="x", is_error=True),
    Message("user", "and now?"),
)


def cfg(provider: Literal["openai", "anthropic"]) -> ModelConfig:
    return ModelConfig(alias="a", provider=provider, base_url="http://127.0.0.1:9", model="m")


def test_openai_sends_functions_tool_calls_and_tool_messages() -> None:
    _, _, body = OpenAIProvider().build(cfg("openai"), ChatRequest(TALK, tools=(TOOL,)), 50)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "validator",
                "description": "check data",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert body["messages"][2]["tool_calls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "validator", "arguments": '{"data": 1}'},
        }
    ]
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": '{"valid": true}',
    }


def test_anthropic_joins_tool_results_and_the_next_user_text_in_one_turn() -> None:
    _, _, body = AnthropicProvider().build(cfg("anthropic"), ChatRequest(TALK, tools=(TOOL,)), 50)
    assert body["system"] == "be brief"
    assert body["tools"] == [
        {"name": "validator", "description": "check data", "input_schema": {"type": "object"}}
    ]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"][1] == {
        "type": "tool_use",
        "id": "c1",
        "name": "validator",
        "input": {"data": 1},
    }
    results = body["messages"][2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[1]["is_error"] is True and "is_error" not in results[0]


def test_a_plain_request_sends_the_same_body_as_before_tools() -> None:
    req = ChatRequest((Message("user", "hi"),))
    _, _, body = OpenAIProvider().build(cfg("openai"), req, 5)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and "tools" not in body


def test_openai_arguments_that_are_not_json_stay_text_and_a_nameless_call_is_refused() -> None:
    calls = openai_tool_calls(
        {"tool_calls": [{"id": "x", "function": {"name": "v", "arguments": '{"a": '}}]}
    )
    assert calls == (ToolCall("x", "v", '{"a": '),)
    with pytest.raises(ValueError, match=r"tool_calls\[0\] has no function name"):
        openai_tool_calls({"tool_calls": [{"function": {}}]})
