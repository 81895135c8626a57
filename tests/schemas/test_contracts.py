"""The published contracts: exported JSON Schemas, error table, worker specs,
activity options derived from specs, settings validation."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings, SettingsError
from aiworker.schemas.errors import NON_RETRYABLE_CODES, RETRYABLE, ErrorCode, is_retryable
from aiworker.schemas.export import MODELS, check, export, render
from aiworker.schemas.options import activity_options
from aiworker.schemas.protocol import RequestConstraints, WorkerRequest
from aiworker.schemas.spec import WorkerSpec


def test_exported_json_schemas_match_the_models() -> None:
    assert check() == [], "run `aiworker schemas export` and commit schemas/json/"


def test_drift_is_detected(tmp_path: Path) -> None:
    export(tmp_path)
    assert check(tmp_path) == []
    p = tmp_path / "worker-request.schema.json"
    doc = json.loads(p.read_text())
    doc["properties"].pop("tenant")
    p.write_text(json.dumps(doc))
    assert any("worker-request" in d for d in check(tmp_path))
    assert render(MODELS["worker-request"]) != p.read_text()


def test_error_table_is_complete_and_stable() -> None:
    assert set(RETRYABLE) == set(ErrorCode)
    retryable = {c.value for c in ErrorCode if is_retryable(c)}
    assert retryable == {
        "timeout",
        "rate_limited",
        "circuit_open",
        "fetch_timeout",
        "fetch_failed",
        "upstream_error",
        "internal",
    }
    assert set(NON_RETRYABLE_CODES) == {c.value for c in ErrorCode} - retryable


def test_every_shipped_spec_loads_and_derives_options() -> None:
    specs = load_specs()
    assert "validator" in specs
    for spec in specs.values():
        opts = activity_options(spec, queue_suffix="-x")
        assert opts["task_queue"] == spec.task_queue + "-x"
        assert opts["start_to_close_timeout"] > timedelta(seconds=spec.constraints.timeout_seconds)
        rp = opts["retry_policy"]
        assert rp.maximum_attempts == spec.retries.max_attempts
        assert set(rp.non_retryable_error_types or []) == set(NON_RETRYABLE_CODES)


def test_options_only_tighten() -> None:
    spec = load_specs()["validator"]
    opts = activity_options(
        spec, constraints=RequestConstraints(timeout_seconds=1), max_attempts=99
    )
    assert opts["retry_policy"].maximum_attempts == spec.retries.max_attempts
    assert opts["start_to_close_timeout"] < timedelta(seconds=spec.constraints.timeout_seconds + 5)


def test_spec_with_invalid_schema_is_rejected() -> None:
    raw = load_specs()["validator"].model_dump()
    raw["input_schema"] = {"type": "wrong"}
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        WorkerSpec.model_validate(raw)


def test_request_trace_ids_are_w3c() -> None:
    base = {"worker_id": "validator", "idempotency_key": "k"}
    WorkerRequest.model_validate({**base, "trace": {"trace_id": "a" * 32, "span_id": "b" * 16}})
    with pytest.raises(ValueError, match="trace_id"):
        WorkerRequest.model_validate({**base, "trace": {"trace_id": "0" * 32, "span_id": "b" * 16}})
    with pytest.raises(ValueError, match="extra"):
        WorkerRequest.model_validate({**base, "surprise": 1})


def test_settings_from_env(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            # its own data dir: a dev stack's (./.aiworker, after `make demo`) holds a
            # registry secret, which would be one more secret here
            "AIWORKER_DATA_DIR": str(tmp_path / "data"),
            "AIWORKER_TASK_QUEUES": "aiworker-scrape, aiworker-llm",
            "AIWORKER_ALLOW_PRIVATE_NETWORKS": "yes",
            "AIWORKER_RATE_LIMITS": "web-scrape:acme=600/min,llm-call:*=60/min",
            "AIWORKER_LLM_API_KEY": "sk-secret-value",
            "PATH": "/bin",
        }
    )
    assert s.task_queues == ("aiworker-scrape", "aiworker-llm")
    assert s.allow_private_networks is True
    assert [(r.worker_id, r.tenant, r.limit, r.period_seconds) for r in s.rate_limits] == [
        ("web-scrape", "acme", 600, 60.0),
        ("llm-call", "*", 60, 60.0),
    ]
    assert "sk-secret-value" not in repr(s)
    assert s.secret_values() == ["sk-secret-value"]


async def test_breaker_settings_default_and_tune_both_registries() -> None:
    from aiworker.workers.process.resources import build_tools

    defaults = Settings.from_env({})
    assert (
        defaults.breaker_failure_threshold,
        defaults.breaker_window_seconds,
        defaults.breaker_open_seconds,
    ) == (5, 60.0, 30.0)
    tuned = Settings.from_env(
        {
            "AIWORKER_BREAKER_FAILURE_THRESHOLD": "2",
            "AIWORKER_BREAKER_WINDOW_SECONDS": "10",
            "AIWORKER_BREAKER_OPEN_SECONDS": "8.5",
            "AIWORKER_LLM_BASE_URL": "http://127.0.0.1:1/v1",
            "AIWORKER_LLM_MODEL": "m",
        }
    )
    tools = build_tools(tuned)
    host = tools["fetch_url"].breakers
    provider = tools["language_model"].breakers
    for registry, kind in ((host, "host"), (provider, "provider")):
        assert registry.kind == kind
        assert (
            registry.failure_threshold,
            registry.window_seconds,
            registry.open_seconds,
        ) == (2, 10.0, 8.5)
        assert registry.shared is not None  # openings are shared with other processes
    for tool in tools.values():
        if hasattr(tool, "aclose"):
            await tool.aclose()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AIWORKER_METRICS_PORT": "x"}, "AIWORKER_METRICS_PORT"),
        ({"AIWORKER_ALLOW_PRIVATE_NETWORKS": "maybe"}, "AIWORKER_ALLOW_PRIVATE_NETWORKS"),
        ({"AIWORKER_RATE_LIMITS": "web-scrape=10"}, "AIWORKER_RATE_LIMITS"),
        ({"AIWORKER_LLM_PROVIDER": "acme-ai"}, "AIWORKER_LLM_PROVIDER"),
        ({"AIWORKER_TYPO": "1"}, "AIWORKER_TYPO: unknown setting"),
        ({"AIWORKER_EGRESS_ALLOW": "10.0.0.1"}, "takes domains"),
        ({"AIWORKER_BREAKER_FAILURE_THRESHOLD": "0"}, "AIWORKER_BREAKER_FAILURE_THRESHOLD: .*1"),
        ({"AIWORKER_BREAKER_FAILURE_THRESHOLD": "2.5"}, "AIWORKER_BREAKER_FAILURE_THRESHOLD"),
        ({"AIWORKER_BREAKER_WINDOW_SECONDS": "-1"}, "AIWORKER_BREAKER_WINDOW_SECONDS"),
        ({"AIWORKER_BREAKER_OPEN_SECONDS": "soon"}, "AIWORKER_BREAKER_OPEN_SECONDS"),
        ({"AIWORKER_BREAKER_OPEN_SECONDS": "inf"}, "AIWORKER_BREAKER_OPEN_SECONDS: .*finite"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_llm_call_takes_every_reason_the_validator_can_give_as_feedback() -> None:
    # The validation loop hands the validator's reasons to the next attempt; an
    # input schema that took fewer would turn a long rejection into invalid_input.
    from jsonschema import Draft202012Validator

    from aiworker.workflows.calls import with_feedback

    specs = load_specs()
    most = specs["validator"].input_schema["properties"]["max_errors"]["maximum"]
    reasons = [{"path": f"$.items[{i}]", "message": "is not a number"} for i in range(most)]
    retry = with_feedback({"prompt": "List the prices."}, "feedback", reasons)
    errors = list(Draft202012Validator(specs["llm-call"].input_schema).iter_errors(retry))
    assert errors == []
