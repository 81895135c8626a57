"""Traces, logs and secrets of a pipeline run, against the session's real dev server."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from opentelemetry.trace import StatusCode
from pydantic import SecretStr
from support import history
from support.pipelines import one_step_pipeline, pipeline_result
from telemetry_helpers import (  # noqa: F401 - pytest fixtures
    SPANS,
    flaky_validator,
    hex_trace,
    tclient,
    telemetry,
    workflow_id,
)
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.cli import main as cli
from aiworker.workers.process.logs import JsonFormatter, Redactor

SECRET = "sk-live-9f8e7d6c5b4a3210fedcba"


def _by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


async def test_one_trace_from_client_start_to_each_activity_attempt(
    tclient: Client, settings: Settings
) -> None:
    SPANS.clear()
    async with running_stack(
        tclient, settings, replace_activities={names.VALIDATOR: flaky_validator(settings)}
    ) as stack:
        handle = await stack.start(one_step_pipeline(), id=workflow_id("traced"))
        result = await handle.result()
    assert result.status == "succeeded"
    assert result.steps["check"].attempts == 2

    starts = [
        s
        for s in _by_name(SPANS.get_finished_spans(), f"StartWorkflow:{names.PIPELINE_WORKFLOW}")
        if s.attributes.get("temporalWorkflowID") == handle.id
    ]
    assert len(starts) == 1
    root = starts[0]
    assert root.parent is None
    trace_id = root.context.trace_id
    spans = [s for s in SPANS.get_finished_spans() if s.context.trace_id == trace_id]

    # The result names the same trace that the client started.
    assert result.trace_id == hex_trace(root)

    (run_wf,) = _by_name(spans, f"RunWorkflow:{names.PIPELINE_WORKFLOW}")
    assert run_wf.parent.span_id == root.context.span_id
    (start_act,) = _by_name(spans, f"StartActivity:{names.VALIDATOR}")
    assert start_act.parent.span_id == root.context.span_id

    # One SDK span per attempt, both under the workflow's StartActivity span ...
    run_acts = _by_name(spans, f"RunActivity:{names.VALIDATOR}")
    assert len(run_acts) == 2
    assert {s.parent.span_id for s in run_acts} == {start_act.context.span_id}

    # ... and one runtime span per attempt under each of them.
    attempts = sorted(_by_name(spans, f"worker {names.VALIDATOR}"), key=lambda s: s.start_time)
    assert [s.attributes["aiworker.attempt"] for s in attempts] == [1, 2]
    assert [s.parent.span_id for s in attempts] == [
        s.context.span_id for s in sorted(run_acts, key=lambda s: s.start_time)
    ]
    first, second = attempts
    assert first.attributes["aiworker.error_code"] == "upstream_error"
    assert first.status.status_code is StatusCode.ERROR
    assert "aiworker.error_code" not in second.attributes
    for s in attempts:
        assert s.attributes["aiworker.worker_id"] == names.VALIDATOR
        assert s.attributes["aiworker.tenant"] == "acme"
        assert s.attributes["aiworker.workflow_id"] == handle.id
    # Spans a worker opens with ctx.span() sit inside its attempt.
    upstream = sorted(_by_name(spans, "upstream call"), key=lambda s: s.start_time)
    assert [s.parent.span_id for s in upstream] == [s.context.span_id for s in attempts]
    assert [s.attributes["aiworker.http_status"] for s in upstream] == [503, 200]
    assert upstream[0].attributes["aiworker.target"] == "models.example"
    # The runtime's own validation steps are spans inside the attempt.
    validations = [s for s in spans if s.name.startswith("validate ")]
    assert {s.parent.span_id for s in validations} <= {s.context.span_id for s in attempts}

    # The worker response carries the ids of the attempt's span (the validator runs as
    # a local activity: its reply is in the marker, its spans as an activity's are).
    (response,) = history.worker_replies(await history.events(handle))
    assert response["observability"]["trace_id"] == hex_trace(root)
    assert response["observability"]["span_id"] == format(second.context.span_id, "016x")
    assert response["observability"]["attempt"] == 2


async def test_log_lines_are_json_with_trace_ids_and_no_secret(
    tclient: Client, settings: Settings
) -> None:
    # an activity, not a local one: its failed attempt is then an event of the history
    update = {"llm_api_key": SecretStr(SECRET), "local_activities": False}
    settings = settings.model_copy(update=update)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter(Redactor(settings.secret_values())))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        async with running_stack(
            tclient,
            settings,
            replace_activities={names.VALIDATOR: flaky_validator(settings, leak=SECRET)},
        ) as stack:
            handle = await stack.start(one_step_pipeline("leaky"), id=workflow_id("leaky"))
            result = await handle.result()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert result.status == "succeeded"

    text = buf.getvalue()
    assert SECRET not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines, "the run logged nothing"
    for doc in lines:
        assert {"ts", "level", "event", "logger"} <= doc.keys(), doc
    ours = [d for d in lines if d.get("workflow_id") == handle.id]
    # The runtime's line per attempt, plus the stand-in's own lines on attempt 1.
    calls = [d for d in ours if d.get("event") == "worker_call"]
    assert [d["attempt"] for d in calls] == [1, 2]
    stable = {
        "ts",
        "level",
        "event",
        "worker_id",
        "attempt",
        "duration_ms",
        "status",
        "trace_id",
        "span_id",
        "workflow_id",
        "run_id",
        "activity_id",
        "tenant",
        "idempotency_key",
    }
    for d in calls:
        assert stable <= d.keys(), stable - d.keys()
    assert calls[0]["error_code"] == "upstream_error"
    assert calls[0]["status"] == "failed" and calls[1]["status"] == "succeeded"
    for d in ours:
        assert d.get("trace_id") == result.trace_id, d
        assert len(d["span_id"]) == 16
    leaked = [d for d in lines if "[REDACTED]" in json.dumps(d)]
    assert len(leaked) >= 3, "the stand-in's lines quoting the key were not captured"

    # The failed attempt's message and details reach history, redacted.
    events = (await handle.fetch_history()).events
    blob = b"".join(e.SerializeToString() for e in events)
    assert SECRET.encode() not in blob
    assert b"upstream refused key [REDACTED]" in blob


def test_formatter_maps_temporal_extras_and_redacts() -> None:
    fmt = JsonFormatter(Redactor([SECRET, 'pa"ss\\word']))
    logger = logging.getLogger("temporalio.activity")
    record = logger.makeRecord(
        "temporalio.activity",
        logging.WARNING,
        __file__,
        1,
        "Completing activity as failed: Authorization: Bearer abcdef123456 and %s",
        (SECRET,),
        None,
        extra={
            "temporal_activity": {
                "activity_id": "7",
                "attempt": 3,
                "workflow_id": "wf",
                "workflow_run_id": "run",
            },
            "aiworker": {"password_field": 'pa"ss\\word'},
        },
    )
    line = fmt.format(record)
    doc = json.loads(line)
    assert doc["workflow_id"] == "wf" and doc["run_id"] == "run"
    assert doc["activity_id"] == "7" and doc["attempt"] == 3
    assert doc["level"] == "warning"
    assert SECRET not in line and "abcdef123456" not in line and "ss\\\\word" not in line
    assert doc["password_field"] == "[REDACTED]"
    assert "Authorization: [REDACTED]" in doc["event"]


@contextlib.contextmanager
def cli_logging_restored() -> Iterator[None]:
    """The CLI configures the root logger for its process: put the test's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)


