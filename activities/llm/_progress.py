"""What a model call has received so far: one object for progress and usage.

Progress and usage share one object, :class:`StreamProgress`: the call
feeds it (a stream's text deltas, the usage the provider reported so far:
:mod:`._stream`), the ``llm-call`` worker reads it twice. While the stream
runs, its throttled ``on_update`` becomes the attempt's heartbeat, whose details are ONE object::

    {"step": "summarize", "partial_text": "…the last 2,000 characters",
     "chars": 5123, "tokens": 84,
     "usage": {"input_tokens": 312, "output_tokens": 84, "external_calls": 1}}

``partial_text``, ``chars`` and ``tokens`` are this attempt's stream (what
``aiworker run`` shows); ``usage`` is the usage book's: what the call has
consumed so far, earlier attempts included, because the next attempt reads
it back as its starting point (``UsageBook.of``). So a retry starts clean
(nothing reads ``partial_text`` back: the new attempt asks the model afresh)
while the tokens already streamed stay counted. When an attempt fails, the
worker books :meth:`StreamProgress.billed` once, and the runtime's failure
carries it on in ``ErrorInfo.usage`` and the last heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiworker.activities.llm._providers import _int
from aiworker.activities.llm._types import ReplyUsage
from aiworker.schemas.protocol import Usage

# The heartbeat's partial text: the tail a person reads, not the whole reply.
TAIL_CHARS = 2000
# At most one progress update (heartbeat) per this many seconds.
UPDATE_SECONDS = 0.5


def reported_usage(doc: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """``(input, output, cached input, cache write)`` tokens a reply or chunk reports,
    in either provider's words, counted as the non-streamed reply counts them
    (``_providers``): OpenAI's ``prompt_tokens`` already holds its
    ``prompt_tokens_details.cached_tokens``; Anthropic's ``input_tokens`` leaves
    out the tokens read from and written to its cache, so they are added."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None, None, None, None
    out = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    if "prompt_tokens" in usage:
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        return _int(usage["prompt_tokens"]), out, cached, None
    inp = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    written = _int(usage.get("cache_creation_input_tokens"))
    if inp is not None:
        inp += (read or 0) + (written or 0)
    return inp, out, read, written


class StreamProgress:
    """What a call has received so far, shared by the stream and the worker.

    Args:
        on_update: called with this object at most every ``every`` seconds
            while text streams in (the worker heartbeats from it).
        every: the throttle, in seconds.
    """

    def __init__(
        self,
        on_update: Callable[[StreamProgress], None] | None = None,
        *,
        every: float = UPDATE_SECONDS,
    ) -> None:
        self.on_update = on_update
        self.every = every
        self.input_estimate = 0
        self.started = False
        self.parts: list[str] = []
        self.chars = 0
        self.deltas = 0
        self.tail = ""
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cached_input_tokens = 0
        self.cache_write_tokens = 0
        self._last = 0.0

    def add(self, text: str) -> None:
        """A content delta (about one token)."""
        if not text:
            return
        self.parts.append(text)
        self.chars += len(text)
        self.deltas += 1
        self.tail = (self.tail + text)[-TAIL_CHARS:]
        now = time.monotonic()
        if self.on_update is not None and now - self._last >= self.every:
            self._last = now
            self.on_update(self)

    def report(
        self,
        input_tokens: int | None,
        output_tokens: int | None,
        cached_input_tokens: int | None = None,
        cache_write_tokens: int | None = None,
    ) -> None:
        """Usage the provider reported (each count replaces the last one it reported)."""
        if input_tokens is not None:
            self.input_tokens = input_tokens
        if output_tokens is not None:
            self.output_tokens = output_tokens
        if cached_input_tokens is not None:
            self.cached_input_tokens = cached_input_tokens
        if cache_write_tokens is not None:
            self.cache_write_tokens = cache_write_tokens

    @property
    def tokens(self) -> int:
        """Output tokens so far: the provider's count, or one per content delta."""
        return max(self.output_tokens or 0, self.deltas)

    def billed(self) -> ReplyUsage | None:
        """What the provider billed so far, or None when it billed nothing known
        (no stream started, no usage reported): the input is the estimate until
        reported, the output one token per delta until reported."""
        if not self.started and self.input_tokens is None and self.output_tokens is None:
            return None
        inp = self.input_tokens if self.input_tokens is not None else self.input_estimate
        return ReplyUsage(
            input_tokens=inp,
            output_tokens=self.tokens,
            cached_input_tokens=min(self.cached_input_tokens, inp),
            cache_write_tokens=min(self.cache_write_tokens, inp),
            estimated=self.input_tokens is None or self.output_tokens is None,
        )

    def details(self, step: str | None, usage: Usage) -> dict[str, Any]:
        """The heartbeat details object (see the module docstring); ``usage`` is the
        call's so far, earlier attempts included."""
        tail = self.tail if self.chars <= len(self.tail) else "…" + self.tail[1:]
        return {
            "step": step,
            "partial_text": tail,
            "chars": self.chars,
            "tokens": self.tokens,
            "usage": usage.model_dump(mode="json"),
        }
