"""Which specs a run records, and how a recorded spec comes back out of a history."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from aiworker.activities.run_config import full_check
from aiworker.config.catalog import load_specs
from aiworker.schemas.agent import AgentInput, agent_specs
from aiworker.schemas.caps import Caps
from aiworker.schemas.limits import RunConfig
from aiworker.schemas.pipeline import ChunkInput, PipelineSpec
from aiworker.schemas.pipeline_check import parse_model
from aiworker.schemas.recorded import agent_tools, named_workers, open_tools
from aiworker.schemas.spec import WorkerSpec, recorded


def _spec(steps: list[dict[str, Any]], **extra: Any) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "steps": steps, **extra})


def test_a_run_names_its_steps_fallbacks_the_validator_and_an_agents_model_and_tools() -> None:
    spec = _spec(
        [
            {"id": "a", "worker": "web-scrape", "input": {}, "fallback": "publish"},
            {
                "id": "b",
                "worker": "aggregator",
                "input": {},
                "validate": {"schema": {"type": "object"}},
            },
            {
                "id": "c",
                "worker": "llm-agent",
                "input": {
                    "prompt": "x",
                    "tools": [
                        "word-count",
                        {"worker": "${{ inputs.tool }}", "max_calls": 2},
                        "${{ steps.a.outputs.tool }}",  # known only at run time: not recorded
                    ],
                },
            },
        ],
        inputs={"tool": "text-stats"},
    )
    assert named_workers(spec) == [
        "aggregator",
        "llm-agent",
        "llm-call",
        "publish",
        "text-stats",
        "validator",
        "web-scrape",
        "word-count",
    ]


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ("${{ inputs.tools }}", (["a", "b"], True)),
        (["${{ inputs.tools[0] }}", "c"], (["a", "c"], True)),
        (["a", "${{ steps.x.outputs.tool }}"], (["a"], False)),
        ("${{ steps.x.outputs }}", ([], False)),
        (None, ([], True)),
        ([1, {"max_calls": 1}], ([], True)),
    ],
)
def test_agent_tools_resolve_references_to_the_inputs_only(
    tools: Any, expected: tuple[list[str], bool]
) -> None:
    assert agent_tools(tools, {"tools": ["a", "b"]}) == expected


def test_tools_from_a_steps_outputs_make_the_run_record_every_worker() -> None:
    def agent(tools: Any) -> PipelineSpec:
        step = {"id": "c", "worker": "llm-agent", "input": {"prompt": "x", "tools": tools}}
        return _spec([{"id": "a", "worker": "validator", "input": {}}, step])

    assert not open_tools(agent(["validator"]))
    assert open_tools(agent("${{ steps.a.outputs.tools }}"))
    assert not open_tools(_spec([{"id": "a", "worker": "validator", "input": {}}]))


def test_an_agent_child_gets_only_the_specs_it_uses() -> None:
    specs = load_specs()
    out = agent_specs(specs["llm-agent"], {"tools": ["validator", {"worker": "nope"}]}, dict(specs))
    assert sorted(out) == ["llm-agent", "llm-call", "validator"]


def test_a_recorded_spec_comes_back_equal_without_its_examples_and_unchecked() -> None:
    specs = load_specs()
    plan = RunConfig(specs={w: recorded(s) for w, s in specs.items()})
    back = RunConfig.model_validate(plan.model_dump(mode="json"))
    assert back.specs == plan.specs
    assert all(not s.examples for s in back.specs.values())
    # a recorded spec was checked when it was recorded: decoding it does not refuse
    # (nor pay for) the schema checks a spec file gets
    bad = specs["validator"].model_dump(mode="json") | {"input_schema": {"type": "nope"}}
    assert RunConfig.model_validate({"specs": {"validator": bad}}).specs[
        "validator"
    ].input_schema == {"type": "nope"}
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        WorkerSpec.model_validate(bad)
    # the chunk's and the agent's inputs decode theirs the same way
    chunk = ChunkInput.model_validate(
        {
            "step_id": "s",
            "worker": "validator",
            "key_prefix": "k",
            "tenant": "default",
            "trace_id": "t",
            "items": [],
            "max_parallel": 1,
            "spec": bad,
        }
    )
    assert chunk.spec is not None and chunk.spec.worker_id == "validator"
    agent = AgentInput.model_validate(
        {"step_id": "s", "key": "k", "tenant": "default", "trace_id": "t", "input": {}}
    )
    assert agent.specs is None  # an agent started by older code: no specs


def test_the_run_config_checks_a_pipeline_once_against_the_recorded_workers() -> None:
    raw = {
        "name": "p",
        "steps": [
            {"id": "a", "worker": "no-such", "input": {}},
            {"id": "b", "worker": "validator", "input": {"data": 1}},
        ],
    }
    caps = Caps.ceilings()
    # the workflow task parses the model only; every problem is the run config's
    assert parse_model(raw).steps[0].worker == "no-such"
    recorded = {"validator": load_specs()["validator"], "aggregator": None}
    problems = full_check(raw, recorded, caps)
    assert "step 'a': field 'worker': unknown worker 'no-such' (known: aggregator, validator)" in (
        "; ".join(problems)
    )
    # each step's input against its worker's recorded contract, in the same answer
    assert any(re.search(r"step 'b': field 'input'.*'schema'", p) for p in problems)
    cyclic = {"name": "p", "steps": [{"id": "a", "worker": "x", "depends_on": ["a"], "input": {}}]}
    assert any("cannot depend on itself" in p for p in full_check(cyclic, {"x": None}, caps))
    assert full_check({"name": "p", "steps": raw["steps"][1:2]}, recorded, caps) != []
    fine = {
        "name": "p",
        "steps": [{"id": "b", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    assert full_check(fine, recorded, caps) == []
