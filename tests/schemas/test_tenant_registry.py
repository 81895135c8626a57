"""The tenant registry file and tenant names: what is accepted, and what the errors say."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.pipeline import Budget, PipelineSpec
from aiworker.schemas.protocol import WorkerRequest
from aiworker.schemas.tenants import (
    TenantPolicy,
    TenantRegistry,
    refused_workers,
    tighten_budget,
    tighter_rate,
)

GOOD = {
    "tenants": {
        "acme": {
            "rate_limits": {"web-scrape": "60/min"},
            "concurrency": 5,
            "budget": {"max_tokens": 200000, "max_external_calls": 1000, "deadline_seconds": 3600},
            "workers": ["web-scrape", "validator", "publish"],
            "egress_allow": [".Example.com"],
            "fairness_weight": 2,
        },
        "globex": {},
    }
}

BAD_NAMES = ["Acme", "-acme", ".acme", "", "a" * 64, "ac me", "acme/x", "..", "acme\n", "é"]


def _settings(tmp_path: Path, doc: Any) -> Settings:
    path = tmp_path / "tenants.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return Settings.from_env({"AIWORKER_TENANTS_FILE": str(path)})


def test_a_tenants_file_loads_into_settings(tmp_path: Path) -> None:
    settings = _settings(tmp_path, GOOD)
    assert settings.tenants is not None
    acme = settings.tenants.policy("acme")
    assert acme is not None and acme.rate("web-scrape") == (60, 60.0)
    assert acme.egress_allow == ["example.com"]
    assert acme.may_use("publish") and not acme.may_use("llm-call")
    assert acme.fairness_weight == 2.0
    globex = settings.tenants.policy("globex")
    assert globex is not None and globex.may_use("llm-call") and globex.concurrency is None
    assert settings.tenants.policy("initech") is None
    assert Settings.from_env({}).tenants is None


@pytest.mark.parametrize(
    ("ceiling", "asked", "starts"),
    [(None, 1, 1), (None, None, None), (2, 1, 2), (2, 4, 4), (2, None, None), (4, None, 4)],
)
def test_highest_priority_caps_the_priority_a_run_starts_with(
    ceiling: int | None, asked: int | None, starts: int | None
) -> None:
    """A spec asking for more than the tenant's ceiling starts at it; a spec with no
    priority (the server's 3) too, when 3 is above the ceiling."""
    from aiworker.schemas.priority import start_priority

    registry = TenantRegistry.model_validate(
        {"tenants": {"acme": {} if ceiling is None else {"highest_priority": ceiling}}}
    )
    spec = {"name": "p", "tenant": "acme", **({} if asked is None else {"priority": asked})}
    assert start_priority(spec, registry).priority_key == starts


@pytest.mark.parametrize(
    ("doc", "names_field"),
    [
        ({"tenants": {"acme": {"concurrency": "5"}}}, "tenants.acme.concurrency"),
        ({"tenants": {"acme": {"rate_limits": {"web-scrape": "lots"}}}}, "rate_limits"),
        ({"tenants": {"acme": {"budget": {"max_tokens": -1}}}}, "tenants.acme.budget.max_tokens"),
        ({"tenants": {"acme": {"fairness_weight": 0}}}, "tenants.acme.fairness_weight"),
        ({"tenants": {"acme": {"highest_priority": 0}}}, "tenants.acme.highest_priority"),
        ({"tenants": {"acme": {"highest_priority": 6}}}, "tenants.acme.highest_priority"),
        ({"tenants": {"acme": {"egress_allow": []}}}, "tenants.acme.egress_allow"),
        ({"tenants": {"acme": {"egress_allow": ["10.0.0.1"]}}}, "takes domains"),
        ({"tenants": {"acme": {"colour": "red"}}}, "tenants.acme.colour"),
        ({"tenants": {"Acme": {}}}, "tenants.Acme"),
        ({"tenant": {}}, "tenants"),
        ("{not json", "(the whole file)"),
    ],
)
def test_a_bad_tenants_file_stops_the_process_naming_file_and_field(
    tmp_path: Path, doc: Any, names_field: str
) -> None:
    with pytest.raises(SettingsError) as e:
        _settings(tmp_path, doc)
    message = str(e.value)
    assert message.startswith("AIWORKER_TENANTS_FILE: ")
    assert str(tmp_path / "tenants.json") in message
    assert names_field in message


def test_a_missing_tenants_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"nowhere\.json: cannot read"):
        Settings.from_env({"AIWORKER_TENANTS_FILE": str(tmp_path / "nowhere.json")})


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_tenant_names_are_refused_in_specs_requests_and_registries(name: str) -> None:
    with pytest.raises(ValidationError):
        PipelineSpec.model_validate(
            {"name": "p", "tenant": name, "steps": [{"id": "a", "worker": "validator"}]}
        )
    with pytest.raises(ValidationError):
        WorkerRequest.model_validate({"worker_id": "x", "idempotency_key": "k", "tenant": name})
    with pytest.raises(ValidationError):
        TenantRegistry.model_validate({"tenants": {name: {}}})


