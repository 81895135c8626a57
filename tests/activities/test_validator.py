"""The validator worker: in-process through the runtime, and as a pipeline step."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack

from aiworker.activities.errors import InvalidInputError, ValidationFailedError
from aiworker.activities.runtime import WorkerRuntime
from aiworker.activities.validator import Validator
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings


def req(data: Any, schema: Any, **extra: Any) -> dict[str, Any]:
    return {
        "worker_id": "validator",
        "idempotency_key": "wf/check",
        "input": {"data": data, "schema": schema, **extra},
    }


@pytest.fixture
def runtime(settings: Settings) -> WorkerRuntime:
    return WorkerRuntime(settings, load_specs())


async def run(runtime: WorkerRuntime, request: dict[str, Any]) -> Any:
    return await runtime.run(Validator(), request)


async def test_valid_data(runtime: WorkerRuntime) -> None:
    resp = await run(runtime, req({"a": 1}, {"type": "object"}))
    assert resp.outputs == {"valid": True, "errors": []}


async def test_reasons_are_machine_actionable(runtime: WorkerRuntime) -> None:
    schema = {
        "type": "object",
        "required": ["title", "price"],
        "properties": {
            "price": {"type": "number"},
            "items": {"type": "array", "items": {"type": "integer"}},
        },
    }
    resp = await run(runtime, req({"price": "x", "items": [1, "two"]}, schema))
    errors = resp.outputs["errors"]
    assert resp.outputs["valid"] is False
    by_path = {e["path"]: e for e in errors}
    assert by_path["$"]["validator"] == "required"
    assert by_path["$.price"]["validator"] == "type"
    assert by_path["$.items[1]"]["schema_path"] == "properties/items/items/type"


@pytest.mark.parametrize(
    ("fmt", "bad", "good"),
    [
        ("date-time", "yesterday", "2026-11-22T10:00:00Z"),
        ("uri", "not a uri", "https://example.com/a"),
        ("email", "nobody", "a@example.com"),
    ],
)
async def test_format_checks(runtime: WorkerRuntime, fmt: str, bad: str, good: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert (await run(runtime, req(good, schema))).outputs["valid"] is True
    resp = await run(runtime, req(bad, schema))
    assert resp.outputs["valid"] is False
    assert resp.outputs["errors"][0]["validator"] == "format"


async def test_gate_mode_raises_validation_failed_with_reasons(runtime: WorkerRuntime) -> None:
    from temporalio.exceptions import ApplicationError

    with pytest.raises(ApplicationError) as ei:
        await run(runtime, req(5, {"type": "string"}, gate=True))
    assert ei.value.type == "validation_failed"
    assert ei.value.non_retryable
    assert ei.value.details[0]["reasons"][0]["validator"] == "type"
    assert isinstance(ei.value.__cause__, ValidationFailedError)


async def test_invalid_schema_is_invalid_input(runtime: WorkerRuntime) -> None:
    from temporalio.exceptions import ApplicationError

    with pytest.raises(ApplicationError) as ei:
        await run(runtime, req(1, {"type": "no-such-type"}))
    assert ei.value.type == "invalid_input"
    assert "input.schema" in ei.value.message
    assert isinstance(ei.value.__cause__, InvalidInputError)


async def test_max_errors_truncates(runtime: WorkerRuntime) -> None:
    resp = await run(runtime, req(list(range(10)), {"items": {"type": "string"}}, max_errors=3))
    assert len(resp.outputs["errors"]) == 3
    assert resp.outputs["truncated"] is True


async def test_gate_blocks_the_gated_step_in_a_pipeline(stack: Stack) -> None:
    pipeline = {
        "name": "gated",
        "inputs": {"doc": {"title": 7}},
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                "input": {
                    "data": "${{ inputs.doc }}",
                    "schema": {"properties": {"title": {"type": "string"}}},
                },
            },
            {
                "id": "after",
                "worker": "validator",
                "gate": "check",
                "input": {"data": 1, "schema": {}},
            },
        ],
    }
    result = await (await stack.start(pipeline)).result()
    assert result.steps["check"].outputs["valid"] is False
    assert result.steps["after"].status == "blocked"
    assert result.steps["after"].error_code == "validation_failed"
    assert result.steps["after"].attempts == 0
    assert result.status != "succeeded"


async def test_spec_validators_compile_once_and_still_refuse(
    runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiworker.activities import contracts as contracts_module

    compiled: list[Any] = []
    real = contracts_module.cached_validator

    def counting(schema: Any) -> Any:
        compiled.append(schema)
        return real(schema)

    monkeypatch.setattr(contracts_module, "cached_validator", counting)
    for _ in range(3):
        await run(runtime, req({"a": 1}, {"type": "object"}))
    spec = runtime.specs["validator"]
    # the spec's input and output schemas, each compiled (looked up) once
    assert compiled == [spec.input_schema, spec.output_schema]
    with pytest.raises(Exception) as ei:
        await run(runtime, {**req({"a": 1}, {"type": "object"}), "input": {"schema": {}}})
    assert getattr(ei.value, "type", None) == "invalid_input"
    assert len(compiled) == 2
