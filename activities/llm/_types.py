"""The provider-neutral shape of one model call and its reply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aiworker.schemas.protocol import Usage

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolDef:
    """A tool the model may call: ``parameters`` is a JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for. ``arguments`` is the decoded JSON, or the raw
    text when the model sent something that is not JSON (the caller reports it)."""

    id: str
    name: str
    arguments: Any


@dataclass(frozen=True)
class Message:
    """One chat message: text, and for tool use the assistant's ``tool_calls`` or a
    ``tool`` message answering ``tool_call_id`` (``is_error`` when the call failed).
    Wire formats: :mod:`~aiworker.activities.llm._tools`."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


@dataclass(frozen=True)
class ChatRequest:
    """One call, before the registry resolves the model alias.

    ``max_tokens`` is the caller's cap; the language model lowers it further
    to the model's output limit and what is left of its context window.
    ``stream`` asks the provider for an event stream (``activities.llm._stream``).
    """

    messages: tuple[Message, ...]
    alias: str = "default"
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_schema: dict[str, Any] | None = None
    tools: tuple[ToolDef, ...] = ()
    stream: bool = False


class ReplyUsage(Usage):
    """The protocol's :class:`~aiworker.schemas.protocol.Usage` of one model reply,
    and whether its tokens are ``estimated`` (the provider did not report them).

    ``external_calls`` stays 0: the toolbox counts the call itself.
    """

    estimated: bool = False


@dataclass(frozen=True)
class ChatReply:
    """A provider's reply, normalized.

    ``finish_reason`` is ``stop``, ``length``, ``tool_calls``,
    ``content_filter`` or the provider's own word for anything else.
    ``structured`` holds the object a provider returned through its
    structured-output channel (Anthropic tool use), when it did.
    """

    text: str
    finish_reason: str
    model: str
    usage: ReplyUsage
    structured: Any = None
    has_structured: bool = False
    max_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    tool_calls: tuple[ToolCall, ...] = ()
