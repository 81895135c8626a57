"""The budget ledger on its own: admission, reservations, settlement."""

from __future__ import annotations

import pytest

from schemas.pipeline import Budget
from schemas.protocol import Usage
from schemas.spec import load_specs
from workflows.budget import BudgetRefused, Ledger


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
