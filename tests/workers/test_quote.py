"""The quote's math (workers/quote.py) over hand-made samples: unit tier."""

from __future__ import annotations

from typing import Any

from aiworker.schemas.pipeline import PipelineSpec
from aiworker.workers.quote import (
    FOR_EACH_SIZE_UNKNOWN,
    NO_PRICE,
    NO_RECORDED_CALLS,
    CallSample,
    for_each_size,
    percentile,
    quote,
)


def _spec(steps: list[dict[str, Any]], inputs: dict[str, Any] | None = None) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "steps": steps, "inputs": inputs or {}})


def _same(tokens: int, cost: float | None, dur: float, ext: int = 0) -> list[CallSample]:
    return [CallSample(tokens=tokens, external_calls=ext, cost_usd=cost, duration_s=dur)]


def test_constant_samples_multiply_over_a_literal_for_each() -> None:
    spec = _spec(
        [
            {"id": "a", "worker": "w1", "input": {}},
            {
                "id": "b",
                "worker": "w2",
                "for_each": [1, 2, 3, 4, 5],
                "max_parallel": 2,
                "depends_on": ["a"],
                "input": {},
            },
        ]
    )
    q = quote(spec, {"a": _same(100, 0.01, 2.0, ext=1), "b": _same(10, 0.001, 1.0)}, draws=50)
    assert q.items == {"a": 1, "b": 5}
    assert q.tokens.p50 == q.tokens.p95 == 150
    assert q.external_calls.p50 == 1
    assert abs(q.cost_usd.p50 - 0.015) < 1e-12
    # a: 2 s, then b: 5 items in waves of 2 -> 3 waves of 1 s
    assert q.duration_s.p50 == q.duration_s.p95 == 5.0
    assert q.unknown == []


def test_parallel_branches_take_the_longest_path() -> None:
    spec = _spec(
        [
            {"id": "a", "worker": "w", "input": {}},
            {"id": "b", "worker": "w", "input": {}},
            {"id": "c", "worker": "w", "depends_on": ["a", "b"], "input": {}},
        ]
    )
    q = quote(spec, {"a": _same(1, 0.0, 3.0), "b": _same(1, 0.0, 1.0), "c": _same(1, 0.0, 1.0)})
    assert q.duration_s.p50 == 4.0
    assert q.tokens.p50 == 3


def test_spread_samples_give_p95_above_p50_and_a_fixed_seed_repeats() -> None:
    spec = _spec([{"id": "a", "worker": "w", "for_each": list(range(4)), "input": {}}])
    samples = [CallSample(t, 0, t / 1000, t / 100) for t in (10, 20, 30, 400)]
    q1 = quote(spec, {"a": samples})
    q2 = quote(spec, {"a": samples})
    assert q1 == q2
    assert q1.tokens.p95 > q1.tokens.p50 >= 40
    assert q1.tokens.p95 <= 1600


def test_unknowns_are_listed_and_left_out() -> None:
    spec = _spec(
        [
            {"id": "a", "worker": "w1", "input": {}},
            {"id": "b", "worker": "w2", "input": {}},
            {"id": "c", "worker": "w1", "for_each": "${{ steps.a.outputs.items }}", "input": {}},
            {"id": "d", "worker": "w3", "input": {}},
        ]
    )
    q = quote(spec, {"a": _same(5, 0.5, 1.0), "c": _same(5, 0.5, 1.0), "d": _same(7, None, 1.0)})
    reasons = {(u.step, u.reason) for u in q.unknown}
    assert reasons == {("b", NO_RECORDED_CALLS), ("c", FOR_EACH_SIZE_UNKNOWN), ("d", NO_PRICE)}
    assert q.tokens.p50 == 12
    assert q.cost_usd.p50 == 0.5
    assert "no_recorded_calls" in q.text()
    assert q.as_dict()["unknown"][0]["step"] == "b"


def test_for_each_size_from_inputs() -> None:
    spec = _spec(
        [{"id": "a", "worker": "w", "for_each": "${{ inputs.urls }}", "input": {}}],
        inputs={"urls": ["x", "y"]},
    )
    assert for_each_size(spec.steps[0], spec.inputs) == 2
    assert for_each_size(spec.steps[0], {}) is None
    assert quote(spec, {"a": _same(1, 0.0, 1.0)}, inputs={"urls": [1, 2, 3]}).tokens.p50 == 3


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile(list(range(1, 101)), 95) == 95
