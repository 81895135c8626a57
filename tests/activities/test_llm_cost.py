"""Cost in money: model aliases with prices, priced per call by the llm client,
summed per step and for the pipeline, held to ``budget.max_cost_usd``, counted
in ``aiworker_cost_usd_total``. Through the real worker runtime and pipelines on
the Temporal test server, against loopback providers whose ``cached`` scenario
reports prompt-cache use in OpenAI's and Anthropic's own usage fields
(``fixtures/llm_fakes.py``). Every figure below is worked out by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from fixtures.llm_fakes import GOOD, PERSON_SCHEMA, FakeProvider, fake  # noqa: F401  (module fixture)
from prometheus_client import CollectorRegistry
from support.pipelines import pipeline_result
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer

from aiworker.activities.llm import LlmMetrics, ModelsFileError, load_registry
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.errors import StartupError
from aiworker.workers.process.resources import build_language_model
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow

AIWORKER = str(Path(sys.executable).parent / "aiworker")

# US dollars per million tokens.
OPENAI_PRICES = {"input": 2.5, "cached_input": 1.25, "output": 10}
ANTHROPIC_PRICES = {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}
# One `cached` reply. OpenAI: 2000 prompt tokens of which 1500 cached, 300 output:
# (500 * 2.50 + 1500 * 1.25 + 300 * 10) / 1e6
GPT_CALL = Decimal("0.006125")
# Anthropic: 200 plain input + 1500 cache reads + 1000 cache writes, 300 output:
# (200 * 3 + 1500 * 0.30 + 1000 * 3.75 + 300 * 15) / 1e6
CLAUDE_CALL = Decimal("0.0093")
# alias -> the fake provider's scenario behind it
SCENARIOS = {
    "gpt": "cached",
    "gpt-feedback": "cached-feedback",
    "claude": "cached",
    "gpt-free": "cached",
}


@dataclass
class CostStack:
    stack: Stack
    uid: str
    fake: FakeProvider

    def model(self, alias: str) -> str:
        return f"{SCENARIOS[alias]}@{self.uid}-{alias}"

    async def run(
        self, steps: list[dict[str, Any]], **pipeline: Any
    ) -> tuple[PipelineResult, WorkflowHandle[Any, Any]]:
        spec = {"name": "cost", "tenant": "acme", "steps": steps, "output": {}, **pipeline}
        handle = await self.stack.start(spec)
        return await pipeline_result(handle), handle

    def cost_metric(self, alias: str) -> float | None:
        return self.stack.metrics.registry.get_sample_value(
            "aiworker_cost_usd_total", {"tenant": "acme", "model": self.model(alias)}
        )


def models_file(fake: FakeProvider, uid: str) -> dict[str, Any]:
    def alias(name: str, prices: Any, provider: str = "openai") -> dict[str, Any]:
        entry = {
            "provider": provider,
            "base_url": fake.root + ("/v1" if provider == "openai" else ""),
            "model": f"{SCENARIOS[name]}@{uid}-{name}",
        }
        return entry | ({"usd_per_million_tokens": prices} if prices else {})

    return {
        "models": {
            "gpt": alias("gpt", OPENAI_PRICES),
            "gpt-feedback": alias("gpt-feedback", OPENAI_PRICES),
            "claude": alias("claude", ANTHROPIC_PRICES, "anthropic"),
            "gpt-free": alias("gpt-free", None),
        }
    }


@pytest_asyncio.fixture
async def costs(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> AsyncIterator[CostStack]:
    uid = uuid.uuid4().hex[:10]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(models_file(fake, uid)))
    s = settings.model_copy(update={"models_file": path})
    # the worker process's own builder: the registry checked at start
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        async with running_stack(client, s, tools={"language_model": lm}) as stack:
            yield CostStack(stack, uid, fake)
    finally:
        await lm.aclose()


def ask(step_id: str, alias: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": step_id,
        "worker": "llm-call",
        "input": {"prompt": f"who is {step_id}?", "model": alias},
        **extra,
    }


async def test_cost_per_step_and_for_the_pipeline_prices_cached_tokens(
    costs: CostStack,
) -> None:
    each = ask("each", "gpt", for_each="${{ inputs.people }}")
    each["input"]["prompt"] = "who is ${{ item }}?"
    result, handle = await costs.run(
        [ask("gpt", "gpt"), ask("claude", "claude"), ask("free", "gpt-free"), each],
        inputs={"people": ["ada", "alan", "grace"]},
    )
    assert result.status == "succeeded", result.error
    steps = result.steps
    gpt, claude, free = steps["gpt"].usage, steps["claude"].usage, steps["free"].usage
    # OpenAI's prompt_tokens already count the cached ones
    assert (gpt.input_tokens, gpt.cached_input_tokens, gpt.cache_write_tokens) == (2000, 1500, 0)
    assert (gpt.output_tokens, gpt.cost_usd) == (300, GPT_CALL)
    # Anthropic's do not: every prompt token is counted, each part priced as such
    assert (claude.input_tokens, claude.cached_input_tokens) == (2700, 1500)
    assert (claude.cache_write_tokens, claude.cost_usd) == (1000, CLAUDE_CALL)
    # an alias without prices costs 0; its cached tokens are still reported
    assert (free.cached_input_tokens, free.cost_usd) == (1500, Decimal(0))
    # a for_each step sums its items' calls, chunks included
    assert steps["each"].usage.cost_usd == 3 * GPT_CALL
    total = 4 * GPT_CALL + CLAUDE_CALL
    assert total == Decimal("0.0338") and result.usage.cost_usd == total
    assert result.usage.cached_input_tokens == 6 * 1500
    # JSON carries money as an exact decimal string
    doc = result.model_dump(mode="json")
    assert doc["usage"]["cost_usd"] == "0.0338"
    assert doc["steps"]["gpt"]["usage"]["cost_usd"] == "0.006125"
    assert doc["steps"]["free"]["usage"]["cost_usd"] == "0"

    # the metric: every priced call, by tenant and model; nothing for a free alias
    assert costs.cost_metric("gpt") == pytest.approx(float(4 * GPT_CALL))
    assert costs.cost_metric("claude") == pytest.approx(float(CLAUDE_CALL))
    assert costs.cost_metric("gpt-free") is None

    # A replay rebuilds the same ledger from history: no call counted twice.
    history = await handle.fetch_history()
    replay = await Replayer(
        workflows=[PipelineWorkflow, PipelineForEachWorkflow],
        data_converter=data_converter(None),
    ).replay_workflow(history)
    assert replay.replay_failure is None
    progress = await handle.query(names.PROGRESS_QUERY)
    assert progress["usage"]["cost_usd"] == "0.0338"


async def test_a_rejected_reply_is_paid_for_once_and_its_retry_adds_up(
    costs: CostStack,
) -> None:
    # The first reply fails response_schema (invalid_output, its usage in the error);
    # the validation loop feeds the reasons back and the second reply passes.
    step = ask("person", "gpt-feedback", validate={"schema": {"type": "object"}})
    step["input"]["response_schema"] = PERSON_SCHEMA
    result, _ = await costs.run([step])
    person = result.steps["person"]
    assert result.status == "succeeded", result.error
    assert person.outputs is not None and person.outputs["json"] == GOOD
    assert len(costs.fake.seen(costs.model("gpt-feedback"))) == 2
    assert person.usage.cost_usd == 2 * GPT_CALL == result.usage.cost_usd
    assert person.usage.cached_input_tokens == 3000
    assert costs.cost_metric("gpt-feedback") == pytest.approx(float(2 * GPT_CALL))


async def test_max_cost_usd_refuses_the_next_step_and_ends_budget_exhausted(
    costs: CostStack,
) -> None:
    steps = [
        ask("first", "gpt"),
        ask("second", "gpt", depends_on=["first"]),
        ask("third", "gpt", depends_on=["second"]),
    ]
    # 0.006125 spent by the first step crosses a 0.01 limit only with the second
    result, _ = await costs.run(steps, budget={"max_cost_usd": 0.01})
    assert result.status == "budget_exhausted"
    assert [result.steps[s].status for s in ("first", "second", "third")] == [
        "succeeded",
        "succeeded",
        "failed",
    ]
    third = result.steps["third"]
    assert third.error_code == "budget_exceeded"
    message = "cost budget of 0.01 USD is spent (0.01225 USD used)"
    assert third.reasons == [{"resource": "cost_usd", "message": message}]
    assert result.error is not None and result.error.code == "budget_exceeded"
    assert result.error.step == "third" and message in result.error.message
    assert result.usage.cost_usd == 2 * GPT_CALL
    # refused before it ran: two calls reached the provider, not three
    assert len(costs.fake.seen(costs.model("gpt"))) == 2

    # a decimal string is a limit too; a free alias never spends it
    free = [ask("a", "gpt-free"), ask("b", "gpt-free", depends_on=["a"])]
    result, _ = await costs.run(free, budget={"max_cost_usd": "0.000001"})
    assert result.status == "succeeded" and result.usage.cost_usd == 0


async def test_a_for_each_chunk_stops_its_items_once_its_share_is_spent(
    costs: CostStack,
) -> None:
    each = ask("each", "gpt", for_each="${{ inputs.people }}", max_parallel=1)
    each["input"]["prompt"] = "who is ${{ item }}?"
    people = ["ada", "alan", "grace", "edsger"]
    result, _ = await costs.run([each], inputs={"people": people}, budget={"max_cost_usd": 0.01})
    assert result.status == "budget_exhausted"
    step = result.steps["each"]
    # one chunk holds the whole 0.01: two items spend 0.01225, the other two are refused
    assert step.items == {"total": 4, "succeeded": 2, "failed": 2}
    assert step.outputs is not None
    codes = [e["error_code"] for e in step.outputs["errors"]]
    assert codes == ["budget_exceeded", "budget_exceeded"]
    assert step.usage.cost_usd == result.usage.cost_usd == 2 * GPT_CALL
    assert len(costs.fake.seen(costs.model("gpt"))) == 2


def _models(prices: Any) -> dict[str, Any]:
    return {"models": {"gpt": {"model": "m", "usd_per_million_tokens": prices}}}


@pytest.mark.parametrize(
    ("prices", "field", "why"),
    [
        ({"input": -1, "output": 1}, "input", "greater than or equal to 0"),
        ({"input": "0.15", "output": 1}, "input", "must be a number"),
        ({"input": 0.15, "output": True}, "output", "not boolean"),
        ({"input": 0.15}, "output", "Field required"),
        ({"input": 0.15, "output": 1, "cached": 1}, "cached", "Extra inputs"),
    ],
)
def test_a_bad_price_is_refused_at_load_naming_alias_and_field(
    tmp_path: Path, settings: Settings, prices: Any, field: str, why: str
) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(_models(prices)))
    s = settings.model_copy(update={"models_file": path})
    where = f"models.gpt.usd_per_million_tokens.{field}"
    with pytest.raises(ModelsFileError, match=why) as e:
        load_registry(s, {})
    assert where in str(e.value)
    # the worker process stops at start
    with pytest.raises(StartupError, match=where):
        build_language_model(s, {})


def test_aiworker_check_refuses_a_models_file_with_a_string_price(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(_models({"input": "cheap", "output": 1})))
    pipeline = tmp_path / "p.json"
    step = {"id": "ask", "worker": "llm-call", "input": {"prompt": "hi", "model": "gpt"}}
    pipeline.write_text(json.dumps({"name": "p", "steps": [step]}))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    proc = subprocess.run(
        [AIWORKER, "check", str(pipeline)],
        env={**base, "TEMPORAL_ADDRESS": "127.0.0.1:9", "AIWORKER_MODELS_FILE": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "models.gpt.usd_per_million_tokens.input: must be a number" in proc.stderr
    assert "not string" in proc.stderr


def test_prices_parse_exactly_and_an_alias_without_prices_costs_nothing(
    tmp_path: Path, settings: Settings
) -> None:
    path = tmp_path / "models.json"
    doc = _models({"input": 0.1, "output": 0.2})
    doc["models"]["free"] = {"model": "m"}
    path.write_text(json.dumps(doc))
    registry = load_registry(settings.model_copy(update={"models_file": path}), {})
    gpt, free = registry.get("gpt"), registry.get("free")
    assert gpt is not None and free is not None and free.prices is None
    assert gpt.prices is not None
    assert (gpt.prices.input, gpt.prices.output) == (Decimal("0.1"), Decimal("0.2"))
