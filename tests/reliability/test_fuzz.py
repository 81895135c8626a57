"""Fuzzing pipelines and worker inputs with hypothesis, against the real server.

Hypothesis generates (derandomized, so CI sees the same cases every run)
pipeline specs — well-formed, subtly wrong and plain garbage — and
``validator`` inputs. Every case runs as a real ``PipelineWorkflow``; each
must end in a terminal status or fail with ``invalid_input``, within a bound,
and its history must hold no failed workflow task (a workflow task that
fails is retried by Temporal forever: the pipeline would hang, not fail).

The cases are generated first and then run concurrently (a few seconds for
all of them instead of one server round trip per example); a failure names
the generated JSON, ready to paste into a regression test.
"""

from __future__ import annotations

import asyncio
from typing import Any, get_args

import pytest
from conftest import Stack
from hypothesis import strategies as st
from support.fuzzing import MAX_EXAMPLES, generate, outcome, show

from aiworker.schemas import names
from aiworker.schemas.pipeline import TerminalStatus

TERMINAL = set(get_args(TerminalStatus))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
refs = st.sampled_from(
    [
        "${{ inputs.x }}",
        "${{ inputs.doc.a }}",
        "${{ inputs.missing.deep }}",
        "${{ steps.a.outputs.valid }}",
        "${{ steps.a.outputs }}",
        "${{ steps.b.status }}",
        "${{ steps.zz.outputs.x }}",
        "${{ item }}",
        "${{ }}",
        "${{ inputs",
        "$${{ inputs.x }}",
        "see ${{ inputs.x }} and ${{ steps.a.outputs.errors }}",
    ]
)
with_refs = st.recursive(
    scalars | refs,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)

schema_parts: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(
        ["object", "string", "integer", "array", "null", "bogus", ["string", "null"]]
    ),
    "required": st.lists(st.sampled_from(["a", "b", "title"]), max_size=3),
    "properties": st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.sampled_from([{"type": "string"}, {"type": "integer", "minimum": 0}, {}, {"type": 7}]),
        max_size=2,
    ),
    "minimum": st.integers(-5, 5) | st.just("x"),
    "pattern": st.sampled_from(["^a", "[0-9]+", "("]),
    "enum": st.lists(scalars, max_size=3),
    "format": st.sampled_from(["email", "uri", "date-time", "ipv4", "no-such-format"]),
    "additionalProperties": st.booleans(),
    "maxItems": st.integers(-1, 3),
}
schemas = (
    st.fixed_dictionaries({}, optional=schema_parts)
    | st.booleans()
    | st.sampled_from(["not a schema", 42, None, []])
)
validator_inputs = st.fixed_dictionaries(
    {"data": json_values, "schema": schemas},
    optional={
        "gate": st.booleans() | st.just("yes"),
        "max_errors": st.integers(-1, 2000) | st.just("x"),
        "unexpected": scalars,
    },
)

step_ids = st.sampled_from(["a", "b", "c"]) | st.sampled_from(["bad id!", "", "x" * 70])
steps = st.fixed_dictionaries(
    {"id": step_ids, "worker": st.sampled_from([names.VALIDATOR] * 4 + ["no-such-worker"])},
    optional={
        "input": validator_inputs | st.dictionaries(st.sampled_from(["data", "schema"]), with_refs),
        "depends_on": st.lists(step_ids, max_size=2),
        "gate": step_ids,
        "on_failure": st.sampled_from(["fail", "continue", "escalate", "bogus"]),
        # A review that nobody answers must still end (escalation_timed_out), soon.
        "review_timeout_seconds": st.just(1),
        "timeout_seconds": st.sampled_from([0.5, 5, -1]),
        "retry": st.sampled_from([{"max_attempts": 1}, {"max_attempts": 0}, {"tries": 2}]),
        "when": st.fixed_dictionaries({"value": refs, "schema": schemas}),
        "for_each": st.sampled_from(["${{ inputs.items }}", [1, 2], "no-ref"]),
        "max_parallel": st.integers(0, 3),
        "surprise": scalars,
    },
)
pipelines = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["fuzz"] * 4 + ["bad name!", ""]),
        "steps": st.lists(steps, max_size=4),
    },
    optional={
        "tenant": st.sampled_from(["acme", ""]),
        "inputs": st.fixed_dictionaries(
            {}, optional={"x": json_values, "doc": json_values, "items": json_values}
        ),
        "output": st.dictionaries(st.text(max_size=5), refs | scalars, max_size=2),
        "budget": st.fixed_dictionaries(
            {},
            optional={
                "max_external_calls": st.integers(-1, 3),
                "deadline_seconds": st.sampled_from([30, 0]),
            },
        ),
    },
)


