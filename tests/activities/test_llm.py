"""Unit tests of the llm package: headers, registry, limiter, breaker, redaction.

Fast checks beside the end-to-end tests in ``test_llm_call.py``; provider
replies here come from ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.errors import (
    BudgetExceededError,
    CircuitOpenError,
    InvalidInputError,
    RateLimitedError,
    UpstreamError,
    WorkerTimeoutError,
)
from aiworker.activities.llm import (
    ChatRequest,
    EndpointRateLimiter,
    LanguageModel,
    Message,
    ModelConfig,
    ModelRegistry,
    ModelsFileError,
    load_registry,
    parse_duration,
    retry_after,
)
from aiworker.activities.llm_call import build_messages, parse_reply_json
from aiworker.config.settings import Settings
from aiworker.workers.errors import StartupError
from aiworker.workers.process.resources import build_language_model

NOW = datetime(2030, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "Tue, 01 Jan 2030 00:00:05 GMT"}, 5.0),
        (
            {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "1.5s",
                "x-ratelimit-remaining-tokens": "900",
                "x-ratelimit-reset-tokens": "6m0s",
            },
            1.5,
        ),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        (
            {
                "anthropic-ratelimit-tokens-remaining": "0",
                "anthropic-ratelimit-tokens-reset": "2030-01-01T00:00:07Z",
            },
            7.0,
        ),
        ({"retry-after": "86400"}, 900.0),
        ({}, None),
        ({"retry-after": "soon"}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after(headers, now=NOW) == expected


def test_parse_duration() -> None:
    assert parse_duration("1h2m3.5s") == 3723.5
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("2") == 2.0
    assert parse_duration("2 minutes") is None


def _write(tmp_path: Path, doc: Any) -> Path:
    p = tmp_path / "models.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_registry_default_alias_and_file(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-file-key\n")
    path = _write(
        tmp_path,
        {
            "models": {
                "small": {"model": "gpt-4o-mini", "api_key_env": "K", "rpm": 10, "tpm": 1000},
                "azure": {
                    "base_url": "https://x.openai.azure.com/openai/deployments/d",
                    "model": "gpt-4o",
                    "api_key_env": "K",
                    "api_key_header": "api-key",
                    "query": {"api-version": "2024-10-21"},
                },
                "claude": {
                    "provider": "anthropic",
                    "model": "claude-3-5-haiku-latest",
                    "api_key_file": str(tmp_path / "key"),
                    "rpm": 5,
                },
            }
        },
    )
    settings = Settings(
        llm_model="llama3",
        llm_base_url="http://127.0.0.1:11434/v1",
        llm_api_key=SecretStr("sk-env"),
        models_file=path,
    )
    reg = load_registry(settings, {"K": "sk-k"})
    assert reg.aliases == ["azure", "claude", "default", "small"]
    default = reg.get("default")
    assert default is not None and default.provider == "openai"
    assert default.api_key is not None and default.api_key.get_secret_value() == "sk-env"
    small = reg.get("small")
    assert small is not None and small.base_url == "https://api.openai.com/v1"
    claude = reg.get("claude")
    assert claude is not None and claude.base_url == "https://api.anthropic.com"
    assert claude.structured_output == "tool"
    assert sorted(reg.secret_values()) == ["sk-env", "sk-file-key", "sk-k", "sk-k"]
    assert reg.limits["openai:api.openai.com"] == (10, 1000)
    assert "sk-" not in repr(claude)


@pytest.mark.parametrize(
    ("doc", "env", "message"),
    [
        ("{not json", {}, "not JSON"),
        ({"models": {"a": {"model": "m", "provider": "cohere"}}}, {}, "models.a.provider"),
        ({"models": {"a": {"model": "m", "rpm": 0}}}, {}, "models.a.rpm"),
        ({"models": {"a": {"model": "m", "api_key_env": "NOPE"}}}, {}, "NOPE is not set"),
        ({"models": {"a": {"model": "m", "api_key_file": "/no/such"}}}, {}, "cannot be read"),
        ({"models": {"a": {"model": "m", "base_url": "ftp://x"}}}, {}, "not an http(s) URL"),
        ({"models": {"a": {"model": "m", "headers": {"Authorization": "x"}}}}, {}, "secret"),
        ({"models": {"bad alias": {"model": "m"}}}, {}, "alias 'bad alias'"),
        ({"models": {"default": {"model": "m"}}}, {}, "already defined"),
        ({"models": {"a": {"model": "m", "typo": 1}}}, {}, "models.a.typo"),
    ],
)
def test_bad_models_file_fails_with_a_clear_message(
    tmp_path: Path, doc: Any, env: dict[str, str], message: str
) -> None:
    settings = Settings(llm_model="m", models_file=_write(tmp_path, doc))
    with pytest.raises(ModelsFileError) as e:
        load_registry(settings, env)
    assert message in str(e.value)


def test_process_start_fails_on_a_bad_models_file(tmp_path: Path) -> None:
    settings = Settings(models_file=tmp_path / "missing.json")
    with pytest.raises(StartupError, match=r"AIWORKER_MODELS_FILE .* cannot be read"):
        build_language_model(settings, {})
    with pytest.raises(StartupError, match="AIWORKER_LLM_MODEL is required"):
        build_language_model(Settings(llm_base_url="http://127.0.0.1:1/v1"), {})


def test_limiter_requests_and_tokens_per_minute() -> None:
    now = [1000.0]
    lim = EndpointRateLimiter({"t": (2, 1000)}, clock=lambda: now[0])
    lim.acquire("t", 100)
    now[0] += 10
    r = lim.acquire("t", 100)
    with pytest.raises(RateLimitedError) as e:
        lim.acquire("t", 100)
    assert e.value.retry_after == 50.0
    now[0] += 50
    r.settle(850)  # the real usage replaces the estimate
    with pytest.raises(RateLimitedError) as e:
        lim.acquire("t", 200)
    assert e.value.retry_after == 10.0
    with pytest.raises(BudgetExceededError):
        lim.acquire("t", 5000)
    lim.acquire("other", 10**9)  # no limits configured


def _lm(handler: Callable[[httpx.Request], httpx.Response], **cfg: Any) -> LanguageModel:
    config = ModelConfig(
        alias="m",
        provider="openai",
        base_url="http://provider.test/v1",
        model="gpt",
        api_key=SecretStr("sk-very-secret"),
        **cfg,
    )
    return LanguageModel(
        ModelRegistry({"m": config}),
        http=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        breakers=BreakerRegistry("provider", failure_threshold=2, open_seconds=30),
    )


REQ = ChatRequest(messages=(Message("user", "hi"),), alias="m", max_tokens=50)


async def test_breaker_opens_after_upstream_failures() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(502, text="bad gateway")

    lm = _lm(handler)
    for _ in range(2):
        with pytest.raises(UpstreamError):
            await lm.complete(REQ, deadline_seconds=5)
    with pytest.raises(CircuitOpenError) as e:
        await lm.complete(REQ, deadline_seconds=5)
    assert e.value.retry_after is not None and e.value.retry_after > 0
    assert len(calls) == 2
    await lm.http.aclose()


async def test_keys_are_redacted_and_connection_errors_are_upstream() -> None:
    def echo_key(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": request.headers["authorization"]}})

    lm = _lm(echo_key)
    with pytest.raises(InvalidInputError) as e:
        await lm.complete(REQ, deadline_seconds=5)
    assert "sk-very-secret" not in str(e.value) and "[REDACTED]" in str(e.value)
    await lm.http.aclose()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    lm = _lm(refuse)
    with pytest.raises(UpstreamError, match="ConnectError"):
        await lm.complete(REQ, deadline_seconds=5)
    await lm.http.aclose()


async def test_max_tokens_fits_model_limits_and_azure_headers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        doc = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
        return httpx.Response(200, json=doc)

    lm = _lm(
        handler,
        max_output_tokens=40,
        context_window=30,
        api_key_header="api-key",
        query=(("api-version", "2024-10-21"),),
    )
    reply = await lm.complete(REQ, deadline_seconds=5)
    body = json.loads(seen[0].content)
    assert body["max_tokens"] < 30  # the context window left after the prompt
    assert seen[0].headers["api-key"] == "sk-very-secret"
    assert "authorization" not in seen[0].headers
    assert seen[0].url.params["api-version"] == "2024-10-21"
    assert reply.usage.estimated and reply.text == "ok"
    await lm.http.aclose()


def test_reply_json_tolerates_fences() -> None:
    assert parse_reply_json('{"a": 1}') == {"a": 1}
    assert parse_reply_json('Here it is:\n```json\n{"a": 1}\n```\n') == {"a": 1}
    with pytest.raises(ValueError):
        parse_reply_json("no json here")


def test_feedback_becomes_the_last_user_message() -> None:
    msgs = build_messages(
        {
            "system": "s",
            "prompt": "p",
            "feedback": [{"path": "$.age", "message": "'x' is not of type 'integer'"}, "plain"],
        }
    )
    assert [m.role for m in msgs] == ["system", "user", "user"]
    assert "$.age: 'x' is not of type 'integer'" in msgs[-1].content
    assert "- plain" in msgs[-1].content


async def test_timeouts_count_against_the_breaker() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200)

    lm = _lm(hang)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(WorkerTimeoutError):
            await lm.complete(REQ, deadline_seconds=0.05)
    assert lm.breakers.state("openai:provider.test") == "open"
    await lm.http.aclose()


async def test_a_refused_call_does_not_use_up_the_half_open_probe() -> None:
    clock = [0.0]

    def ok(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert "max_completion_tokens" in body and "max_tokens" not in body
        doc = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
        return httpx.Response(200, json=doc)

    lm = _lm(ok, max_tokens_field="max_completion_tokens")
    lm.breakers = BreakerRegistry("provider", failure_threshold=1, clock=lambda: clock[0])
    lm.limiter = EndpointRateLimiter({"openai:provider.test": (1, None)}, clock=lambda: clock[0])
    lm.breakers.record_failure("openai:provider.test")
    with pytest.raises(CircuitOpenError):
        await lm.complete(REQ, deadline_seconds=5)
    clock[0] = 31.0  # half-open now; the refused call above released its slot
    reply = await lm.complete(REQ, deadline_seconds=5)
    assert reply.text == "ok" and lm.breakers.state("openai:provider.test") == "closed"
    with pytest.raises(RateLimitedError):
        await lm.complete(REQ, deadline_seconds=5)
    await lm.http.aclose()


async def test_one_span_per_call_with_model_and_tokens_but_no_prompt() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def ok(request: httpx.Request) -> httpx.Response:
        doc = {
            "model": "gpt-x",
            "choices": [{"message": {"content": "fine"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3},
        }
        return httpx.Response(200, json=doc)

    lm = _lm(ok)
    lm.tracer = provider.get_tracer("test")
    secret_prompt = ChatRequest(messages=(Message("user", "PROMPT-TEXT-42"),), alias="m")
    await lm.complete(secret_prompt, deadline_seconds=5)
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.name == "llm.call"
    assert attrs["gen_ai.request.model"] == "gpt" and attrs["gen_ai.response.model"] == "gpt-x"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (12, 3)
    assert "PROMPT-TEXT-42" not in json.dumps(attrs, default=str)
    await lm.http.aclose()
    provider.shutdown()


def test_structured_output_options_per_provider() -> None:
    from aiworker.activities.llm import AnthropicProvider, OpenAIProvider

    array_schema = {"type": "array", "items": {"type": "string"}}
    req = ChatRequest(messages=(Message("user", "list"),), response_schema=array_schema)
    claude = ModelConfig(alias="c", provider="anthropic", base_url="http://a", model="m")
    url, _, body = AnthropicProvider().build(claude, req, 10)
    assert url == "http://a/v1/messages"
    assert "tools" not in body and '"type":"array"' in body["system"]
    local = ModelConfig(
        alias="l", provider="openai", base_url="http://o/v1", model="m", structured_output="prompt"
    )
    _, headers, body = OpenAIProvider().build(local, req, 10)
    assert "response_format" not in body and "authorization" not in headers
    assert (
        body["messages"][0]["role"] == "system" and "JSON Schema" in body["messages"][0]["content"]
    )
