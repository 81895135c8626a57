"""Wire formats: OpenAI-compatible chat completions and Anthropic Messages.

Each provider turns a :class:`ChatRequest` into URL, headers and JSON body,
and a reply body into a :class:`ChatReply`; a body that is not the
provider's JSON raises ``ValueError`` (the client maps it to
``upstream_error``). HTTP, errors and limits are the client's business.

Structured output: OpenAI-compatible servers get ``response_format``
``json_schema`` (or ``json_object`` / a prompt instruction, per alias, for
servers without it); Anthropic gets a forced tool whose ``input_schema`` is
the response schema when that schema describes an object, a prompt
instruction otherwise. The reply is validated locally either way.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from aiworker.activities.llm import _tools
from aiworker.activities.llm._registry import ModelConfig
from aiworker.activities.llm._types import ChatReply, ChatRequest, Message, ReplyUsage

_TOOL_NAME = "respond"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def schema_instruction(schema: dict[str, Any]) -> str:
    """The prompt text that asks for JSON where no structured-output option is used."""
    return (
        "Reply with a single JSON value and nothing else (no prose, no code fence). "
        "It must match this JSON Schema:\n" + json.dumps(schema, separators=(",", ":"))
    )


def _schema_name(schema: dict[str, Any]) -> str:
    title = schema.get("title")
    name = _NAME_CHARS.sub("_", title)[:64] if isinstance(title, str) and title else ""
    return name or "response"


def _is_object_schema(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "object" or ("type" not in schema and "properties" in schema)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _usage(
    inp: int | None, out: int | None, cached: int | None = None, written: int | None = None
) -> ReplyUsage:
    """A reply's tokens as the provider reported them (0 and ``estimated`` where it did not).

    ``inp`` counts every prompt token; ``cached`` and ``written`` are the parts of
    it read from and written to the provider's prompt cache.
    """
    return ReplyUsage(
        input_tokens=inp or 0,
        output_tokens=out or 0,
        cached_input_tokens=min(cached or 0, inp or 0),
        cache_write_tokens=min(written or 0, inp or 0),
        estimated=inp is None or out is None,
    )


class Provider(Protocol):
    """One wire format."""

    name: str

    def build(
        self, cfg: ModelConfig, req: ChatRequest, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]: ...

    def parse(self, cfg: ModelConfig, doc: Any, max_tokens: int) -> ChatReply: ...

    def error_text(self, doc: Any) -> tuple[str, str]:
        """``(message, code-or-type)`` from an error body ('' when absent)."""
        ...


def _openai_error(doc: Any) -> tuple[str, str]:
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        code = err.get("code") or err.get("type") or ""
        return str(err.get("message") or ""), str(code)
    if isinstance(err, str):
        return err, ""
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return doc["message"], str(doc.get("type") or "")
    return "", ""


class OpenAIProvider:
    """OpenAI chat completions and the servers that speak it (vLLM, Ollama,
    llama.cpp, LM Studio, Azure OpenAI with ``api_key_header: api-key``)."""

    name = "openai"

    def build(
        self, cfg: ModelConfig, req: ChatRequest, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        messages = list(req.messages)
        body: dict[str, Any] = {"model": cfg.model, cfg.max_tokens_field: max_tokens}
        schema = req.response_schema
        if schema is not None:
            mode = cfg.structured_output
            if mode == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    # strict mode accepts only a subset of JSON Schema; the reply is
                    # validated locally against the full schema anyway.
                    "json_schema": {
                        "name": _schema_name(schema),
                        "schema": schema,
                        "strict": False,
                    },
                }
            else:
                if mode == "json_object":
                    body["response_format"] = {"type": "json_object"}
                messages.insert(0, Message("system", schema_instruction(schema)))
        body["messages"] = _tools.openai_messages(messages)
        if req.tools:
            body["tools"] = _tools.openai_tools(req.tools)
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.stop:
            body["stop"] = list(req.stop)
        if req.seed is not None:
            body["seed"] = req.seed
        headers = {"content-type": "application/json", "accept": "application/json"}
        headers.update(cfg.headers)
        if cfg.api_key is not None:
            key = cfg.api_key.get_secret_value()
            if cfg.api_key_header and cfg.api_key_header.lower() != "authorization":
                headers[cfg.api_key_header] = key
            else:
                headers["authorization"] = f"Bearer {key}"
        return f"{cfg.base_url}/chat/completions", headers, body

    def parse(self, cfg: ModelConfig, doc: Any, max_tokens: int) -> ChatReply:
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
            raise ValueError("no 'choices' list in the reply")
        if not doc["choices"] or not isinstance(doc["choices"][0], dict):
            raise ValueError("empty 'choices' in the reply")
        choice = doc["choices"][0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ValueError("no 'message' in choices[0]")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ValueError("choices[0].message.content is not a string")
        tool_calls = _tools.openai_tool_calls(message)
        finish = choice.get("finish_reason")
        raw_usage = doc.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        inp, out = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        # prompt_tokens includes the cached ones; their count is a breakdown beside it.
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        model = doc.get("model")
        return ChatReply(
            text=content,
            finish_reason=str(finish) if finish else "stop",
            model=model if isinstance(model, str) and model else cfg.model,
            usage=_usage(inp, out, cached),
            max_tokens=max_tokens,
            tool_calls=tool_calls,
        )

    def error_text(self, doc: Any) -> tuple[str, str]:
        return _openai_error(doc)


_ANTHROPIC_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class AnthropicProvider:
    """The Anthropic Messages API (``POST {base_url}/v1/messages``)."""

    name = "anthropic"

    def build(
        self, cfg: ModelConfig, req: ChatRequest, max_tokens: int
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        system = [m.content for m in req.messages if m.role == "system"]
        body: dict[str, Any] = {
            "model": cfg.model,
            "max_tokens": max_tokens,
            "messages": _tools.anthropic_messages(m for m in req.messages if m.role != "system"),
        }
        if req.tools:
            body["tools"] = _tools.anthropic_tools(req.tools)
        schema = req.response_schema
        if schema is not None:
            # With the caller's tools the model must be free to call them: no forced tool.
            if cfg.structured_output == "tool" and _is_object_schema(schema) and not req.tools:
                body["tools"] = [
                    {
                        "name": _TOOL_NAME,
                        "description": "Give the answer as this tool's input.",
                        "input_schema": schema,
                    }
                ]
                body["tool_choice"] = {"type": "tool", "name": _TOOL_NAME}
            else:
                system.append(schema_instruction(schema))
        if system:
            body["system"] = "\n\n".join(system)
        if req.temperature is not None:
            body["temperature"] = min(req.temperature, 1.0)
        if req.stop:
            body["stop_sequences"] = list(req.stop)
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "anthropic-version": cfg.anthropic_version,
        }
        headers.update(cfg.headers)
        if cfg.api_key is not None:
            headers[cfg.api_key_header or "x-api-key"] = cfg.api_key.get_secret_value()
        return f"{cfg.base_url}/v1/messages", headers, body

    def parse(self, cfg: ModelConfig, doc: Any, max_tokens: int) -> ChatReply:
        if not isinstance(doc, dict) or not isinstance(doc.get("content"), list):
            raise ValueError("no 'content' list in the reply")
        texts: list[str] = []
        structured: Any = None
        has_structured = False
        calls = []
        for i, block in enumerate(doc["content"]):
            if not isinstance(block, dict):
                raise ValueError("a content block is not an object")
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "tool_use" and block.get("name") == _TOOL_NAME:
                structured, has_structured = block.get("input"), True
            elif block.get("type") == "tool_use":
                calls.append(_tools.anthropic_tool_call(block, i))
        stop = doc.get("stop_reason")
        finish = _ANTHROPIC_FINISH.get(str(stop), str(stop) if stop else "stop")
        if has_structured and finish == "tool_calls":
            finish = "stop"
        raw_usage = doc.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        inp, out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        # Anthropic's input_tokens leaves out the prompt tokens read from and written to
        # its cache (each billed at its own price); every prompt token counts here.
        read = _int(usage.get("cache_read_input_tokens")) or 0
        written = _int(usage.get("cache_creation_input_tokens")) or 0
        if inp is not None:
            inp += read + written
        model = doc.get("model")
        text = json.dumps(structured, ensure_ascii=False) if has_structured else "".join(texts)
        return ChatReply(
            text=text,
            finish_reason=finish,
            model=model if isinstance(model, str) and model else cfg.model,
            usage=_usage(inp, out, read, written),
            structured=structured,
            has_structured=has_structured,
            max_tokens=max_tokens,
            tool_calls=tuple(calls),
        )

    def error_text(self, doc: Any) -> tuple[str, str]:
        return _openai_error(doc)


PROVIDERS: dict[str, Provider] = {"openai": OpenAIProvider(), "anthropic": AnthropicProvider()}
