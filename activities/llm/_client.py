"""The ``language_model`` tool: one model call under limits, breaker and span.

Long on purpose (about 450 lines): one call's whole path, from the
limits to the error table, reads top to bottom in one place.

Order of one call: resolve the alias -> fit ``max_tokens`` to the model's
output limit and context window (a prompt that cannot fit is
``budget_exceeded`` before anything is sent) -> the client-side
requests/tokens-per-minute limit -> the provider's circuit breaker -> POST
with httpx (transport retries off: Temporal retries) -> map the outcome.

Errors, by what the provider did:

- 429 -> ``rate_limited`` with the wait from ``retry-after-ms``,
  ``Retry-After`` or the reset headers as the retry delay;
- 5xx (529 included), a connection failure, or a body that is not the
  provider's JSON (over ``max_reply_bytes`` decoded, or in an encoding that
  cannot be decoded within that bound: ``activities.bodies``) ->
  ``upstream_error`` (retryable); these count against the provider's breaker;
- no reply within the attempt's deadline -> ``timeout``: the read budget is
  the worker's own deadline, so this is the worker's timeout (retryable,
  and a breaker failure), while failing to connect is ``upstream_error``;
- 400/422 -> ``invalid_input``, except a context-length complaint ->
  ``budget_exceeded``; 401/403 -> ``access_denied``; 404 -> ``invalid_input``
  (no such model or endpoint); 413 -> ``payload_too_large``.

API keys travel only in request headers; provider messages quoted in errors
pass through :meth:`LanguageModel.redact` first. A ``stream`` call branches
into :mod:`._stream` for its body and shares the rest of this path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from aiworker.activities import bodies
from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.errors import (
    AccessDeniedError,
    BudgetExceededError,
    InvalidInputError,
    PayloadTooLargeError,
    RateLimitedError,
    UpstreamError,
    WorkerError,
    WorkerTimeoutError,
)
from aiworker.activities.limits import EndpointRateLimiter
from aiworker.activities.llm._pricing import priced
from aiworker.activities.llm._progress import StreamProgress, reported_usage
from aiworker.activities.llm._providers import PROVIDERS, Provider, schema_instruction
from aiworker.activities.llm._registry import ModelConfig, ModelRegistry
from aiworker.activities.llm._stream import read_stream
from aiworker.activities.llm._tools import tool_chars
from aiworker.activities.llm._types import ChatReply, ChatRequest
from aiworker.activities.metrics import DURATION_BUCKETS
from aiworker.activities.retry_after import retry_after

_tracer = trace.get_tracer("aiworker.llm")

DEFAULT_MAX_TOKENS = 1024
MAX_REPLY_BYTES = 8 * 1024 * 1024
_CONNECT_TIMEOUT = 10.0
_CONTEXT_WORDS = (
    "context_length",
    "context length",
    "context window",
    "context size",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "exceed_context",
)


class LlmMetrics:
    """Per-call metrics of the language model tool (beside the runtime's token counts)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.duration = Histogram(
            "aiworker_llm_call_duration_seconds",
            "Wall time of one model call, by provider, model and outcome (ok or error code).",
            ["provider", "model", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.finish_reasons = Counter(
            "aiworker_llm_finish_reasons",
            "Model replies by finish reason.",
            ["model", "finish_reason"],
            registry=registry,
        )


def estimate_tokens(text_chars: int, chars_per_token: float = 4.0) -> int:
    """Tokens of ``text_chars`` characters by the ~4 characters a token rule."""
    return math.ceil(text_chars / chars_per_token)


def _chars(req: ChatRequest) -> int:
    n = sum(len(m.content) for m in req.messages)
    if req.response_schema is not None:
        n += len(schema_instruction(req.response_schema))
    return n + tool_chars(req)


class LanguageModel:
    """Calls the models of a :class:`ModelRegistry`; one per process, shared.

    Args:
        registry: the model aliases.
        http: the shared client (built with transport retries off if omitted).
        breakers: the ``provider`` circuit breakers.
        limiter: the client-side per-endpoint limits (from the registry if omitted).
        metrics: per-call metrics, or None.
        max_reply_bytes: the most bytes of a reply, decoded (``upstream_error`` past it).
        tracer: where the span of each call goes (the global provider's by default).
        meter: counts the bytes of every reply read.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        http: httpx.AsyncClient | None = None,
        breakers: BreakerRegistry | None = None,
        limiter: EndpointRateLimiter | None = None,
        metrics: LlmMetrics | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        tracer: trace.Tracer | None = None,
        meter: bodies.BodyMeter | None = None,
    ) -> None:
        self.registry = registry
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(retries=0),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        self.breakers = breakers or BreakerRegistry("provider")
        self.limiter = limiter or EndpointRateLimiter(registry.limits)
        self.metrics = metrics
        self.max_reply_bytes = max_reply_bytes
        self.meter = meter
        self.tracer = tracer or _tracer
        self._secrets = sorted(set(registry.secret_values()), key=len, reverse=True)
        # Learned characters per token by alias, from reported usage.
        self._ratio: dict[str, float] = {}

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()

    def secret_values(self) -> list[str]:
        """The keys in use, for log redaction."""
        return list(self._secrets)

    def redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "[REDACTED]")
        return text

    def resolve(self, alias: str) -> ModelConfig:
        """The model behind ``alias``; ``invalid_input`` names the known ones."""
        cfg = self.registry.get(alias)
        if cfg is None:
            known = ", ".join(self.registry.aliases) or "none configured"
            raise InvalidInputError(
                f"unknown model alias {alias!r} (known: {known})", field="input.model"
            )
        return cfg

    def plan(self, cfg: ModelConfig, req: ChatRequest) -> tuple[int, int]:
        """``(max_tokens, estimated input tokens)`` for ``req``, or ``budget_exceeded``."""
        est = estimate_tokens(_chars(req), self._ratio.get(cfg.alias, 4.0)) + 4 * len(req.messages)
        cap = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        if cfg.max_output_tokens is not None:
            cap = min(cap, cfg.max_output_tokens)
        if cap < 1:
            raise BudgetExceededError(
                f"no output tokens left for this call (max_tokens={cap})",
                resource="tokens",
                limit=cap,
            )
        if cfg.context_window is not None:
            room = cfg.context_window - est
            if room < 1:
                raise BudgetExceededError(
                    f"the prompt (about {est} tokens) does not fit the context window of "
                    f"model alias {cfg.alias!r} ({cfg.context_window} tokens)",
                    resource="context_window",
                    limit=cfg.context_window,
                    estimated_input_tokens=est,
                )
            cap = min(cap, room)
        return cap, est

    async def complete(
        self,
        req: ChatRequest,
        *,
        deadline_seconds: float,
        progress: StreamProgress | None = None,
    ) -> ChatReply:
        """Make one call within ``deadline_seconds``; raise a ``WorkerError`` on failure.

        ``progress`` sees what arrives (the text of a ``stream`` call as it
        streams, the usage a provider reported), so that a failed call's
        caller can book what the provider billed before the failure.
        """
        cfg = self.resolve(req.alias)
        max_tokens, est = self.plan(cfg, req)
        progress = progress if progress is not None else StreamProgress()
        progress.input_estimate = est
        provider = PROVIDERS[cfg.provider]
        started = time.monotonic()
        outcome = "internal"
        with self.tracer.start_as_current_span("llm.call", kind=SpanKind.CLIENT) as span:
            span.set_attribute("gen_ai.system", cfg.provider)
            span.set_attribute("gen_ai.request.model", cfg.model)
            span.set_attribute("gen_ai.request.max_tokens", max_tokens)
            span.set_attribute("aiworker.model_alias", cfg.alias)
            span.set_attribute("aiworker.estimated_input_tokens", est)
            try:
                # The limiter goes first: a breaker that lets a half-open probe through
                # must see that probe's outcome, which a refused call would never report.
                reservation = self.limiter.acquire(cfg.target, est + max_tokens)
                try:
                    await self.breakers.acheck(cfg.target)
                except (WorkerError, asyncio.CancelledError):
                    reservation.release()
                    raise
                reply = await self._call(cfg, provider, req, max_tokens, deadline_seconds, progress)
                reply = dataclasses.replace(reply, usage=priced(reply.usage, cfg.prices))
                reservation.settle(reply.usage.input_tokens + reply.usage.output_tokens)
                self._learn(cfg, req, reply)
                outcome = "ok"
                span.set_attribute("gen_ai.response.model", reply.model)
                span.set_attribute("gen_ai.usage.input_tokens", reply.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", reply.usage.output_tokens)
                span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
                if self.metrics is not None:
                    self.metrics.finish_reasons.labels(cfg.model, reply.finish_reason).inc()
                return reply
            except WorkerError as e:
                outcome = e.code.value
                span.set_attribute("aiworker.error_code", outcome)
                span.set_status(Status(StatusCode.ERROR, outcome))
                raise
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.duration.labels(cfg.provider, cfg.model, outcome).observe(
                        time.monotonic() - started
                    )

    def _learn(self, cfg: ModelConfig, req: ChatRequest, reply: ChatReply) -> None:
        chars = _chars(req)
        if reply.usage.estimated or reply.usage.input_tokens < 50 or chars < 400:
            return
        observed = min(8.0, max(1.0, chars / reply.usage.input_tokens))
        self._ratio[cfg.alias] = (self._ratio.get(cfg.alias, 4.0) + observed) / 2

    async def _call(
        self,
        cfg: ModelConfig,
        provider: Provider,
        req: ChatRequest,
        max_tokens: int,
        deadline_seconds: float,
        progress: StreamProgress,
    ) -> ChatReply:
        url, headers, body = provider.build(cfg, req, max_tokens)
        budget = max(0.01, deadline_seconds)
        limits = httpx.Timeout(budget, connect=min(_CONNECT_TIMEOUT, budget))
        failed = True
        try:
            try:
                async with asyncio.timeout(budget):
                    if req.stream:

                        async def plain(resp: httpx.Response) -> ChatReply:
                            raw = await self._read(resp)
                            return self._interpret(
                                cfg,
                                provider,
                                resp.status_code,
                                resp.headers,
                                raw,
                                max_tokens,
                                progress,
                            )

                        call = (url, headers, body, limits)
                        reply = await read_stream(
                            self, cfg, provider, call, max_tokens, progress, plain
                        )
                    else:
                        status, resp_headers, raw = await self._post(
                            url, headers, body, cfg.query, limits
                        )
                        reply = self._interpret(
                            cfg, provider, status, resp_headers, raw, max_tokens, progress
                        )
            except TimeoutError:
                raise WorkerTimeoutError(
                    f"model alias {cfg.alias!r} did not reply within {budget:.1f}s",
                    timeout_seconds=round(budget, 3),
                    model=cfg.alias,
                ) from None
            except httpx.ConnectTimeout:
                raise UpstreamError(
                    f"could not connect to the provider of model alias {cfg.alias!r} "
                    f"within {min(_CONNECT_TIMEOUT, budget):.1f}s",
                    model=cfg.alias,
                ) from None
            except httpx.TimeoutException:
                raise WorkerTimeoutError(
                    f"model alias {cfg.alias!r} did not reply within {budget:.1f}s",
                    timeout_seconds=round(budget, 3),
                    model=cfg.alias,
                ) from None
            except httpx.TransportError as e:
                raise UpstreamError(
                    f"connection to the provider of model alias {cfg.alias!r} failed: "
                    f"{type(e).__name__}: {self.redact(str(e))[:200]}",
                    model=cfg.alias,
                ) from None
            failed = False
            return reply
        except (RateLimitedError, InvalidInputError, AccessDeniedError, BudgetExceededError):
            # The provider answered coherently: it is up, whatever it thought of the call.
            failed = False
            raise
        except PayloadTooLargeError:
            failed = False
            raise
        finally:
            if failed:
                self.breakers.record_failure(cfg.target)
            else:
                self.breakers.record_success(cfg.target)

    async def _post(
        self,
        url: str,
        headers: dict[str, str],
        body: dict[str, Any],
        query: tuple[tuple[str, str], ...],
        limits: httpx.Timeout,
    ) -> tuple[int, httpx.Headers, bytes]:
        # Only what the bounded reader decodes is asked for, whatever httpx could decode.
        headers = {"accept-encoding": bodies.ACCEPT_ENCODING, **headers}
        async with self.http.stream(
            "POST", url, headers=headers, json=body, params=dict(query) or None, timeout=limits
        ) as resp:
            return resp.status_code, resp.headers, await self._read(resp)

    async def _read(self, resp: httpx.Response) -> bytes:
        """A whole reply body under ``max_reply_bytes``; ``upstream_error`` past it."""
        try:
            return await bodies.read_body(resp, self.max_reply_bytes, meter=self.meter)
        except bodies.BodyTooLargeError:
            raise UpstreamError(
                f"the provider's reply is over {self.max_reply_bytes} bytes",
                status_code=resp.status_code,
            ) from None
        except bodies.BodyError as e:
            raise UpstreamError(
                f"the provider's reply cannot be read: {e}", status_code=resp.status_code
            ) from None

    def _interpret(
        self,
        cfg: ModelConfig,
        provider: Provider,
        status: int,
        headers: httpx.Headers,
        raw: bytes,
        max_tokens: int,
        progress: StreamProgress,
    ) -> ChatReply:
        try:
            doc: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if 200 <= status < 300:
            if doc is None:
                ctype = headers.get("content-type", "no content type").split(";")[0]
                snippet = " ".join(raw[:300].decode("utf-8", "replace").split())[:120]
                raise UpstreamError(
                    f"model alias {cfg.alias!r}: the provider's reply is not JSON "
                    f"({ctype}: {self.redact(snippet)!r})",
                    status_code=status,
                    model=cfg.alias,
                )
            # Tokens the provider says it billed count even if the rest is unusable.
            progress.report(*reported_usage(doc))
            try:
                return provider.parse(cfg, doc, max_tokens)
            except ValueError as e:
                raise UpstreamError(
                    f"model alias {cfg.alias!r}: not a {provider.name} reply ({e})",
                    status_code=status,
                    model=cfg.alias,
                ) from None
        message, code = provider.error_text(doc) if doc is not None else ("", "")
        if not message:
            message = raw[:200].decode("utf-8", "replace").strip()
        detail = self.redact(message)[:300] or f"HTTP {status}"
        where = f"model alias {cfg.alias!r} ({cfg.provider}, HTTP {status})"
        ctx: dict[str, Any] = {"status_code": status, "model": cfg.alias}
        if code:
            ctx["provider_code"] = self.redact(code)[:100]
        if status == 429:
            wait = retry_after(headers)
            raise RateLimitedError(f"{where} rate limited: {detail}", retry_after=wait, **ctx)
        if status in (400, 422):
            lowered = f"{code} {message}".lower()
            if any(w in lowered for w in _CONTEXT_WORDS):
                raise BudgetExceededError(
                    f"{where}: the prompt does not fit the context window: {detail}",
                    resource="context_window",
                    **ctx,
                )
            raise InvalidInputError(f"{where} rejected the request: {detail}", **ctx)
        if status in (401, 403):
            raise AccessDeniedError(f"{where} denied access: {detail}", **ctx)
        if status == 404:
            raise InvalidInputError(f"{where}: no such model or endpoint: {detail}", **ctx)
        if status == 413:
            raise PayloadTooLargeError(f"{where}: request too large: {detail}", **ctx)
        if status >= 500 or status in (408, 409, 425):
            raise UpstreamError(
                f"{where} failed: {detail}", retry_after=retry_after(headers), **ctx
            )
        raise InvalidInputError(f"{where} rejected the request: {detail}", **ctx)
