"""Envelopes on the wire leave out optional fields that hold an empty default,
decode to the same models, and still match the exported JSON Schemas."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from aiworker.config.catalog import builtin_spec
from aiworker.schemas.causes import ErrorCause, PipelineError
from aiworker.schemas.limits import RunConfig
from aiworker.schemas.pipeline import PipelineResult, StepResult
from aiworker.schemas.protocol import (
    ArtifactRef,
    Observability,
    RequestConstraints,
    TraceContext,
    Usage,
    WarningInfo,
    WorkerRequest,
    WorkerResponse,
)
from aiworker.schemas.spec import recorded
from aiworker.workers.client.temporal_client import data_converter

JSON_DIR = Path(__file__).parents[2] / "schemas" / "json"
TRACE = "e043bfce9f2e4ad1988ced54c1426794"

REQUEST = WorkerRequest(
    worker_id="validator",
    idempotency_key="wf/s0",
    step_id="s0",
    tenant="acme",
    trace=TraceContext(trace_id=TRACE, span_id="b2288c1c94c14a6f"),
    input={"data": {"x": 1}, "schema": {"type": "object"}},
)
RESPONSE = WorkerResponse(
    worker_id="validator",
    version="1",
    status="succeeded",
    outputs={"valid": True, "errors": []},
    observability=Observability(trace_id=TRACE, worker_id="validator", duration_ms=2.5),
)
STEP = StepResult(status="succeeded", attempts=1, duration_ms=12.5, outputs={"valid": True})
FAILED = StepResult(
    status="failed",
    attempts=2,
    error_code="timeout",
    error_message="too slow",
    usage=Usage(input_tokens=3, cost_usd=Decimal("0.01")),
    cause=[ErrorCause(code="timeout", message="too slow", attempt=2)],
)
RESULT = PipelineResult(
    status="failed",
    steps={"s0": STEP, "s1": FAILED},
    trace_id=TRACE,
    error=PipelineError(code="timeout", message="step s1: too slow", step="s1"),
)
RUN_CONFIG = RunConfig(
    specs={w: recorded(builtin_spec(w)) for w in ("validator", "web-scrape")},
    problems=[],
)
SCHEMA_OF = {
    WorkerRequest: "worker-request",
    WorkerResponse: "worker-response",
    PipelineResult: "pipeline-result",
}


def _wire(value: Any) -> dict[str, Any]:
    payload = data_converter(None).payload_converter.to_payloads([value])[0]
    return json.loads(payload.data)


def _read(doc: dict[str, Any], cls: type) -> Any:
    payload = data_converter(None).payload_converter.to_payloads([doc])[0]
    return data_converter(None).payload_converter.from_payloads([payload], [cls])[0]


def test_a_request_leaves_out_empty_defaults_and_keeps_the_rest() -> None:
    doc = _wire(REQUEST)
    # no constraints (all null), no cache, no parent span: not on the wire
    assert "constraints" not in doc and "cache" not in doc
    assert "parent_span_id" not in doc["trace"]
    # required fields and defaults that are not empty stay
    assert doc["worker_id"] == "validator" and doc["idempotency_key"] == "wf/s0"
    assert doc["version"] == "1" and doc["tenant"] == "acme"
    # a tightened constraint is written, its unset siblings are not
    tight = REQUEST.model_copy(update={"constraints": RequestConstraints(max_tokens=5)})
    assert _wire(tight)["constraints"] == {"max_tokens": 5}


def test_a_response_and_a_result_leave_out_empty_defaults() -> None:
    doc = _wire(RESPONSE)
    assert {"warnings", "artifacts", "usage", "cached"}.isdisjoint(doc)
    assert doc["observability"] == {
        "trace_id": TRACE,
        "worker_id": "validator",
        "attempt": 1,
        "duration_ms": 2.5,
    }
    doc = _wire(RESULT)
    assert doc["steps"]["s0"] == {
        "status": "succeeded",
        "attempts": 1,
        "duration_ms": 12.5,
        "outputs": {"valid": True},
    }
    assert doc["steps"]["s1"]["usage"] == {"input_tokens": 3, "cost_usd": "0.01"}
    assert doc["steps"]["s1"]["cause"] == [{"code": "timeout", "message": "too slow", "attempt": 2}]
    assert "usage" not in doc and "warnings" not in doc and "output" not in doc


def test_the_run_config_leaves_out_empty_defaults_and_keeps_what_a_run_decides_from() -> None:
    doc = _wire(RUN_CONFIG)
    # no tenant entry, no rate limits, no local workers, nothing unknown
    assert {"tenant", "rate_limited", "local", "known"}.isdisjoint(doc)
    # "checked, no problems" is not "not checked" (None, the default): it stays
    assert doc["problems"] == []
    # the caps and the for_each threshold are not empty: recorded in full
    assert doc["caps"] == RUN_CONFIG.caps.model_dump(mode="json")
    assert doc["inline_items"] == RUN_CONFIG.inline_items
    spec = doc["specs"]["validator"]
    assert {"examples", "heartbeat_seconds", "side_effects", "observability"}.isdisjoint(spec)
    assert spec["input_schema"] == RUN_CONFIG.specs["validator"].input_schema
    assert spec["retries"] == RUN_CONFIG.specs["validator"].retries.model_dump(mode="json")
    assert spec["execution"] == "local"


@pytest.mark.parametrize("value", [REQUEST, RESPONSE, STEP, FAILED, RESULT, RUN_CONFIG])
def test_compact_payloads_decode_to_the_same_model(value: Any) -> None:
    converter = data_converter(None).payload_converter
    payload = converter.to_payloads([value])[0]
    assert len(payload.data) < len(value.model_dump_json())
    assert converter.from_payloads([payload], [type(value)])[0] == value


@pytest.mark.parametrize("value", [REQUEST, RESPONSE, RESULT])
def test_compact_payloads_match_the_exported_schemas(value: Any) -> None:
    schema = json.loads((JSON_DIR / f"{SCHEMA_OF[type(value)]}.schema.json").read_text("utf-8"))
    errors = list(Draft202012Validator(schema).iter_errors(_wire(value)))
    assert errors == []


@pytest.mark.parametrize("value", [REQUEST, RESPONSE, RESULT, RUN_CONFIG])
def test_payloads_with_every_field_still_decode(value: Any) -> None:
    # as older histories, external workers and other SDKs write them
    full = value.model_dump(mode="json")
    assert _read(full, type(value)) == value


def test_other_values_are_written_as_before() -> None:
    # plain JSON and models outside the envelopes keep every field
    assert _wire({"a": None, "b": []}) == {"a": None, "b": []}
    warning = WarningInfo(code="x", message="m")
    assert _wire(warning) == {"code": "x", "message": "m", "field": None}
    ref = ArtifactRef(uri="file:///a", sha256="0" * 64, size_bytes=0)
    assert _wire(ref)["size_bytes"] == 0
