"""What a failed run says, through ``aiworker run`` against the session's real
Temporal server: a step's error code once before its message (never
``invalid_input: invalid_input: ...``), and every error of a JSON Schema the
worker refuses at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from conftest import Stack, running_stack
from prometheus_client import CollectorRegistry
from temporalio.client import Client
from test_cli import cli_env, run_cli

from aiworker.activities.llm import LanguageModel, LlmMetrics, load_registry
from aiworker.config.settings import Settings
from aiworker.workers.client.client import PipelineClient

GPT5 = {
    "name": "alias-typo",
    "inputs": {"model": "gpt5"},
    "steps": [
        {
            "id": "ask",
            "worker": "llm-call",
            # a reference: the alias is known only when the step runs
            "input": {"model": "${{ inputs.model }}", "prompt": "hi", "max_tokens": 5},
        }
    ],
}


@pytest_asyncio.fixture
async def llm_stack(client: Client, settings: Settings, tmp_path: Path) -> AsyncIterator[Stack]:
    """Workers with one model alias, ``small``, on a port nothing answers (no call is made)."""
    models = tmp_path / "models.json"
    small = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    models.write_text(json.dumps({"models": {"small": {**small, "api_key_env": "K"}}}))
    registry = load_registry(settings.model_copy(update={"models_file": models}), {"K": "sk-x"})
    lm = LanguageModel(registry, metrics=LlmMetrics(CollectorRegistry()))
    try:
        async with running_stack(client, settings, tools={"language_model": lm}) as s:
            yield s
    finally:
        await lm.aclose()


async def test_a_failed_steps_code_comes_once_before_its_message(
    llm_stack: Stack, tmp_path: Path
) -> None:
    stack = llm_stack
    f = tmp_path / "p.json"
    f.write_text(json.dumps(GPT5))
    proc = await run_cli(["run", str(f), "--json"], cli_env(stack))
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    error, step = doc["error"], doc["steps"]["ask"]
    assert (error["code"], error["step"]) == ("invalid_input", "ask")
    assert error["message"].startswith("unknown model alias 'gpt5'"), error
    assert step["error_message"].startswith("unknown model alias 'gpt5'"), step
    assert error["cause"][0]["message"].startswith("unknown model alias 'gpt5'")
    # what a person reads: the code once
    proc = await run_cli(["run", str(f)], cli_env(stack))
    out = proc.stdout + proc.stderr
    assert "invalid_input: unknown model alias 'gpt5'" in out, out
    assert "invalid_input: invalid_input" not in out


async def test_a_pipeline_that_failed_as_a_whole_says_its_code_once(stack: Stack) -> None:
    pipelines = PipelineClient(stack.client, stack.settings)
    bad = {"name": "once-failed", "steps": [{"id": "a", "worker": "nope"}]}
    handle = await pipelines.start(bad, check=False)  # the workflow checks it, and fails
    doc = await pipelines.outcome(handle.id)
    assert doc["error_code"] == "invalid_input"
    assert doc["error"]["message"].startswith("invalid pipeline: step 'a'"), doc["error"]


BAD_SCHEMA = {"type": "objec", "properties": {"n": {"minimum": "zero"}}}


async def test_a_schema_refused_when_the_step_runs_names_every_error(
    stack: Stack, tmp_path: Path
) -> None:
    pipeline = {
        "name": "schema-errors",
        "inputs": {"schema": BAD_SCHEMA},
        "steps": [
            {
                "id": "check",
                "worker": "validator",
                # a reference: the schema is known only when the step runs
                "input": {"data": {"n": 1}, "schema": "${{ inputs.schema }}"},
            }
        ],
    }
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline))
    proc = await run_cli(["run", str(f), "--json"], cli_env(stack))
    assert proc.returncode == 1, proc.stderr
    message = json.loads(proc.stdout)["error"]["message"]
    assert message == (
        'input.schema: invalid JSON Schema at /type: "objec" is not one of '
        '["array","boolean","integer","null","number","object","string"]; '
        "invalid JSON Schema at /properties/n/minimum: "
        '"zero" is not of type number'
    )