async def test_aiworker_run_roots_the_pipeline_trace(
    tclient: Client,
    env: WorkflowEnvironment,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline = tmp_path / "pipeline.json"
    pipeline.write_text(json.dumps(one_step_pipeline("from-cli")))
    monkeypatch.setenv("AIWORKER_TASK_QUEUE_SUFFIX", settings.task_queue_suffix)
    SPANS.clear()
    with cli_logging_restored():
        async with running_stack(tclient, settings):
            # `aiworker run` owns its event loop; give it a thread of its own.
            code = await asyncio.to_thread(
                cli.main,
                [
                    "run",
                    str(pipeline),
                    "--json",
                    "--address",
                    env.client.service_client.config.target_host,
                ],
            )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "succeeded"
    spans = cli_rooted_trace("aiworker run from-cli", doc)
    assert len(_by_name(spans, f"RunActivity:{names.VALIDATOR}")) == 1
    assert len(_by_name(spans, f"worker {names.VALIDATOR}")) == 1


def cli_rooted_trace(root: str, result: dict[str, Any]) -> list[Any]:
    """The spans of the trace a CLI command's span ``root`` began; it started the
    workflow and the pipeline result names it."""
    (cli_span,) = _by_name(SPANS.get_finished_spans(), root)
    # Under the command's own span (workers.cli.command_span), the trace's root.
    (command,) = [
        s for s in SPANS.get_finished_spans() if s.context.span_id == cli_span.parent.span_id
    ]
    assert command.parent is None
    assert command.name == "aiworker " + root.split()[1]
    assert "process.exit.code" in command.attributes
    assert result["trace_id"] == hex_trace(cli_span)
    spans = [
        s for s in SPANS.get_finished_spans() if s.context.trace_id == cli_span.context.trace_id
    ]
    (start,) = _by_name(spans, f"StartWorkflow:{names.PIPELINE_WORKFLOW}")
    assert start.parent.span_id == cli_span.context.span_id
    return spans


async def test_models_file_keys_are_redacted_in_logs_and_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys that only the models file names (env var or key file) are secrets too."""
    import uuid

    from aiworker.workers.process.resources import build_runtime, close_connections

    env_key, file_key = (f"sk-{kind}-{uuid.uuid4().hex}" for kind in ("env", "file"))
    monkeypatch.setenv("AIW_TEST_MODELS_KEY", env_key)
    (tmp_path / "key").write_text(file_key + "\n")
    models = tmp_path / "models.json"
    models.write_text(
        json.dumps(
            {
                "models": {
                    "default": {"model": "m", "api_key_env": "AIW_TEST_MODELS_KEY"},
                    "claude": {
                        "model": "c",
                        "provider": "anthropic",
                        "api_key_file": str(tmp_path / "key"),
                    },
                }
            }
        )
    )
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter(Redactor()))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        runtime = build_runtime(Settings(models_file=models, data_dir=tmp_path / "data"))
        logging.getLogger("aiworker.test").warning("calling with %s and %s", env_key, file_key)
    finally:
        root.removeHandler(handler)
        await close_connections()
    line = json.loads(buf.getvalue().splitlines()[-1])
    assert env_key not in buf.getvalue() and file_key not in buf.getvalue()
    assert line["event"] == "calling with [REDACTED] and [REDACTED]"
    # and failures headed for workflow history
    assert runtime.redactor(f"401 for key {env_key}") == "401 for key [REDACTED]"
    assert runtime.redactor.contains_secret(file_key)


async def test_aiworker_redrive_roots_the_new_runs_trace(
    tclient: Client,
    env: WorkflowEnvironment,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``redrive`` (like ``review``) starts its work under a span of its own."""
    failing = one_step_pipeline("redriven")
    # A schema that is not one, through a reference (a literal one is refused at
    # start): the worker answers invalid_input and the run fails.
    failing["inputs"]["bad"] = 5
    failing["steps"][0]["input"] = {"data": 1, "schema": "${{ inputs.bad }}"}
    monkeypatch.setenv("AIWORKER_TASK_QUEUE_SUFFIX", settings.task_queue_suffix)
    SPANS.clear()
    with cli_logging_restored():
        async with running_stack(tclient, settings) as stack:
            first = await stack.start(failing, id=workflow_id("redriven"))
            assert (await pipeline_result(first)).status == "failed"
            code = await asyncio.to_thread(
                cli.main,
                [
                    "redrive",
                    first.id,
                    "--json",
                    "--address",
                    env.client.service_client.config.target_host,
                ],
            )
    assert code == 1  # the redriven run fails the same way
    doc = json.loads(capsys.readouterr().out)
    spans = cli_rooted_trace(f"aiworker redrive {first.id}", doc)
    assert len(_by_name(spans, f"worker {names.VALIDATOR}")) == 1
