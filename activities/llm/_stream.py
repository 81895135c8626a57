"""Streaming model calls: server-sent events read under bounds, folded per provider.

A call whose :class:`~aiworker.activities.llm.ChatRequest` says ``stream``
asks the provider for an event stream (OpenAI chat completions with
``stream: true`` and ``stream_options.include_usage``, chunks ``data: {...}``
ending with ``data: [DONE]``; Anthropic Messages with ``stream: true``,
events ``message_start`` (input usage), ``content_block_delta``,
``message_delta`` (output usage), ``message_stop``), and folds the events
into the same :class:`~aiworker.activities.llm.ChatReply` a plain call
returns. Non-streaming stays the default and never comes here.

Bounds, each ending in a stable code (the client maps the rest: a stalled or
endless stream passes the call's deadline, ``timeout``; a dropped connection
is ``upstream_error``):

- total bytes, decoded: the client's ``max_reply_bytes`` through
  :func:`aiworker.activities.bodies.iter_body` (a gzip or brotli stream is
  decoded with an output limit too) -> ``upstream_error``;
- one line or one event: :data:`~aiworker.activities.llm._sse.MAX_EVENT_BYTES`
  -> ``upstream_error``;
- output: a stream that goes on past ``max_tokens`` (by the provider's own
  count or one token per content delta) -> ``upstream_error``;
- an event that is not JSON, a stream that ends before ``[DONE]`` /
  ``message_stop``, one without any choice, an ``error`` event ->
  ``upstream_error`` (``rate_limited`` for a rate-limit error event).

What has arrived goes into a :class:`~aiworker.activities.llm._progress.StreamProgress`
(the partial text and the usage so far, shared with the worker's heartbeat:
see :mod:`._progress`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx

from aiworker.activities import bodies
from aiworker.activities.errors import RateLimitedError, UpstreamError, WorkerError
from aiworker.activities.llm._progress import StreamProgress, reported_usage
from aiworker.activities.llm._providers import _ANTHROPIC_FINISH, _TOOL_NAME, Provider
from aiworker.activities.llm._registry import ModelConfig
from aiworker.activities.llm._sse import Event, events
from aiworker.activities.llm._types import ChatReply, ReplyUsage


def _obj(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _json(ev: Event) -> Any:
    try:
        return json.loads(ev.data)
    except ValueError as e:
        raise UpstreamError(f"a stream event is not JSON ({e}): {ev.data[:80]!r}") from None


class _Fold:
    """Events in, a reply out; ``done`` once the provider said the stream ended."""

    done = False
    finish: str | None = None
    model: str | None = None

    def __init__(self, progress: StreamProgress) -> None:
        self.progress = progress

    def feed(self, ev: Event) -> None:
        raise NotImplementedError

    def reply(self, cfg: ModelConfig, max_tokens: int) -> ChatReply:
        raise NotImplementedError

    def _usage(self) -> ReplyUsage:
        p = self.progress
        inp = p.input_tokens if p.input_tokens is not None else 0
        return ReplyUsage(
            input_tokens=inp,
            output_tokens=p.output_tokens if p.output_tokens is not None else p.deltas,
            cached_input_tokens=min(p.cached_input_tokens, inp),
            cache_write_tokens=min(p.cache_write_tokens, inp),
            estimated=p.input_tokens is None or p.output_tokens is None,
        )


class _OpenAIFold(_Fold):
    def __init__(self, progress: StreamProgress) -> None:
        super().__init__(progress)
        self.choices = 0

    def feed(self, ev: Event) -> None:
        if ev.data.strip() == "[DONE]":
            self.done = True
            return
        doc = _json(ev)
        if not isinstance(doc, dict):
            raise UpstreamError("a stream chunk is not a JSON object")
        if doc.get("error"):
            err = doc["error"]
            message = err.get("message") if isinstance(err, dict) else err
            raise UpstreamError(f"the stream reported an error: {str(message)[:300]}")
        self.progress.report(*reported_usage(doc))
        if isinstance(doc.get("model"), str) and doc["model"]:
            self.model = doc["model"]
        choices = doc.get("choices")
        if not isinstance(choices, list):
            raise UpstreamError("a stream chunk has no 'choices' list")
        for choice in choices[:1]:
            if not isinstance(choice, dict):
                raise UpstreamError("a stream chunk's choice is not an object")
            self.choices += 1
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str):
                self.progress.add(content)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def reply(self, cfg: ModelConfig, max_tokens: int) -> ChatReply:
        if not self.done:
            raise UpstreamError("the stream ended before data: [DONE]")
        if not self.choices:
            raise UpstreamError("the stream had no choices")
        return ChatReply(
            text="".join(self.progress.parts),
            finish_reason=self.finish or "stop",
            model=self.model or cfg.model,
            usage=self._usage(),
            max_tokens=max_tokens,
        )


class _AnthropicFold(_Fold):
    def __init__(self, progress: StreamProgress) -> None:
        super().__init__(progress)
        self.started = False
        self.tool_json: list[str] = []
        self.tool_block: int | None = None

    def feed(self, ev: Event) -> None:
        doc = _json(ev)
        if not isinstance(doc, dict):
            raise UpstreamError("a stream event is not a JSON object")
        kind = doc.get("type")
        if kind == "error" or ev.name == "error":
            err = _obj(doc.get("error"))
            etype, message = str(err.get("type") or "error"), str(err.get("message") or "")
            cls: type[WorkerError] = (
                RateLimitedError if etype == "rate_limit_error" else UpstreamError
            )
            raise cls(f"the stream reported {etype}: {message[:300]}", provider_code=etype[:100])
        if kind == "message_start":
            self.started = True
            start = _obj(doc.get("message"))
            self.progress.report(*reported_usage(start))
            if isinstance(start.get("model"), str) and start["model"]:
                self.model = start["model"]
        elif kind == "content_block_start":
            block = doc.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                if block.get("name") == _TOOL_NAME:
                    self.tool_block = doc.get("index")
        elif kind == "content_block_delta":
            delta = _obj(doc.get("delta"))
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self.progress.add(delta["text"])
            elif delta.get("type") == "input_json_delta" and doc.get("index") == self.tool_block:
                part = delta.get("partial_json")
                if isinstance(part, str):
                    self.tool_json.append(part)
                    self.progress.add(part)
        elif kind == "message_delta":
            delta = _obj(doc.get("delta"))
            if delta.get("stop_reason"):
                self.finish = str(delta["stop_reason"])
            self.progress.report(*reported_usage(doc))
        elif kind == "message_stop":
            self.done = True

    def reply(self, cfg: ModelConfig, max_tokens: int) -> ChatReply:
        if not self.started:
            raise UpstreamError("the stream had no message_start")
        if not self.done:
            raise UpstreamError("the stream ended before message_stop")
        stop = self.finish
        finish = _ANTHROPIC_FINISH.get(str(stop), str(stop) if stop else "stop")
        structured: Any = None
        has_structured = self.tool_block is not None
        if has_structured:
            try:
                structured = json.loads("".join(self.tool_json) or "{}")
            except ValueError as e:
                raise UpstreamError(f"the streamed tool input is not JSON ({e})") from None
            if finish == "tool_calls":
                finish = "stop"
        text = (
            json.dumps(structured, ensure_ascii=False)
            if has_structured
            else "".join(self.progress.parts)
        )
        return ChatReply(
            text=text,
            finish_reason=finish,
            model=self.model or cfg.model,
            usage=self._usage(),
            structured=structured,
            has_structured=has_structured,
            max_tokens=max_tokens,
        )


def _over(progress: StreamProgress, max_tokens: int) -> bool:
    # Slack for servers that count a little differently from one token per delta.
    return progress.tokens > max_tokens + max(16, max_tokens // 10)


class Client(Protocol):
    """What a streaming call uses of :class:`~aiworker.activities.llm.LanguageModel`."""

    http: httpx.AsyncClient
    max_reply_bytes: int
    meter: bodies.BodyMeter | None


# Reads a reply that is no event stream whole and maps it as a plain call's.
Plain = Callable[[httpx.Response], Awaitable[ChatReply]]


async def read_stream(
    lm: Client,
    cfg: ModelConfig,
    provider: Provider,
    call: tuple[str, dict[str, str], dict[str, Any], httpx.Timeout],
    max_tokens: int,
    progress: StreamProgress,
    plain: Plain,
) -> ChatReply:
    """Send the streaming version of ``call`` (URL, headers, body and timeouts of
    the plain call) and fold its event stream into a reply.

    A reply that is not an event stream (an error status, a JSON reply from a
    server that ignored ``stream``, an HTML page) goes to ``plain``.
    """
    url, headers, body, limits = call
    stream_body = {**body, "stream": True}
    if provider.name == "openai":
        stream_body["stream_options"] = {"include_usage": True}
    request = lm.http.build_request(
        "POST",
        url,
        json=stream_body,
        headers={
            "accept-encoding": bodies.ACCEPT_ENCODING,
            **headers,
            "accept": "text/event-stream",
        },
        params=dict(cfg.query) or None,
        timeout=limits,
    )
    resp = await lm.http.send(request, stream=True)
    try:
        ctype = resp.headers.get("content-type", "").lower()
        if not (200 <= resp.status_code < 300) or "text/event-stream" not in ctype:
            return await plain(resp)
        progress.started = True
        fold: _Fold = (_AnthropicFold if cfg.provider == "anthropic" else _OpenAIFold)(progress)
        try:
            return await _fold(resp, fold, progress, max_tokens, lm.max_reply_bytes, lm.meter, cfg)
        except WorkerError as e:
            # Say which model, and how far the stream got: the reason a person reads.
            after = f" after {progress.tokens} tokens" if progress.tokens else ""
            raise type(e)(
                f"model alias {cfg.alias!r}: {e.message}{after}",
                field=e.field,
                retry_after=e.retry_after,
                model=cfg.alias,
                **e.context,
            ) from None
    finally:
        await resp.aclose()


async def _fold(
    resp: httpx.Response,
    fold: _Fold,
    progress: StreamProgress,
    max_tokens: int,
    max_bytes: int,
    meter: bodies.BodyMeter | None,
    cfg: ModelConfig,
) -> ChatReply:
    """The events of ``resp`` through ``fold``, under the byte and token bounds."""
    try:
        async with (
            contextlib.aclosing(bodies.iter_body(resp, max_bytes, meter=meter)) as pieces,
            contextlib.aclosing(events(pieces)) as stream,
        ):
            async for ev in stream:
                fold.feed(ev)
                if _over(progress, max_tokens):
                    raise UpstreamError(
                        f"the stream went on past max_tokens={max_tokens} "
                        f"({progress.tokens} tokens) without stopping"
                    )
                if fold.done:
                    break
    except bodies.BodyTooLargeError:
        raise UpstreamError(f"the provider's stream passed {max_bytes} bytes") from None
    except bodies.BodyError as e:
        raise UpstreamError(f"the provider's stream cannot be read: {e}") from None
    return fold.reply(cfg, max_tokens)