@st.composite
def plausible_pipelines(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly well-formed pipelines: a small DAG of validator steps with references,
    gates, conditions, for_each, retries and every on_failure, over random data."""
    ids = ["a", "b", "c"][: draw(st.integers(1, 3))]
    out_steps = []
    for i, sid in enumerate(ids):
        earlier = ids[:i]
        data_refs = ["${{ inputs.doc }}", "${{ inputs.x }}", "${{ inputs.missing.deep }}"]
        data_refs += [f"${{{{ steps.{e}.outputs }}}}" for e in earlier]
        step: dict[str, Any] = {
            "id": sid,
            "worker": names.VALIDATOR,
            "input": {
                "data": draw(st.sampled_from(data_refs) | json_values),
                "schema": draw(schemas),
            },
        }
        if draw(st.booleans()):
            step["input"]["gate"] = draw(st.booleans())
        if earlier and draw(st.booleans()):
            step["depends_on"] = draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True))
        if earlier and draw(st.integers(0, 3)) == 0:
            step["gate"] = draw(st.sampled_from(earlier))
        step["on_failure"] = draw(st.sampled_from(["fail", "continue", "escalate"]))
        if step["on_failure"] == "escalate":
            step["review_timeout_seconds"] = 1
        if draw(st.integers(0, 4)) == 0:
            step["when"] = {"value": "${{ inputs.x }}", "schema": draw(schemas)}
        if draw(st.integers(0, 4)) == 0:
            step["for_each"] = "${{ inputs.items }}"
            step["max_parallel"] = draw(st.integers(1, 3))
            step["input"]["data"] = "${{ item }}"
        if draw(st.integers(0, 4)) == 0:
            step["retry"] = {"max_attempts": draw(st.integers(1, 3))}
        out_steps.append(step)
    output_refs = [f"${{{{ steps.{sid}.outputs.valid }}}}" for sid in ids]
    output_refs += [f"${{{{ steps.{sid}.status }}}}" for sid in ids] + ["${{ inputs.x }}"]
    return {
        "name": "fuzz",
        "tenant": "acme",
        "inputs": {
            "x": draw(json_values),
            "doc": draw(json_values),
            "items": draw(st.lists(scalars, max_size=3) | json_values),
        },
        "steps": out_steps,
        "output": {"o": draw(st.sampled_from(output_refs))},
    }


# Mostly plausible pipelines, then garbage pipelines, now and then not even an object.
pipeline_inputs = st.one_of(
    plausible_pipelines(), plausible_pipelines(), plausible_pipelines(), pipelines, json_values
)


@pytest.mark.timeout(240)
async def test_fuzzed_pipelines_end_terminal_or_invalid_input(stack: Stack) -> None:
    cases = generate(pipeline_inputs)
    assert len(cases) == MAX_EXAMPLES
    outcomes = await asyncio.gather(*(outcome(stack, raw) for raw in cases))
    problems = []
    for raw, (status, _result, task_failures) in zip(cases, outcomes, strict=True):
        if status not in TERMINAL | {"invalid_input"} or task_failures:
            problems.append(f"{status}, {task_failures} failed workflow task(s): {show(raw)}")
    assert not problems, "\n".join(problems)
    # The generator must reach both sides of the check, or it proves nothing.
    seen = {status for status, _r, _t in outcomes}
    assert "invalid_input" in seen
    assert seen & TERMINAL


@pytest.mark.timeout(240)
async def test_fuzzed_validator_inputs_never_fail_as_a_bug(stack: Stack) -> None:
    cases = generate(validator_inputs)
    outcomes = await asyncio.gather(
        *(
            outcome(
                stack,
                # Through references, so that the worker itself sees every input:
                # written literally, the pipeline check refuses the bad ones at start.
                {
                    "name": "fuzz-validator",
                    "inputs": c,
                    "steps": [
                        {
                            "id": "v",
                            "worker": names.VALIDATOR,
                            "input": {k: f"${{{{ inputs.{k} }}}}" for k in c},
                        }
                    ],
                },
            )
            for c in cases
        )
    )
    problems = []
    codes = set()
    for raw, (status, result, task_failures) in zip(cases, outcomes, strict=True):
        step = result.steps["v"] if result is not None else None
        code = step.error_code if step is not None else None
        codes.add(code)
        # A worker input is either validated (valid true/false), rejected as
        # invalid_input, or (as a gate) validation_failed; never internal. A key
        # the validator does not take is a name, not a value, so the pipeline
        # check refuses it at start (the workflow fails invalid_input, no step).
        refused_at_start = status == "invalid_input" and "unexpected" in raw
        validated = (
            step is not None
            and step.status == "succeeded"
            and isinstance((step.outputs or {}).get("valid"), bool)
        )
        refused = (
            step is not None
            and step.status == "failed"
            and code in ("invalid_input", "validation_failed")
        )
        ok = task_failures == 0 and (refused_at_start or validated or refused)
        if not ok:
            problems.append(f"{status} / {code}: {show(raw)}")
    assert not problems, "\n".join(problems)
    assert "invalid_input" in codes and None in codes
