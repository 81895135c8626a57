"""The llm-call worker through the real Temporal server, against loopback
providers that misbehave on purpose (see ``fixtures/llm_fakes.py``). Attempts and error
codes come from the pipeline result and the workflow history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.llm_fakes import BAD, GOOD, PERSON_SCHEMA, FakeProvider, fake  # noqa: F401  (module fixture)
from prometheus_client import CollectorRegistry
from support.loopback import upstream
from support.pipelines import pipeline_result
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from aiworker.activities.breakers import BreakerRegistry
from aiworker.activities.llm import LanguageModel, LlmMetrics, load_registry
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer

OPENAI_SCENARIOS = (
    "echo",
    "json-ok",
    "json-bad",
    "json-feedback",
    "ratelimit-once",
    "ratelimit-ms-once",
    "fail-once",
    "hang-once",
    "malformed",
    "not-openai",
    "length",
    "context",
    "unauthorized",
    "bad-request",
)
ANTHROPIC_SCENARIOS = ("echo", "tool", "overloaded-once", "ratelimit-once")


@dataclass
class Models:
    """One test's model aliases on the fake provider."""

    uid: str
    key: str
    lm: LanguageModel

    def model(self, scenario: str) -> str:
        return f"{scenario}@{self.uid}"


def write_models(
    tmp_path: Path, fake: FakeProvider, uid: str, extra: dict[str, Any] | None = None
) -> Path:
    models: dict[str, Any] = {}
    for s in OPENAI_SCENARIOS:
        models[s] = {
            "provider": "openai",
            "base_url": fake.root + "/v1",
            "model": f"{s}@{uid}",
            "api_key_env": "FAKE_LLM_KEY",
        }
    key_file = tmp_path / "anthropic.key"
    key_file.write_text("sk-ant-" + uid + "\n")
    for s in ANTHROPIC_SCENARIOS:
        models[f"claude-{s}"] = {
            "provider": "anthropic",
            "base_url": fake.root,
            "model": f"{s}@{uid}",
            "api_key_file": str(key_file),
        }
    models.update(extra or {})
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    return path


def build_lm(settings: Settings, path: Path, key: str, **kw: Any) -> LanguageModel:
    registry = load_registry(
        settings.model_copy(update={"models_file": path}), {"FAKE_LLM_KEY": key}
    )
    return LanguageModel(registry, metrics=LlmMetrics(CollectorRegistry()), **kw)


@pytest_asyncio.fixture
async def models(tmp_path: Path, fake: FakeProvider, settings: Settings) -> AsyncIterator[Models]:
    uid = uuid.uuid4().hex[:10]
    key = f"sk-test-{uid}-secret"
    # A high threshold: tests that fail on purpose must not open each other's breaker.
    lm = build_lm(
        settings,
        write_models(tmp_path, fake, uid),
        key,
        breakers=BreakerRegistry("provider", failure_threshold=100),
    )
    try:
        yield Models(uid, key, lm)
    finally:
        await lm.aclose()


@pytest_asyncio.fixture
async def llm_stack(client: Client, settings: Settings, models: Models) -> AsyncIterator[Stack]:
    async with running_stack(client, settings, tools={"language_model": models.lm}) as s:
        yield s


async def run_step(
    stack: Stack, worker_input: dict[str, Any], inputs: dict[str, Any] | None = None, **step: Any
) -> tuple[PipelineResult, WorkflowHandle[Any, Any]]:
    pipeline = {
        "name": "llm",
        "tenant": "acme",
        "inputs": inputs or {},
        "steps": [{"id": "ask", "worker": "llm-call", "input": worker_input, **step}],
        "output": {},
    }
    handle = await stack.start(pipeline)
    return await pipeline_result(handle), handle


async def last_failure(handle: WorkflowHandle[Any, Any]) -> tuple[int, Failure]:
    """The llm-call activity's final attempt number and the failure of the one before."""
    history = await handle.fetch_history()
    started = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert len(started) == 1
    return started[0].attempt, started[0].last_failure


