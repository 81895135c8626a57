"""The provider-neutral shape of one model call and its reply."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aiworker.schemas.protocol import Usage

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    """One chat message (text content only)."""

    role: Role
    content: str


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
