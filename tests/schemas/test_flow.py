"""The pipeline's ``flow`` field at check time (one mode, bounds, a key into inputs)
and the key's resolution at start time (nothing, too long, safe workflow ids)."""

from __future__ import annotations

from typing import Any

import pytest

from aiworker.config.catalog import load_specs
from aiworker.schemas.flow import (
    MAX_KEY_CHARS,
    Flow,
    FlowKeyError,
    flow_workflow_id,
    key_id_part,
    resolve_key,
)
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline

SPECS = dict(load_specs())
STEP = {
    "id": "s",
    "worker": "web-scrape",
    "input": {"url": "${{ inputs.site }}", "extraction_spec": {"fields": {"title": "h1"}}},
}


def check(flow: Any) -> list[str]:
    raw = {
        "name": "p",
        "inputs": {"site": "https://shop.example/", "customer": "c1"},
        "steps": [STEP],
        "flow": flow,
    }
    try:
        parse_pipeline(raw, SPECS)
    except PipelineSpecError as e:
        return e.problems
    return []


@pytest.mark.parametrize(
    "flow",
    [
        {"key": "${{ inputs.customer }}", "debounce": {"seconds": 5, "max_wait_seconds": 60}},
        {"key": "${{ inputs.customer }}", "debounce": {"seconds": 5, "inputs": "all"}},
        {"key": "${{ inputs.customer }}", "batch": {"max_items": 10, "max_seconds": 30}},
        {"key": "${{ inputs.customer }}", "singleton": "refuse"},
        {"key": "${{ inputs.customer }}", "throttle": {"max_starts": 2, "period_seconds": 60}},
    ],
)
def test_each_mode_passes_check(flow: dict[str, Any]) -> None:
    assert check(flow) == []


@pytest.mark.parametrize(
    ("flow", "says"),
    [
        (
            {
                "key": "${{ inputs.customer }}",
                "singleton": "wait",
                "batch": {"max_items": 2, "max_seconds": 1},
            },
            "exactly one of",
        ),
        ({"key": "${{ inputs.customer }}"}, "got none"),
        ({"singleton": "wait"}, "key"),
        ({"key": "${{ inputs.customer }}", "debounce": {"seconds": 0}}, "seconds"),
        ({"key": "${{ inputs.customer }}", "debounce": {"seconds": 90_000}}, "seconds"),
        (
            {"key": "${{ inputs.customer }}", "debounce": {"seconds": 10, "max_wait_seconds": 5}},
            "below seconds",
        ),
        (
            {"key": "${{ inputs.customer }}", "batch": {"max_items": 1, "max_seconds": 5}},
            "max_items",
        ),
        (
            {"key": "${{ inputs.customer }}", "batch": {"max_items": 5000, "max_seconds": 5}},
            "max_items",
        ),
        (
            {"key": "${{ inputs.customer }}", "throttle": {"max_starts": 0, "period_seconds": 5}},
            "max_starts",
        ),
        ({"key": "${{ inputs.customer }}", "singleton": "sometimes"}, "singleton"),
        ({"key": "${{ steps.s.outputs.title }}", "singleton": "wait"}, "use inputs"),
        ({"key": "${{ inputs.nope }}", "singleton": "wait"}, "nope"),
    ],
)
def test_check_refuses_bad_flow(flow: dict[str, Any], says: str) -> None:
    problems = check(flow)
    assert problems, flow
    assert any(says in p for p in problems), problems
    assert any("flow" in p for p in problems), problems


def flow(key: str = "${{ inputs.customer }}") -> Flow:
    return Flow.model_validate({"key": key, "singleton": "refuse"})


def test_key_resolves_from_inputs() -> None:
    assert resolve_key(flow(), {"customer": "c1"}) == "c1"
    assert resolve_key(flow(), {"customer": 7}) == "7"
    assert resolve_key(flow("${{ inputs.c }}"), {"c": {"b": 1, "a": 2}}) == '{"a": 2, "b": 1}'


@pytest.mark.parametrize(
    "inputs",
    [
        {},
        {"customer": None},
        {"customer": ""},
        {"customer": []},
        {"customer": "x" * (MAX_KEY_CHARS + 1)},
    ],
)
def test_key_that_resolves_to_nothing_or_too_much_is_bad_input(inputs: dict[str, Any]) -> None:
    with pytest.raises(FlowKeyError):
        resolve_key(flow(), inputs)


def test_key_at_the_cap_is_accepted() -> None:
    assert len(resolve_key(flow(), {"customer": "x" * MAX_KEY_CHARS})) == MAX_KEY_CHARS


def test_workflow_id_part_is_safe() -> None:
    assert key_id_part("acme-1") == "acme-1"
    odd = key_id_part("a/b c")
    assert odd.startswith("h-") and len(odd) == 34
    assert key_id_part("a/b c") != key_id_part("a/b d")
    assert key_id_part("x" * 65).startswith("h-")
    assert key_id_part("h-abc") != "h-abc"
    assert flow_workflow_id("t1", "p", "acme-1") == "flow/t1/p/acme-1"
    assert flow_workflow_id("t1", "p", "acme-1", "-x") == "flow-x/t1/p/acme-1"


@pytest.mark.parametrize(
    ("flow", "problem"),
    [
        ({"batch": {"max_items": 2, "max_seconds": 5}}, False),
        ({"debounce": {"seconds": 5, "inputs": "all"}}, False),
        ({"debounce": {"seconds": 5}}, True),
        ({"singleton": "wait"}, True),
    ],
)
def test_inputs_starts_checks_only_under_a_collecting_flow(
    flow: dict[str, Any], problem: bool
) -> None:
    """A batch run gets every start's inputs as ``inputs.starts``: its references
    check; in a pipeline that does not collect they name an input that is not there."""
    step = {**STEP, "input": {**STEP["input"], "url": "${{ inputs.starts.0.site }}"}}
    raw = {
        "name": "p",
        "inputs": {"site": "https://shop.example/", "customer": "c1"},
        "steps": [step],
        "flow": {"key": "${{ inputs.customer }}", **flow},
    }
    try:
        parse_pipeline(raw, SPECS)
        problems: list[str] = []
    except PipelineSpecError as e:
        problems = e.problems
    assert bool(problems) == problem, problems
    if problem:
        assert any("inputs.starts" in p for p in problems), problems