async def test_structured_output_succeeds_and_keys_stay_out_of_history(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    result, handle = await run_step(
        llm_stack,
        {
            "model": "json-ok",
            "system": "You extract people.",
            "prompt": "Ada Lovelace, 36",
            "max_tokens": 200,
            "temperature": 0,
            "seed": 7,
            "stop": "END",
            "response_schema": PERSON_SCHEMA,
        },
    )
    step = result.steps["ask"]
    assert result.status == "succeeded", step
    assert step.attempts == 1
    assert step.outputs["json"] == GOOD
    assert step.outputs["finish_reason"] == "stop"
    assert step.outputs["model"] == models.model("json-ok") + "-2024"
    assert step.outputs["alias"] == "json-ok"
    usage = step.outputs["usage"]
    assert usage["output_tokens"] == 7 and usage["input_tokens"] > 0
    assert (step.usage.input_tokens, step.usage.output_tokens) == (usage["input_tokens"], 7)
    assert step.usage.external_calls == 1
    (sent,) = fake.seen(models.model("json-ok"))
    assert sent.headers["authorization"] == f"Bearer {models.key}"
    assert sent.body["max_tokens"] == 200
    assert sent.body["temperature"] == 0 and sent.body["seed"] == 7 and sent.body["stop"] == ["END"]
    assert sent.body["response_format"]["type"] == "json_schema"
    assert sent.body["response_format"]["json_schema"]["schema"] == PERSON_SCHEMA
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    history = await handle.fetch_history()
    assert models.key not in history.to_json()


async def test_spec_caps_max_tokens_and_messages_pass_through(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "say echo"},
    ]
    result, _ = await run_step(llm_stack, {"model": "echo", "messages": messages})
    step = result.steps["ask"]
    assert result.status == "succeeded", step
    assert step.outputs["text"] == "echo: say echo"
    assert "json" not in step.outputs
    (sent,) = fake.seen(models.model("echo"))
    assert sent.body["max_tokens"] == 1500  # the spec's constraint
    assert sent.body["messages"] == messages
    assert "response_format" not in sent.body


