"""The budget ledger on its own: admission, reservations, settlement."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from conftest import running_stack
from support.standins import registered
from temporalio.client import Client

from aiworker.activities.errors import UpstreamError
from aiworker.activities.runtime import WorkerContext, WorkerResult
from aiworker.activities.validator import Validator
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import Budget
from aiworker.schemas.protocol import Usage
from aiworker.workflows.budget import BudgetRefused, Ledger


def test_parallel_steps_reserve_their_share_and_never_overspend() -> None:
    publish = load_specs()["publish"]  # may make at most 1 external call
    ledger = Ledger(Budget(max_external_calls=2), started_at=0.0)
    a = ledger.admit(publish, now=1.0)
    b = ledger.admit(publish, now=1.0)
    assert (a.max_external_calls, b.max_external_calls) == (1, 1)
    with pytest.raises(BudgetRefused) as e:
        ledger.admit(publish, now=1.0)
    assert e.value.resource == "external_calls"
    ledger.settle(a, Usage())  # used nothing: its share comes back
    assert ledger.admit(publish, now=1.0).max_external_calls == 1


def test_tokens_left_become_the_request_limit() -> None:
    llm = load_specs()["llm-call"]
    validator = load_specs()["validator"]  # allows no tokens: never refused for tokens
    ledger = Ledger(Budget(max_tokens=1000), started_at=0.0)
    first = ledger.admit(llm, now=0.0)
    assert first.max_tokens == min(1000, llm.constraints.max_tokens or 1000)
    ledger.settle(first, Usage(input_tokens=600, output_tokens=400))
    with pytest.raises(BudgetRefused) as e:
        ledger.admit(llm, now=0.0)
    assert e.value.resource == "tokens"
    assert ledger.admit(validator, now=0.0).max_tokens is None
    assert ledger.view()["tokens_left"] == 0


def test_spent_money_refuses_steps_that_may_use_tokens_and_sums_exactly() -> None:
    llm = load_specs()["llm-call"]
    validator = load_specs()["validator"]  # allows no tokens: costs nothing, never refused
    ledger = Ledger(Budget(max_cost_usd=Decimal("0.3")), started_at=0.0)
    for _ in range(3):  # 0.1 three times is 0.3 exactly (as floats it would be 0.30000000000000004)
        ledger.settle(ledger.admit(llm, now=0.0), Usage(cost_usd=Decimal("0.1")))
    assert ledger.used.cost_usd == Decimal("0.3")
    with pytest.raises(BudgetRefused) as e:
        ledger.admit(llm, now=0.0)
    assert e.value.resource == "cost_usd"
    assert e.value.message == "cost budget of 0.3 USD is spent (0.3 USD used)"
    assert ledger.admit(validator, now=0.0).cost_usd == 0
    assert ledger.view()["cost_usd_left"] == "0"
    assert ledger.view()["used"]["cost_usd"] == "0.3"  # type: ignore[index]


def test_deadline_refuses_and_caps_the_timeout() -> None:
    validator = load_specs()["validator"]
    ledger = Ledger(Budget(deadline_seconds=30), started_at=100.0)
    assert ledger.admit(validator, now=125.0).timeout_seconds == pytest.approx(5.0)
    assert (
        ledger.admit(validator, now=100.0).timeout_seconds == validator.constraints.timeout_seconds
    )
    with pytest.raises(BudgetRefused) as e:
        ledger.admit(validator, now=130.0)
    assert e.value.resource == "deadline"


class _SpendsThenFailsOnce(Validator):
    """Bills tokens on every attempt; the first attempt then fails (retryable)."""

    async def execute(self, ctx: WorkerContext, input: dict[str, Any]) -> WorkerResult:  # noqa: A002 (Worker.execute's documented signature)
        ctx.spend(100, 20)
        if ctx.attempt == 1:
            raise UpstreamError("the provider dropped the connection after billing")
        return WorkerResult(outputs={"valid": True, "errors": []}, input_tokens=100)


async def test_failed_attempts_usage_is_booked_across_retries(
    client: Client, settings: Settings
) -> None:
    pipeline = {
        "name": "spend",
        "budget": {"max_tokens": 10_000},
        "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    with registered(_SpendsThenFailsOnce()):
        async with running_stack(client, settings) as stack:
            handle = await stack.start(pipeline)
            result = await asyncio.wait_for(handle.result(), 60)
    step = result.steps["v"]
    assert (result.status, step.attempts) == ("succeeded", 2)
    # both attempts' tokens: the first one's came to the second through Temporal
    assert (step.usage.input_tokens, step.usage.output_tokens) == (200, 40)
    assert result.usage == step.usage
    assert step.outputs == {"valid": True, "errors": []}
