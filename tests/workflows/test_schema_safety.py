"""Hostile schemas through real pipelines: no ``$ref`` leaves the process, no user
pattern backtracks (issue 15, items 1 and 2).

A loopback server counts every request a schema could make; the validator
worker, ``when`` and ``validate`` get remote, ``file:`` and relative
references, catastrophic patterns (``^(a+)+$`` against 29 ``a``s and a ``b``,
seconds on Python's ``re``) and patterns RE2 refuses. Each case ends as a
terminal pipeline or ``invalid_input`` naming the step and field, with no
failed workflow task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support import history
from support.loopback import Upstream, upstream
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult

EVIL = "a" * 29 + "b"
CATASTROPHIC = "^(a+)+$"
LONG_IRI = "http://例え.jp/" + "ü" * 20_000


@pytest.fixture
def counting() -> Iterator[Upstream]:
    """A loopback server that counts every request a schema could make."""
    with upstream() as server:
        yield server


def _validator_step(schema: Any, data: Any = "x", **extra: Any) -> dict[str, Any]:
    return {
        "id": "v",
        "worker": names.VALIDATOR,
        "input": {"data": data, "schema": schema},
        **extra,
    }


async def _refused(stack: Stack, pipeline: dict[str, Any]) -> str:
    handle = await stack.start(pipeline)
    with pytest.raises(WorkflowFailureError) as e:
        await handle.result()
    cause = e.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "invalid_input"
    assert await history.workflow_task_failures(handle) == 0
    assert await history.scheduled_activities(handle) == []
    return str(cause)


async def _finished(stack: Stack, pipeline: dict[str, Any]) -> PipelineResult:
    handle = await stack.start(pipeline)
    result: PipelineResult = await handle.result()
    assert await history.workflow_task_failures(handle) == 0
    return result


async def test_remote_refs_in_literal_schemas_are_refused_before_the_run(
    stack: Stack, counting: Upstream, tmp_path: Path
) -> None:
    url = counting.base_url + "/x"
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps({"type": "integer"}))
    cases = [
        ({"steps": [_validator_step({"$ref": url})]}, "field 'input.schema'"),
        ({"steps": [_validator_step({"$ref": schema_file.as_uri()})]}, "field 'input.schema'"),
        (
            {"steps": [_validator_step({"properties": {"a": {"$ref": "other.json"}}})]},
            "field 'input.schema'",
        ),
        (
            {"steps": [_validator_step({}, when={"value": 1, "schema": {"$ref": url}})]},
            "field 'when.schema'",
        ),
        (
            {"steps": [_validator_step({}, validate={"schema": {"$id": url, "type": "object"}})]},
            "field 'validate.schema'",
        ),
    ]
    for pipeline, field in cases:
        message = await _refused(stack, {"name": "refs", **pipeline})
        assert f"step 'v': {field}" in message, message
        assert "is not local; aiworker never fetches schemas" in message
    assert counting.total == 0


async def test_a_remote_ref_reaching_the_validator_worker_is_invalid_input(
    stack: Stack, counting: Upstream, tmp_path: Path
) -> None:
    """A schema that arrives through a reference expression passes the spec check;
    the worker refuses it, once, without a request."""
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps({"type": "integer"}))
    for ref in (counting.base_url + "/x", schema_file.as_uri()):
        result = await _finished(
            stack,
            {
                "name": "refs",
                "inputs": {"schema": {"$ref": ref}},
                "steps": [_validator_step("${{ inputs.schema }}", on_failure="continue")],
            },
        )
        v = result.steps["v"]
        assert (v.status, v.error_code, v.attempts) == ("failed", "invalid_input", 1)
        assert "input.schema" in (v.error_message or "")
        assert "is not local; aiworker never fetches schemas" in (v.error_message or "")
    assert counting.total == 0


async def test_catastrophic_patterns_finish_and_refused_ones_are_invalid_input(
    stack: Stack,
) -> None:
    """``^(a+)+$`` as a validator ``pattern``, ``patternProperties`` name (with
    ``additionalProperties`` and ``unevaluatedProperties``) and ``when`` pattern,
    and a long ``format: iri`` string in both: the pipeline ends well inside its
    deadline, with no failed workflow task."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": CATASTROPHIC}},
        "patternProperties": {CATASTROPHIC: {"type": "integer"}},
        "additionalProperties": False,
    }
    unevaluated = {"patternProperties": {CATASTROPHIC: {}}, "unevaluatedProperties": False}
    result = await _finished(
        stack,
        {
            "name": "redos",
            "budget": {"deadline_seconds": 3},
            "inputs": {"s": EVIL, "iri": LONG_IRI},
            "steps": [
                _validator_step(schema, {"s": EVIL, EVIL: "x", "aaa": "not an integer"}),
                {
                    "id": "u",
                    "worker": names.VALIDATOR,
                    "input": {"data": {EVIL: 1}, "schema": unevaluated},
                },
                {
                    "id": "w",
                    "worker": names.VALIDATOR,
                    "input": {"data": 1, "schema": {}},
                    "when": {"value": "${{ inputs.s }}", "schema": {"pattern": CATASTROPHIC}},
                },
                {
                    "id": "f",
                    "worker": names.VALIDATOR,
                    "input": {"data": "(a)\\1", "schema": {"format": "regex"}},
                },
                # format iri took 7 s for 16,000 characters (a general parser)
                {
                    "id": "iri",
                    "worker": names.VALIDATOR,
                    "input": {"data": LONG_IRI, "schema": {"format": "iri"}},
                    "when": {"value": "${{ inputs.iri }}", "schema": {"format": "iri"}},
                },
            ],
        },
    )
    assert result.status == "succeeded"
    v = result.steps["v"]
    assert v.outputs is not None and v.outputs["valid"] is False
    assert {e["validator"] for e in v.outputs["errors"]} == {
        "pattern",
        "additionalProperties",
        "type",
    }
    assert result.steps["u"].outputs == {
        "valid": False,
        "errors": [
            {
                "path": "$",
                "message": f"Unevaluated properties are not allowed ({EVIL!r} was unexpected)",
                "validator": "unevaluatedProperties",
                "schema_path": "unevaluatedProperties",
            }
        ],
    }
    assert result.steps["w"].status == "skipped"
    # a backreference is data here: not a regex RE2 runs
    assert result.steps["f"].outputs is not None and result.steps["f"].outputs["valid"] is False
    assert result.steps["iri"].outputs == {"valid": True, "errors": []}

    # patterns RE2 refuses: written out, the spec check refuses them before the run;
    # through a reference, the validator worker says so, once
    bad = {"backref": {"pattern": "(a)\\1"}, "lookahead": {"patternProperties": {"(?=a)": {}}}}
    message = await _refused(
        stack,
        {
            "name": "re2",
            "steps": [{**_validator_step(schema), "id": sid} for sid, schema in bad.items()],
        },
    )
    assert "step 'backref': field 'input.schema': pattern" in message
    assert "step 'lookahead': field 'input.schema': patternProperties name" in message
    refused = await _finished(
        stack,
        {
            "name": "re2",
            "inputs": bad,
            "steps": [
                {**_validator_step(f"${{{{ inputs.{sid} }}}}"), "id": sid, "on_failure": "continue"}
                for sid in bad
            ],
        },
    )
    for step in refused.steps.values():
        assert (step.status, step.error_code, step.attempts) == ("failed", "invalid_input", 1)
        assert "input.schema" in (step.error_message or "")
        assert "RE2 (linear time, no backreferences or lookaround)" in (step.error_message or "")
    # in a `when`, evaluated inside the workflow task: refused before the run
    message = await _refused(
        stack,
        {
            "name": "re2",
            "steps": [_validator_step({}, when={"value": 1, "schema": {"pattern": "(?<=a)b"}})],
        },
    )
    assert "step 'v': field 'when.schema'" in message and "RE2" in message