async def test_429_retries_after_the_delay_the_provider_asked_for(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    (r1, h1), (r2, h2) = await asyncio.gather(
        run_step(llm_stack, {"model": "ratelimit-once", "prompt": "a"}),
        run_step(llm_stack, {"model": "ratelimit-ms-once", "prompt": "b"}),
    )
    for result, handle, delay_ms in ((r1, h1, 1000), (r2, h2, 300)):
        assert result.status == "succeeded", result.steps["ask"]
        assert result.steps["ask"].attempts == 2
        attempt, failure = await last_failure(handle)
        assert attempt == 2
        info = failure.application_failure_info
        assert info.type == "rate_limited"
        assert info.next_retry_delay.ToMilliseconds() == delay_ms
    assert len(fake.seen(models.model("ratelimit-once"))) == 2


async def test_5xx_then_200_and_broken_replies_are_upstream_errors(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    (ok, ok_handle), (broken, _), (alien, _) = await asyncio.gather(
        run_step(llm_stack, {"model": "fail-once", "prompt": "a"}),
        run_step(llm_stack, {"model": "malformed", "prompt": "b"}, retry={"max_attempts": 2}),
        run_step(llm_stack, {"model": "not-openai", "prompt": "c"}, retry={"max_attempts": 1}),
    )
    assert ok.status == "succeeded", ok.steps["ask"]
    assert ok.steps["ask"].attempts == 2
    _, failure = await last_failure(ok_handle)
    assert failure.application_failure_info.type == "upstream_error"
    assert "HTTP 500" in failure.message
    step = broken.steps["ask"]
    assert (broken.status, step.error_code, step.attempts) == ("failed", "upstream_error", 2)
    assert "not JSON" in (step.error_message or "")
    assert len(fake.seen(models.model("malformed"))) == 2
    step = alien.steps["ask"]
    assert (step.error_code, step.attempts) == ("upstream_error", 1)


async def test_a_hang_past_the_timeout_is_a_timeout_then_retried(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    result, handle = await run_step(
        llm_stack, {"model": "hang-once", "prompt": "a"}, timeout_seconds=1.5
    )
    assert result.status == "succeeded", result.steps["ask"]
    assert result.steps["ask"].attempts == 2
    assert result.steps["ask"].outputs["text"] == "echo: a"
    _, failure = await last_failure(handle)
    assert failure.application_failure_info.type == "timeout"
    assert len(fake.seen(models.model("hang-once"))) == 2


async def test_schema_violations_and_length_are_invalid_output_with_reasons(
    llm_stack: Stack,
) -> None:
    schema_input = {"prompt": "who?", "response_schema": PERSON_SCHEMA}
    (bad, _), (cut, _), (plain_cut, _) = await asyncio.gather(
        run_step(llm_stack, {**schema_input, "model": "json-bad"}),
        run_step(llm_stack, {**schema_input, "model": "length"}),
        run_step(llm_stack, {"prompt": "who?", "model": "length"}),
    )
    step = bad.steps["ask"]
    assert (bad.status, step.error_code, step.attempts) == ("failed", "invalid_output", 1)
    # the rejected reply was billed: its tokens count against the pipeline's budget
    assert step.usage.input_tokens > 0 and step.usage.output_tokens > 0
    assert step.usage.external_calls == 1
    assert bad.usage == step.usage
    reasons = step.reasons
    assert [r["path"] for r in reasons] == ["$.age"]
    assert reasons[0]["validator"] == "type"
    step = cut.steps["ask"]
    assert (step.error_code, step.attempts) == ("invalid_output", 1)
    assert step.reasons[0]["validator"] == "finish_reason"
    # Without a schema a cut reply is a partial result, not a failure.
    step = plain_cut.steps["ask"]
    assert step.status == "partial"
    assert step.outputs["finish_reason"] == "length"
    assert step.warnings[0]["code"] == "truncated"


async def test_feedback_reaches_the_model_and_fixes_the_reply(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    base = {"model": "json-feedback", "prompt": "who?", "response_schema": PERSON_SCHEMA}
    first, _ = await run_step(llm_stack, base)
    reasons = first.steps["ask"].reasons
    assert first.steps["ask"].error_code == "invalid_output"
    second, _ = await run_step(llm_stack, {**base, "feedback": reasons})
    assert second.status == "succeeded", second.steps["ask"]
    assert second.steps["ask"].outputs["json"] == GOOD
    last = fake.seen(models.model("json-feedback"))[-1].body["messages"][-1]
    assert last["role"] == "user" and "$.age" in last["content"]
    assert BAD["age"] in last["content"]


async def test_a_remote_ref_in_response_schema_is_never_fetched(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    """A literal response_schema with a remote ``$ref`` is refused before the run;
    nothing reaches the server it names, nor the model."""
    with upstream() as server:
        handle = await llm_stack.start(
            {
                "name": "llm",
                "steps": [
                    {
                        "id": "ask",
                        "worker": "llm-call",
                        "input": {
                            "model": "echo",
                            "prompt": "a",
                            "response_schema": {"$ref": server.base_url + "/s.json"},
                        },
                    }
                ],
            }
        )
        with pytest.raises(WorkflowFailureError) as e:
            await handle.result()
    assert isinstance(e.value.cause, ApplicationError) and e.value.cause.type == "invalid_input"
    assert "step 'ask': field 'input.response_schema': $ref" in str(e.value.cause)
    assert "aiworker never fetches schemas" in str(e.value.cause)
    assert server.total == 0
    assert fake.seen(models.model("echo")) == []


async def test_permanent_provider_errors_are_not_retried(
    llm_stack: Stack, models: Models, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiworker")
    outcomes = await asyncio.gather(
        run_step(llm_stack, {"model": "context", "prompt": "long"}),
        run_step(llm_stack, {"model": "unauthorized", "prompt": "a"}),
        run_step(llm_stack, {"model": "bad-request", "prompt": "a"}),
        run_step(llm_stack, {"model": "no-such-alias", "prompt": "a"}),
        # Through a reference: a literal bad schema is refused before the run starts.
        run_step(
            llm_stack,
            {"model": "echo", "prompt": "a", "response_schema": "${{ inputs.schema }}"},
            inputs={"schema": {"type": 5}},
        ),
    )
    codes = [(r.steps["ask"].error_code, r.steps["ask"].attempts) for r, _ in outcomes]
    assert codes == [
        ("budget_exceeded", 1),
        ("access_denied", 1),
        ("invalid_input", 1),
        ("invalid_input", 1),
        ("invalid_input", 1),
    ]
    denied = outcomes[1][0].steps["ask"].error_message or ""
    assert "Incorrect API key" in denied and models.key not in denied
    assert models.key not in (await outcomes[1][1].fetch_history()).to_json()
    lines = [
        r.getMessage() + json.dumps(getattr(r, "aiworker", {}), default=str) for r in caplog.records
    ]
    assert any('"error_code": "access_denied"' in line for line in lines)
    assert not any(models.key in line for line in lines)
    assert "no-such-alias" in (outcomes[3][0].steps["ask"].error_message or "")
    assert fake.seen(models.model("echo")) == []


async def test_anthropic_messages_structured_output_and_errors(
    llm_stack: Stack, models: Models, fake: FakeProvider
) -> None:
    (tool, _), (plain, _), (overloaded, h_over), (limited, h_lim) = await asyncio.gather(
        run_step(
            llm_stack,
            {
                "model": "claude-tool",
                "system": "be brief",
                "prompt": "who?",
                "response_schema": PERSON_SCHEMA,
            },
        ),
        run_step(llm_stack, {"model": "claude-echo", "prompt": "hi", "stop": ["X"]}),
        run_step(llm_stack, {"model": "claude-overloaded-once", "prompt": "a"}),
        run_step(llm_stack, {"model": "claude-ratelimit-once", "prompt": "a"}),
    )
    step = tool.steps["ask"]
    assert tool.status == "succeeded", step
    assert step.outputs["json"] == GOOD
    assert step.outputs["usage"] == {"input_tokens": 11, "output_tokens": 5}
    (sent,) = fake.seen(models.model("tool"))
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-" + models.uid
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.body["system"] == "be brief"
    assert sent.body["tool_choice"] == {"type": "tool", "name": sent.body["tools"][0]["name"]}
    assert sent.body["tools"][0]["input_schema"] == PERSON_SCHEMA
    assert plain.steps["ask"].outputs["text"] == "echo: hi"
    (sent,) = fake.seen(models.model("echo"))
    assert sent.body["stop_sequences"] == ["X"]
    assert overloaded.steps["ask"].attempts == 2
    _, failure = await last_failure(h_over)
    assert failure.application_failure_info.type == "upstream_error"
    assert limited.status == "succeeded" and limited.steps["ask"].attempts == 2
    _, failure = await last_failure(h_lim)
    assert failure.application_failure_info.type == "rate_limited"
    # From the exhausted limit's reset timestamp (requests), not the far-off tokens reset.
    assert 0 < failure.application_failure_info.next_retry_delay.ToMilliseconds() <= 2000


async def test_client_side_limits_and_context_window_refuse_before_the_call(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> None:
    uid = uuid.uuid4().hex[:10]
    extra = {
        "tiny": {
            "base_url": "http://localhost:1/v1",
            "model": f"echo@{uid}-tiny",
            "context_window": 8,
        },
        "limited": {
            "base_url": fake.root + "/v1",
            "model": f"echo@{uid}-limited",
            "rpm": 1,
            "api_key_env": "FAKE_LLM_KEY",
        },
    }
    lm = build_lm(settings, write_models(tmp_path, fake, uid, extra), "sk-x-" + uid)
    try:
        async with running_stack(client, settings, tools={"language_model": lm}) as stack:
            first, _ = await run_step(stack, {"model": "limited", "prompt": "a"})
            second, _ = await run_step(
                stack, {"model": "limited", "prompt": "b"}, retry={"max_attempts": 1}
            )
            too_long, _ = await run_step(stack, {"model": "tiny", "prompt": "x" * 200})
    finally:
        await lm.aclose()
    assert first.status == "succeeded", first.steps["ask"]
    step = second.steps["ask"]
    assert (step.error_code, step.attempts) == ("rate_limited", 1)
    assert "requests/min" in (step.error_message or "")
    assert len(fake.seen(f"echo@{uid}-limited")) == 1
    step = too_long.steps["ask"]
    assert (step.error_code, step.attempts) == ("budget_exceeded", 1)
    assert "context window" in (step.error_message or "")


async def test_real_provider_structured_output(
    client: Client, settings: Settings, request: pytest.FixtureRequest
) -> None:
    """Against a real model: the session's local one (fixtures/local_model.py), or
    the OpenAI-compatible server AIWORKER_TEST_LLM_BASE_URL names (with
    AIWORKER_TEST_LLM_MODEL and optionally AIWORKER_TEST_LLM_API_KEY)."""
    base_url = os.environ.get("AIWORKER_TEST_LLM_BASE_URL")
    model = os.environ.get("AIWORKER_TEST_LLM_MODEL", "default")
    if not base_url:
        local: ModelServer = request.getfixturevalue("local_model")
        base_url, model = local.base_url, MODEL_NAME
    real = settings.model_copy(
        update={
            "llm_base_url": base_url,
            "llm_model": model,
            "llm_api_key": os.environ.get("AIWORKER_TEST_LLM_API_KEY") or None,
        }
    )
    real = Settings.model_validate(real.model_dump())
    lm = LanguageModel(load_registry(real, {}))
    schema = {
        "type": "object",
        "required": ["city", "country"],
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    }
    try:
        async with running_stack(client, real, tools={"language_model": lm}) as stack:
            result, _ = await run_step(
                stack,
                {
                    "prompt": "Name the capital of France as JSON with keys city and country.",
                    "max_tokens": 64,
                    "temperature": 0,
                    "response_schema": schema,
                },
            )
    finally:
        await lm.aclose()
    step = result.steps["ask"]
    assert result.status == "succeeded", step
    assert set(step.outputs["json"]) >= {"city", "country"}
    assert step.outputs["usage"]["output_tokens"] > 0
