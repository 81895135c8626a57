"""A prompt worker in pipelines on the real Temporal dev server.

The worker is ``examples/prompts/classify-ticket.json``, copied as it is into
a spec directory the process loads (``AIWORKER_WORKER_SPECS``), served by the
process beside the built-ins; its ``default`` model alias points
(``AIWORKER_LLM_BASE_URL`` / ``AIWORKER_LLM_MODEL``) at a loopback
OpenAI-compatible server that answers what each test scripts (``fixtures/llm_fakes.py``).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, installed_workers, running_stack

# The loopback model provider lives beside the llm-call tests.
from fixtures.llm_fakes import FakeProvider, Recorded, fake  # noqa: F401  (module fixture)
from prometheus_client import CollectorRegistry
from support.pipelines import pipeline_result
from temporalio.client import Client, WorkflowHandle

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.process.resources import build_language_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
WORKER = "classify-ticket"
TICKET = {
    "subject": "Checkout page returns 500 for everyone",
    "body": "Since 09:10 UTC none of our customers can pay.",
}
GOOD = {"category": "bug", "priority": "urgent", "summary": "Checkout fails with 500 for all."}


@dataclass
class PromptStack:
    stack: Stack
    model: str
    fake: FakeProvider

    def sent(self) -> list[Recorded]:
        return self.fake.seen(self.model)

    async def run(
        self, steps: list[dict[str, Any]], **pipeline: Any
    ) -> tuple[PipelineResult, WorkflowHandle[Any, Any]]:
        spec = {
            "name": "triage",
            "tenant": "acme",
            "inputs": TICKET,
            "steps": steps,
            "output": {},
            **pipeline,
        }
        handle = await self.stack.start(spec)
        return await pipeline_result(handle), handle


@pytest_asyncio.fixture
async def prompts(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> AsyncIterator[PromptStack]:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(EXAMPLES / f"{WORKER}.json", specs)
    # the same worker with a model alias nobody defined
    raw = json.loads((EXAMPLES / f"{WORKER}.json").read_text("utf-8"))
    raw["worker_id"] = "classify-ticket-next"
    raw["implementation"]["model"] = "next-model"
    (specs / "classify-ticket-next.json").write_text(json.dumps(raw))
    model = f"scripted@{uuid.uuid4().hex[:10]}"
    s = Settings.model_validate(
        settings.model_dump()
        | {"worker_specs": (specs,), "llm_base_url": fake.root + "/v1", "llm_model": model}
    )
    # the process's own builder: the `default` alias from AIWORKER_LLM_* settings
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        # entry_points=(): a plugin installed in this venv must not change the set
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}) as stack:
                yield PromptStack(stack, model, fake)
    finally:
        await lm.aclose()


def triage_step(**extra: Any) -> dict[str, Any]:
    return {
        "id": "triage",
        "worker": WORKER,
        "input": {"subject": "${{ inputs.subject }}", "body": "${{ inputs.body }}"},
        **extra,
    }


async def scheduled(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    history = await handle.fetch_history()
    return [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


def sample(stack: Stack, name: str, **labels: str) -> float | None:
    return stack.metrics.registry.get_sample_value(name, labels)


async def test_a_reply_that_misses_the_schema_is_retried_with_the_reasons_and_passes(
    prompts: PromptStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiworker")
    wrong = {**GOOD, "priority": "asap"}
    prompts.fake.script(prompts.model, json.dumps(wrong), json.dumps(GOOD))
    result, handle = await prompts.run(
        [triage_step(validate={"schema": {"type": "object"}, "max_attempts": 3})],
        output={"priority": "${{ steps.triage.outputs.priority }}"},
    )

    step = result.steps["triage"]
    assert result.status == "succeeded", step
    assert step.outputs == GOOD and result.output == {"priority": "urgent"}
    # two worker calls (one Temporal attempt each: invalid_output is not retried),
    # one validation of the reply that passed
    assert (step.attempts, step.validation_attempts) == (2, 1)
    first, second = prompts.sent()
    assert "rejected" not in json.dumps(first.body["messages"])
    assert second.body["messages"][:-1] == first.body["messages"]
    feedback = second.body["messages"][-1]
    assert feedback["role"] == "user" and "rejected" in feedback["content"]
    assert "$.priority" in feedback["content"] and '"asap" is not one of' in feedback["content"]
    # both replies were billed: the rejected one's tokens count too
    assert step.usage.output_tokens == 14 and step.usage.external_calls == 2
    assert result.usage.output_tokens == 14

    # its own activity, task queue, timeout and retries, from its spec
    calls = [a for a in await scheduled(handle) if a.activity_type.name == WORKER]
    assert len(calls) == 2
    queue = prompts.stack.settings.queue("support-triage")
    for a in calls:
        assert a.task_queue.name == queue
        assert a.start_to_close_timeout.ToTimedelta() == timedelta(seconds=30 + 5)
        assert a.retry_policy.maximum_attempts == 3
        assert "invalid_output" in a.retry_policy.non_retryable_error_types
    assert first.body["max_tokens"] == second.body["max_tokens"] == 300

    # its own metrics and log lines, under its worker id (never llm-call's)
    stack = prompts.stack
    labels = {"worker_id": WORKER, "tenant": "acme"}
    assert (
        sample(
            stack, "aiworker_requests_total", **labels, status="failed", error_code="invalid_output"
        )
        == 1
    )
    assert (
        sample(stack, "aiworker_requests_total", **labels, status="succeeded", error_code="") == 1
    )
    assert (
        sample(
            stack,
            "aiworker_tokens_total",
            worker_id=WORKER,
            model=prompts.model,
            direction="output",
        )
        == 7
    )
    assert (
        sample(stack, "aiworker_external_calls_total", worker_id=WORKER, tool="language_model") == 2
    )
    assert not any(
        s.labels.get("worker_id") == "llm-call"
        for m in stack.metrics.registry.collect()
        for s in m.samples
    )
    lines = [
        getattr(r, "aiworker", {})
        for r in caplog.records
        if getattr(r, "aiworker", {}).get("event") == "worker_call"
    ]
    mine = [line for line in lines if line.get("worker_id") == WORKER]
    assert [line.get("error_code") for line in mine] == ["invalid_output", None]
    assert all(line["workflow_id"] == handle.id and line["tenant"] == "acme" for line in mine)
    assert mine[1]["model"] == prompts.model and mine[1]["alias"] == "default"
    assert not any(line.get("worker_id") == "llm-call" for line in lines)


async def test_a_reply_the_steps_validator_rejects_is_retried_with_its_reasons(
    prompts: PromptStack,
) -> None:
    low = {**GOOD, "priority": "low"}
    prompts.fake.script(prompts.model, json.dumps(low), json.dumps(GOOD))
    # the worker's contract allows "low"; this pipeline's gate does not
    gate = {
        "type": "object",
        "required": ["priority"],
        "properties": {"priority": {"enum": ["high", "urgent"]}},
    }
    result, _ = await prompts.run([triage_step(validate={"schema": gate, "max_attempts": 2})])
    step = result.steps["triage"]
    assert result.status == "succeeded", step
    assert step.outputs == GOOD
    assert (step.attempts, step.validation_attempts) == (2, 2)
    first, second = prompts.sent()
    assert second.body["messages"][:-1] == first.body["messages"]
    assert "$.priority" in second.body["messages"][-1]["content"]
    assert '"low" is not one of ["high","urgent"]' in second.body["messages"][-1]["content"]


async def test_retries_budget_and_a_bad_alias_follow_the_prompt_workers_spec(
    prompts: PromptStack,
) -> None:
    # a 5xx is upstream_error: Temporal retries it under the spec's policy
    prompts.fake.script(prompts.model, 500, json.dumps(GOOD))
    result, handle = await prompts.run(
        [triage_step()], budget={"max_tokens": 2000, "max_external_calls": 5}
    )
    step = result.steps["triage"]
    assert result.status == "succeeded", step
    assert step.attempts == 2 and step.outputs == GOOD
    history = await handle.fetch_history()
    (started,) = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
        and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert started.last_failure.application_failure_info.type == "upstream_error"
    # the budget's share, not more: min(spec's 300, what the pipeline has left)
    assert [r.body["max_tokens"] for r in prompts.sent()] == [300, 300]
    small, _ = await prompts.run([triage_step()], budget={"max_tokens": 120})
    assert small.status == "succeeded", small.steps["triage"]
    assert prompts.sent()[-1].body["max_tokens"] == 120

    # a model alias this process does not define: invalid_input, once, naming the field
    calls = len(prompts.fake.requests)
    bad, _ = await prompts.run([{**triage_step(), "worker": "classify-ticket-next"}])
    step = bad.steps["triage"]
    assert (bad.status, step.error_code, step.attempts) == ("failed", "invalid_input", 1)
    assert "'next-model' (implementation.model)" in (step.error_message or "")
    assert len(prompts.fake.requests) == calls
