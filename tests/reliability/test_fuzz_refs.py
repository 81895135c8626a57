"""Fuzzing reference strings and nesting against the real server (issue 15, item 4).

Hypothesis generates (derandomized) long and nested reference strings:
unclosed openers, ``$${{`` escapes, many references in one string, templates
that amplify a large input, values nested near and past the caps. Each runs as
a real ``PipelineWorkflow`` (``support.fuzzing.outcome``) and must end in a
terminal status, or fail with ``invalid_input``/``payload_too_large``, within
a bound and with no failed workflow task; a step that fails says so with one
of the same codes (or its worker's own), never ``internal``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from hypothesis import strategies as st
from support.fuzzing import MAX_EXAMPLES, generate, outcome, show
from support.payloads import client_for, stack_settings
from temporalio.testing import WorkflowEnvironment

from aiworker.schemas.caps import Caps
from aiworker.schemas.pipeline import TerminalStatus

TERMINAL = set(get_args(TerminalStatus))
REFUSALS = {"invalid_input", "payload_too_large"}

# Pieces that join into well-formed strings, whatever their order: an escaped
# opener needs no closer, a lone "}}" or "$" is text.
good_pieces = st.sampled_from(
    [
        "$${{",
        "}}",
        "${{ inputs.x }}",
        "$${{ inputs.x }}",
        "${{ inputs.big }}",
        "${{inputs.doc}}",
        "${{ steps.a.outputs.valid }}",
        "$",
        "{",
        "text ",
    ]
)
bad_pieces = st.sampled_from(["${{", "${{ }}", "${{ inputs.missing }}", "${{ inputs.doc.a[0] }}"])


@st.composite
def reference_strings(draw: st.DrawFn) -> str:
    """A string of pieces (now and then a bad one), now and then repeated into a
    long one (up to ~500 KiB): many references, many escapes, unclosed openers."""
    parts = draw(st.lists(good_pieces, min_size=1, max_size=8))
    if draw(st.integers(0, 3)) == 0:
        parts.insert(draw(st.integers(0, len(parts))), draw(bad_pieces))
    times = draw(st.sampled_from([1, 1, 1, 2, 8, 60, 800, 3000]))
    return "".join(parts) * times


def nest(value: Any, depth: int, as_dict: bool) -> Any:
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


@st.composite
def nested_values(draw: st.DrawFn) -> Any:
    """A reference string under containers, near and past the depth caps."""
    depth = draw(st.sampled_from([0, 1, 2, 5, 30, 60, 61, 62, 63, 64, 100, 127, 128, 180]))
    return nest(draw(reference_strings()), depth, draw(st.booleans()))


@st.composite
def amplifiers(draw: st.DrawFn) -> Any:
    """A short template that repeats a large input: in one string or as whole values."""
    n = draw(st.sampled_from([1, 3, 20, 99, 400]))
    if draw(st.booleans()):
        return "-".join(["${{ inputs.big }}"] * min(n, 99))
    return ["${{ inputs.big }}"] * n


@st.composite
def ref_pipelines(draw: st.DrawFn) -> dict[str, Any]:
    big = "x" * draw(st.sampled_from([10, 64 * 1024, 256 * 1024, 256 * 1024]))
    # inputs.doc nests 3 levels more than doc_depth: 61 is at the cap of 64
    doc_depth = draw(st.sampled_from([1, 2, 10, 40, 61, 61, 62, 150]))
    data = draw(reference_strings() | nested_values() | amplifiers())
    step: dict[str, Any] = {"id": "b", "worker": "validator", "input": {"data": data, "schema": {}}}
    if draw(st.booleans()):
        step["for_each"] = draw(st.sampled_from(["${{ inputs.items }}", "${{ inputs.big }}"]))
        step["input"]["data"] = draw(
            st.sampled_from([data, "${{ item }}", "${{ item }} ${{ inputs.big }}"])
        )
    return {
        "name": "fuzz-refs",
        "inputs": {
            "x": draw(st.sampled_from([1, "x", None])),
            "big": big,
            "doc": nest({"a": [1]}, doc_depth, draw(st.booleans())),
            "items": list(range(draw(st.sampled_from([0, 3, 40])))),
        },
        "steps": [{"id": "a", "worker": "validator", "input": {"data": 1, "schema": {}}}, step],
        "output": {
            "o": draw(
                st.sampled_from(["${{ steps.b.outputs }}", "${{ inputs.x }}"]) | reference_strings()
            )
        },
    }


@pytest_asyncio.fixture
async def stored(env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stack]:
    """A stack whose converter moves large payloads to external storage, as every
    worker process's does (``data_converter(settings)``): resolved inputs up to
    the caps are larger than Temporal's own payload limit. The resolved-size cap
    is 4 MiB here, the size the generators amplify past."""
    settings = stack_settings(tmp_path, caps=Caps(max_resolved_bytes=4 << 20))
    async with running_stack(client_for(env, settings), settings) as s:
        yield s


@pytest.mark.timeout(300)
async def test_fuzzed_reference_strings_end_terminal_or_refused(stored: Stack) -> None:
    stack = stored
    cases = generate(ref_pipelines())
    assert len(cases) == MAX_EXAMPLES
    # a few at a time: cases carry up to a few MiB each
    gate = asyncio.Semaphore(8)

    async def one(raw: Any) -> tuple[str, Any, int]:
        async with gate:
            return await outcome(stack, raw)

    outcomes = await asyncio.gather(*(one(raw) for raw in cases))
    problems = []
    for raw, (status, result, task_failures) in zip(cases, outcomes, strict=True):
        codes = {s.error_code for s in result.steps.values()} if result is not None else set()
        if status not in TERMINAL | REFUSALS or task_failures or "internal" in codes:
            problems.append(f"{status}, {task_failures} failed workflow task(s): {show(raw)}")
    assert not problems, "\n".join(problems)
    # The generator reaches both sides of the checks, or it proves nothing.
    seen = {status for status, _r, _t in outcomes}
    step_codes = {s.error_code for _s, r, _t in outcomes if r is not None for s in r.steps.values()}
    assert "invalid_input" in seen
    assert seen & TERMINAL
    assert step_codes >= REFUSALS
