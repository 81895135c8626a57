"""llm-call against a real model: the session's local llama-server with
SmolLM2-135M-Instruct (fixtures/local_model.py), through the real worker runtime
in pipelines on the real Temporal server. No skip: ``make test`` installs the
model server like any dependency.

A recording proxy on loopback stands between the worker and the model server
and keeps each raw exchange, so the tests compare what the pipeline booked
with what the server itself reported. The model shares the machine's cores
with the Temporal server: prompts and ``max_tokens`` stay small.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.loopback import Exchange, serve
from support.pipelines import pipeline_result
from temporalio.client import Client

from aiworker.activities.llm import LanguageModel, load_registry
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer

CITY_SCHEMA = {
    "type": "object",
    "required": ["city", "country"],
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
    },
    "additionalProperties": False,
}
YEAR_SCHEMA = {
    "type": "object",
    "required": ["year"],
    "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
    "additionalProperties": False,
}


@dataclass
class Proxy:
    """A loopback proxy in front of the local model that keeps every exchange."""

    base_url: str
    exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def replies(self) -> list[dict[str, Any]]:
        return [reply for _, reply in self.exchanges]


@pytest.fixture
def proxy(local_model: ModelServer) -> Iterator[Proxy]:
    target = f"http://{local_model.host}:{local_model.port}"
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def forward(ex: Exchange) -> None:
        body = ex.body()
        request = urllib.request.Request(
            target + ex.target,
            data=body if ex.method == "POST" else None,
            headers={"Content-Type": "application/json"},
            method=ex.method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                status, raw = int(r.status), r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        if ex.method == "POST":
            seen.append((json.loads(body), json.loads(raw)))
        ex.send(status, raw, "application/json")

    with serve(forward) as server:
        yield Proxy(server.base_url + "/v1", seen)


@pytest_asyncio.fixture
async def local_stack(
    client: Client, settings: Settings, proxy: Proxy, tmp_path: Path
) -> AsyncIterator[Stack]:
    """Workers whose ``default`` alias is the local model, behind the proxy; the
    alias ``prompt-only`` is the same model with the schema sent as an instruction
    only (no grammar), the way a server without structured output is used."""
    models = tmp_path / "models.json"
    prompt_only = {"base_url": proxy.base_url, "model": MODEL_NAME, "structured_output": "prompt"}
    models.write_text(json.dumps({"models": {"prompt-only": prompt_only}}))
    real = settings.model_copy(
        update={"llm_base_url": proxy.base_url, "llm_model": MODEL_NAME, "models_file": models}
    )
    lm = LanguageModel(load_registry(real, {}))
    try:
        async with running_stack(client, real, tools={"language_model": lm}) as stack:
            yield stack
    finally:
        await lm.aclose()


async def run_step(stack: Stack, worker_input: dict[str, Any], **step: Any) -> PipelineResult:
    pipeline = {
        "name": "local-llm",
        "tenant": "acme",
        "steps": [{"id": "ask", "worker": "llm-call", "input": worker_input, **step}],
        "output": {"text": "${{ steps.ask.outputs.text }}"},
    }
    handle = await stack.start(pipeline)
    result: PipelineResult = await pipeline_result(handle)
    return result


async def test_plain_completion_books_the_usage_the_server_reported(
    local_stack: Stack, proxy: Proxy
) -> None:
    result = await run_step(
        local_stack,
        {"prompt": "Say hello to Ada in a few words.", "max_tokens": 24, "temperature": 0},
    )
    step = result.steps["ask"]
    assert step.status in ("succeeded", "partial"), step
    assert step.outputs["text"].strip()
    assert step.outputs["alias"] == "default"
    (reply,) = proxy.replies()
    server_usage = reply["usage"]
    assert server_usage["prompt_tokens"] > 0 and server_usage["completion_tokens"] > 0
    usage = step.outputs["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        server_usage["prompt_tokens"],
        server_usage["completion_tokens"],
    )
    # booked once on the step and on the pipeline, as the server counted
    assert (step.usage.input_tokens, step.usage.output_tokens) == (
        usage["input_tokens"],
        usage["output_tokens"],
    )
    assert (result.usage.input_tokens, result.usage.output_tokens) == (
        usage["input_tokens"],
        usage["output_tokens"],
    )
    assert step.usage.external_calls == 1
    assert usage["output_tokens"] <= 24
    if step.status == "partial":  # cut at max_tokens: said so, not hidden
        assert step.outputs["finish_reason"] == "length"
        assert [w["code"] for w in step.warnings] == ["truncated"]


async def test_structured_output_through_response_schema(local_stack: Stack, proxy: Proxy) -> None:
    result = await run_step(
        local_stack,
        {
            "system": "You answer in JSON.",
            "prompt": "Paris is the capital of which country? Give city and country.",
            "max_tokens": 48,
            "temperature": 0,
            "response_schema": CITY_SCHEMA,
        },
    )
    step = result.steps["ask"]
    assert result.status == "succeeded", step
    assert set(step.outputs["json"]) == {"city", "country"}
    assert all(isinstance(v, str) for v in step.outputs["json"].values())
    ((sent, reply),) = proxy.exchanges
    # the schema reached the server, which constrained its output to it
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == CITY_SCHEMA
    assert json.loads(reply["choices"][0]["message"]["content"]) == step.outputs["json"]
    assert step.usage.output_tokens == reply["usage"]["completion_tokens"] > 0


async def test_validation_loop_ends_in_success_or_clean_invalid_output(
    local_stack: Stack, proxy: Proxy
) -> None:
    # Without a grammar to hold it to the schema, a 135M model often misses it.
    result = await run_step(
        local_stack,
        {
            "model": "prompt-only",
            "prompt": "In which year did Apollo 11 land on the Moon?",
            "max_tokens": 24,
            "temperature": 0,
            "response_schema": YEAR_SCHEMA,
        },
        validate={"schema": {"required": ["json"]}, "max_attempts": 3},
        retry={"max_attempts": 1},
    )
    step = result.steps["ask"]
    runs = len(proxy.exchanges)
    assert 1 <= step.attempts == runs <= 3, step
    if step.status == "succeeded":
        assert 1900 <= step.outputs["json"]["year"] <= 2100
    else:
        assert (step.status, step.error_code, runs) == ("failed", "invalid_output", 3), step
    # each run after the first showed the model why the last one was rejected
    for sent, _ in proxy.exchanges[1:]:
        assert "rejected" in sent["messages"][-1]["content"]
    assert "response_format" not in proxy.exchanges[0][0]
    booked = sum(reply["usage"]["completion_tokens"] for reply in proxy.replies())
    assert result.usage.output_tokens == booked


async def test_a_tiny_timeout_is_a_timeout(local_stack: Stack) -> None:
    result = await run_step(
        local_stack,
        {"prompt": "Count from one to twenty in words.", "max_tokens": 64, "temperature": 0},
        timeout_seconds=0.05,
        retry={"max_attempts": 1},
    )
    step = result.steps["ask"]
    assert (result.status, step.status, step.error_code) == ("failed", "failed", "timeout"), step
    assert step.attempts == 1


@pytest.mark.timeout(150)
async def test_an_agent_on_the_local_model_ends_in_a_clean_terminal_state(
    local_stack: Stack, proxy: Proxy
) -> None:
    """The 135M model is too small to call tools reliably: with one tool and a
    few turns, the run only has to end cleanly, whatever the model does (an
    answer, a bad tool call returned to it, or a bound), never `internal`."""
    pipeline = {
        "name": "local-agent",
        "tenant": "acme",
        "steps": [
            {
                "id": "agent",
                "worker": "llm-agent",
                "input": {
                    "prompt": 'Check that {"price": 3} has a number price, then say done.',
                    "model": "default",
                    "tools": ["validator"],
                    "max_turns": 3,
                    "max_tokens": 48,
                },
            }
        ],
    }
    handle = await local_stack.start(pipeline)
    result: PipelineResult = await pipeline_result(handle)
    assert result.status in ("succeeded", "partial", "failed", "budget_exhausted"), result
    step = result.steps["agent"]
    assert step.error_code in (None, "budget_exceeded", "invalid_output"), step
    assert step.error_code != "internal"
    # the model was really asked (at least one turn went through the proxy)
    assert proxy.exchanges, "no request reached the local model"
    outputs = step.outputs or {}
    assert 1 <= outputs.get("turns", 0) <= 3, outputs
    assert isinstance(outputs.get("transcript"), list) and outputs["transcript"]