@pytest.mark.parametrize("name", ["acme", "a", "0", "acme.eu-1_x", "a" * 63, "default"])
def test_good_tenant_names_pass(name: str) -> None:
    assert WorkerRequest(worker_id="x", idempotency_key="k", tenant=name).tenant == name


def test_the_tighter_rate_and_budget_win() -> None:
    assert tighter_rate((10, 60.0), (1, 1.0)) == (10, 60.0)
    assert tighter_rate((100, 60.0), (1, 60.0)) == (1, 60.0)
    assert tighter_rate(None, (5, 60.0)) == (5, 60.0)
    assert tighter_rate((5, 60.0), None) == (5, 60.0)
    spec = Budget(max_tokens=1000, deadline_seconds=30)
    ceiling = Budget(max_tokens=50, max_external_calls=3, deadline_seconds=600)
    assert tighten_budget(spec, ceiling) == Budget(
        max_tokens=50, max_external_calls=3, deadline_seconds=30
    )
    assert tighten_budget(spec, Budget()) == spec
    # money: the tighter of the two, exactly
    cheap = Budget(max_cost_usd="0.25")
    assert tighten_budget(Budget(max_cost_usd=1), cheap).max_cost_usd == Decimal("0.25")
    assert tighten_budget(Budget(max_cost_usd="0.1"), cheap).max_cost_usd == Decimal("0.1")
    assert tighten_budget(Budget(), cheap).max_cost_usd == Decimal("0.25")


def test_an_agents_model_and_tools_are_held_to_the_worker_list() -> None:
    """llm-call (each turn) and every tool named literally or by the pipeline's inputs;
    a tool list from a step's outputs is left to the agent, which checks it when it runs."""
    agent = {
        "id": "agent",
        "worker": "llm-agent",
        "input": {
            "prompt": "p",
            "tools": ["validator", {"worker": "publish"}, "${{ inputs.more }}"],
        },
    }
    open_ended = {
        "id": "later",
        "worker": "llm-agent",
        "input": {"prompt": "p", "tools": "${{ steps.agent.outputs.json }}"},
    }
    spec = PipelineSpec.model_validate(
        {
            "name": "a",
            "tenant": "acme",
            "inputs": {"more": "web-scrape"},
            "steps": [agent, open_ended],
        }
    )
    policy = TenantPolicy(workers=["llm-agent", "validator"])
    found = [str(p) for p in refused_workers(spec, policy)]
    turns = "(each model turn of 'llm-agent' is a call of it)"
    assert found == [
        f"step 'agent': field 'worker': tenant 'acme' may not call worker 'llm-call' {turns}",
        "step 'agent': field 'input.tools[1]': tenant 'acme' may not call worker 'publish'",
        "step 'agent': field 'input.tools[2]': tenant 'acme' may not call worker 'web-scrape'",
        f"step 'later': field 'worker': tenant 'acme' may not call worker 'llm-call' {turns}",
    ]
    assert refused_workers(spec, policy, agents=False) == []
    assert refused_workers(spec, TenantPolicy()) == []
