"""Fuzzing hostile JSON Schemas through real pipelines (issue 15, items 1 and 2).

Hypothesis builds (derandomized) validator schemas out of references (local,
to nothing, remote to a counting loopback server, ``file:``, relative,
malformed) and patterns (plain, catastrophic on a backtracking engine, and
ones RE2 refuses) in ``pattern``, ``patternProperties`` (with
``additionalProperties`` and ``unevaluatedProperties``) and ``format: regex``,
over data made to hurt backtracking (``a`` * 29 + ``b``). Each schema runs:

- literally, in a validator step and a ``when`` (checked before the run):
  the pipeline ends terminal or ``invalid_input``;
- through a reference expression, so the validator worker gets it: the step
  validates (``valid`` true or false) or fails ``invalid_input``.

Never a failed workflow task, never a request to the server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, get_args

import pytest
from conftest import Stack
from hypothesis import strategies as st
from support.fuzzing import MAX_EXAMPLES, generate, outcome, show
from support.loopback import upstream

from aiworker.schemas import names
from aiworker.schemas.pipeline import TerminalStatus

TERMINAL = set(get_args(TerminalStatus))
EVIL = "a" * 29 + "b"
REMOTE = "@REMOTE@"  # replaced by the counting server's address when a case runs

refs = st.sampled_from(
    [
        "#",
        "#/$defs/a",
        "#/$defs/missing",
        "#here",
        "#/properties/%%",
        f"{REMOTE}/x",
        f"{REMOTE}/x#/y",
        "file:///etc/passwd",
        "file:schema.json",
        "other.json",
        "a.json#/x",
        "//127.0.0.1/x",
        "http://[::1",
        "",
        "\x00",
    ]
) | st.sampled_from([5, None, ["#"]])
patterns = st.sampled_from(
    [
        "^a",
        "[0-9]+",
        "^(a+)+$",
        "(a|aa)+$",
        "(x+x+)+y",
        "^(a|a?)+$",
        "\\p{L}+",
        "(a)\\1",
        "(?=a)",
        "(?<!a)b",
        "\\Z",
        "[",
        "a{1001}",
        "(?P<n>a)(?P=n)",
    ]
)
leaf_schemas = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "object", "integer"]),
        "pattern": patterns,
        "format": st.sampled_from(["regex", "email"]),
        "$ref": refs,
        "$id": st.sampled_from([f"{REMOTE}/id", "#", "rel"]),
    },
)


def _composite(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {},
        optional={
            "properties": st.dictionaries(st.sampled_from(["s", EVIL, "$ref"]), inner, max_size=2),
            "patternProperties": st.dictionaries(patterns, inner, max_size=2),
            "additionalProperties": st.booleans() | inner,
            "unevaluatedProperties": st.booleans(),
            "items": inner,
            "$defs": st.fixed_dictionaries({"a": inner}),
            "allOf": st.lists(inner, max_size=2),
            "$anchor": st.just("here"),
        },
    )


schemas = st.recursive(leaf_schemas | st.booleans(), _composite, max_leaves=6)
data = st.recursive(
    st.sampled_from([EVIL, "a" * 40, "aaa", "x", "(a)\\1", "^(a+)+$", 1, None]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["s", EVIL, "aaa", "$ref"]), inner, max_size=3)
    ),
    max_leaves=6,
)
cases = st.tuples(schemas, data)


def _aimed(value: Any, base: str) -> Any:
    return json.loads(json.dumps(value).replace(REMOTE, base))


def _literal(schema: Any, value: Any) -> dict[str, Any]:
    return {
        "name": "fuzz-schemas",
        "inputs": {"v": value},
        "steps": [
            {"id": "v", "worker": names.VALIDATOR, "input": {"data": value, "schema": schema}},
            {
                "id": "w",
                "worker": names.VALIDATOR,
                "input": {"data": 1, "schema": {}},
                "when": {"value": "${{ inputs.v }}", "schema": schema},
            },
        ],
    }


def _referenced(schema: Any, value: Any) -> dict[str, Any]:
    return {
        "name": "fuzz-schemas",
        "inputs": {"schema": schema, "v": value},
        "steps": [
            {
                "id": "v",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.v }}", "schema": "${{ inputs.schema }}"},
                "on_failure": "continue",
            }
        ],
    }


@pytest.mark.timeout(240)
async def test_fuzzed_schemas_fetch_nothing_and_never_stall(stack: Stack) -> None:
    generated = generate(cases)
    assert len(generated) == MAX_EXAMPLES
    with upstream() as server:
        aimed = [_aimed(c, server.base_url) for c in generated]
        literal = await asyncio.gather(*(outcome(stack, _literal(s, v)) for s, v in aimed))
        referenced = await asyncio.gather(*(outcome(stack, _referenced(s, v)) for s, v in aimed))
    problems = []
    for (schema, value), (status, _r, failures) in zip(aimed, literal, strict=True):
        if status not in TERMINAL | {"invalid_input"} or failures:
            problems.append(
                f"literal: {status}, {failures} failed task(s): {show([schema, value])}"
            )
    codes: set[str | None] = set()
    for (schema, value), (status, result, failures) in zip(aimed, referenced, strict=True):
        step = result.steps.get("v") if result is not None else None
        code = step.error_code if step is not None else None
        codes.add(code)
        ok = (
            failures == 0
            and step is not None
            and (
                (step.status == "succeeded" and isinstance((step.outputs or {}).get("valid"), bool))
                or (step.status == "failed" and code == "invalid_input" and step.attempts == 1)
            )
        )
        if not ok:
            problems.append(f"referenced: {status} / {code}: {show([schema, value])}")
    assert not problems, "\n".join(problems)
    assert server.total == 0
    # the generator reaches both sides: refused schemas and applied ones
    assert {"invalid_input"} <= {s for s, _r, _f in literal} and TERMINAL & {
        s for s, _r, _f in literal
    }
    assert "invalid_input" in codes and None in codes
