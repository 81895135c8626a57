"""Caps on references, nesting and fan-out through real pipelines (issue 15,
items 4 and 5): bad input ends as ``invalid_input`` or ``payload_too_large``
naming the step and field, never as a failed (and forever retried) workflow
task, and never after a child or an activity started."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack, running_stack
from support import history
from support.loopback import Exchange, serve
from support.payloads import stack_settings
from support.pipelines import pipeline_result
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from aiworker.activities.tools import scrape_tools
from aiworker.schemas import names
from aiworker.schemas.caps import Caps
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.client.client import PipelineClient

V: dict[str, Any] = {"data": 1, "schema": {}}


def nested(depth: int, leaf: Any = 1) -> Any:
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


async def failure(handle: Any) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as ei:
        await handle.result()
    cause = ei.value.cause
    assert isinstance(cause, ApplicationError)
    return cause


async def test_unclosed_openers_are_refused_once_not_rescanned(stack: Stack) -> None:
    # 600 KiB of unclosed openers: the old lazy-regex scan rescanned to the end
    # for each of the 200k openers (117 KiB took 27 s), far past the test timeout.
    text = "${{" * (200 * 1024)
    h = await stack.start(
        {"name": "p", "steps": [{"id": "a", "worker": "validator", "input": {**V, "data": text}}]}
    )
    cause = await failure(h)
    assert cause.type == "invalid_input"
    assert "step 'a': field 'input': unclosed ${{ at character 0" in str(cause)
    assert await history.workflow_task_failures(h) == 0


async def test_950_deep_input_is_invalid_input_not_a_stuck_workflow_task(stack: Stack) -> None:
    # Any client (the temporal CLI, another SDK) can send JSON that pydantic's
    # parser refuses (> ~200 levels): once a workflow task failed on it forever,
    # now the workflow fails invalid_input at once. The JSON is written out here:
    # Python's own encoder recurses too deep for it.
    doc = "[" * 950 + "1" + "]" * 950
    step = {"id": "a", "worker": "validator", "input": {"data": "${{ inputs.doc }}", "schema": {}}}
    pipeline = (
        '{"name": "deep", "inputs": {"doc": ' + doc + '}, "steps": [' + json.dumps(step) + "]}"
    )
    raw = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=pipeline.encode()))
    h = await stack.client.start_workflow(
        names.PIPELINE_WORKFLOW,
        raw,
        id=f"deep-{uuid.uuid4().hex[:8]}",
        task_queue=stack.pipelines_queue,
    )
    with pytest.raises(WorkflowFailureError) as ei:
        await h.result()
    assert isinstance(ei.value.cause, ApplicationError)
    assert ei.value.cause.type == "invalid_input"
    assert "recursion limit" in str(ei.value.cause)
    assert await history.workflow_task_failures(h) == 0


@pytest.mark.parametrize(
    ("depth", "where"),
    [
        (150, "the hard ceiling, checked at workflow start"),
        (100, "the configurable cap, checked after the plan"),
    ],
)
async def test_deep_pipeline_inputs_are_refused_before_any_step(
    stack: Stack, depth: int, where: str
) -> None:
    h = await stack.start(
        {
            "name": "deep",
            "inputs": {"doc": nested(depth)},
            "steps": [{"id": "a", "worker": "validator", "input": {"data": 1, "schema": {}}}],
        }
    )
    cause = await failure(h)
    assert cause.type == "invalid_input", where
    assert "pipeline: field 'inputs': JSON nested deeper than" in str(cause)
    assert await history.scheduled_activities(h) == []
    assert await history.workflow_task_failures(h) == 0


async def test_a_resolved_input_nested_over_the_cap_fails_its_step(stack: Stack) -> None:
    # Inputs 60 deep pass (cap 64); under 10 more levels of template they do not.
    h = await stack.start(
        {
            "name": "deep",
            "inputs": {"doc": nested(60)},
            "steps": [
                {
                    "id": "a",
                    "worker": "validator",
                    "input": {"data": nested(9, "${{ inputs.doc }}"), "schema": {}},
                }
            ],
        }
    )
    result: PipelineResult = await pipeline_result(h)
    step = result.steps["a"]
    assert (step.status, step.error_code) == ("failed", "invalid_input")
    assert "step 'a': field 'input': JSON nested deeper than 64" in (step.error_message or "")
    assert await history.scheduled_activities(h) == []
    assert await history.workflow_task_failures(h) == 0


async def test_a_template_amplifying_a_big_input_is_payload_too_large(stack: Stack) -> None:
    # Under 4 KiB of template over a 1 MiB input once produced 200 MiB; the resolver
    # counts what it produces and stops at the cap (16 MiB) before building it.
    template = [f"{i}${{{{inputs.big}}}}" for i in range(200)]
    assert len(json.dumps(template, separators=(",", ":"))) < 4096
    h = await stack.start(
        {
            "name": "amplify",
            "inputs": {"big": "x" * (1024 * 1024)},
            "steps": [
                {"id": "s", "worker": "validator", "input": {"data": template, "schema": {}}}
            ],
        }
    )
    result: PipelineResult = await pipeline_result(h)
    step = result.steps["s"]
    assert (result.status, step.status, step.error_code) == (
        "failed",
        "failed",
        "payload_too_large",
    )
    assert "step 's': field 'input': resolves to more than 16777216 bytes, the cap" in (
        step.error_message or ""
    )
    assert "AIWORKER_MAX_RESOLVED_BYTES" in (step.error_message or "")
    assert await history.scheduled_activities(h) == []
    assert await history.workflow_task_failures(h) == 0


async def test_for_each_over_the_item_cap_fails_before_any_child(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, caps=Caps(max_foreach_items=5))
    each = {
        "id": "each",
        "worker": "validator",
        "for_each": "${{ inputs.items }}",
        "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
    }
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        over = await stack.start(
            {"name": "fe", "inputs": {"items": list(range(6))}, "steps": [each]}
        )
        ok = await stack.start({"name": "fe", "inputs": {"items": list(range(5))}, "steps": [each]})
        literal = await stack.start({"name": "fe", "steps": [{**each, "for_each": list(range(6))}]})
        result: PipelineResult = await pipeline_result(over)
        step = result.steps["each"]
        assert (step.status, step.error_code) == ("failed", "invalid_input")
        assert step.error_message == (
            "step 'each': field 'for_each': 6 items; the cap is 5 (AIWORKER_MAX_FOREACH_ITEMS)"
        )
        started = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        assert await history.count(over, started) == 0
        assert await history.scheduled_activities(over) == []

        assert (await ok.result()).steps["each"].status == "succeeded"

        # A literal list over the cap: the whole pipeline, before any step.
        cause = await failure(literal)
        assert cause.type == "invalid_input"
        assert "step 'each': field 'for_each': 6 items; the cap is 5" in str(cause)
        for h in (over, ok, literal):
            assert await history.workflow_task_failures(h) == 0

    # The client checks with its own settings' caps before starting anything.
    pc = PipelineClient(client, settings)
    with pytest.raises(PipelineSpecError, match="6 items; the cap is 5"):
        await pc.start({"name": "fe", "steps": [{**each, "for_each": list(range(6))}]})


async def test_json_ld_nested_5000_deep_is_skipped_with_a_warning_not_internal(
    client: Client, tmp_path: Path
) -> None:
    # json.loads itself raised RecursionError on it, reported as a retryable internal.
    deep = "[" * 5000 + "]" * 5000
    shallow = json.dumps({"@type": "Article", "headline": "kept"})
    page = (
        "<html><head><title>T</title>"
        f'<script type="application/ld+json">{deep}</script>'
        f'<script type="application/ld+json">{json.dumps(nested(70))}</script>'
        f'<script type="application/ld+json">{shallow}</script>'
        "</head><body><h1>Hi</h1></body></html>"
    )

    def site(ex: Exchange) -> None:
        if ex.path == "/":
            ex.send(200, page.encode())
        else:
            ex.send(404)

    settings = stack_settings(tmp_path)
    tools = scrape_tools(settings)
    try:
        with serve(site) as server:
            async with running_stack(client, settings, tools=tools) as stack:
                spec = {"fields": {"h1": {"selector": "h1"}}, "metadata": True}
                h = await stack.start(
                    {
                        "name": "jsonld",
                        "steps": [
                            {
                                "id": "s",
                                "worker": "web-scrape",
                                "input": {"url": server.url("/"), "extraction_spec": spec},
                            }
                        ],
                    }
                )
                result: PipelineResult = await pipeline_result(h)
    finally:
        await tools["fetch_url"].aclose()
    step = result.steps["s"]
    assert step.status in ("succeeded", "partial"), (step.error_code, step.error_message)
    assert step.outputs["data"]["metadata"]["json_ld"] == [{"@type": "Article", "headline": "kept"}]
    skipped = [w for w in step.warnings if w["code"] == "json_ld_too_deep"]
    assert [w["field"] for w in skipped] == ["metadata.json_ld[0]", "metadata.json_ld[1]"]
    assert await history.workflow_task_failures(h) == 0
