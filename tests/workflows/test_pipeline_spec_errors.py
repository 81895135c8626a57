"""A bad pipeline fails as invalid_input after one workflow task, naming the
step and field, with nothing executed."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Stack
from support import history
from support.pipelines import pipeline_result
from support.pipelines import refused as fail
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Replayer

from aiworker.workers.client.temporal_client import data_converter
from aiworker.workflows.pipeline import PipelineWorkflow

V = {"data": 1, "schema": {}}


@pytest.mark.parametrize(
    ("pipeline", "expected"),
    [
        (
            {"name": "p", "steps": [{"id": "a", "worker": "nope", "input": {}}]},
            "step 'a': field 'worker': unknown worker 'nope'",
        ),
        (
            {
                "name": "p",
                "steps": [
                    {"id": "a", "worker": "validator", "input": V},
                    {"id": "a", "worker": "validator", "input": V},
                ],
            },
            "step 'a': duplicate id",
        ),
        (
            {
                "name": "p",
                "steps": [
                    {"id": "a", "worker": "validator", "input": V, "depends_on": ["b"]},
                    {"id": "b", "worker": "validator", "input": V, "depends_on": ["a"]},
                ],
            },
            "cycle a -> b -> a",
        ),
        (
            {
                "name": "p",
                "steps": [
                    {
                        "id": "a",
                        "worker": "validator",
                        "input": {"data": "${{ steps.ghost.outputs.x }}", "schema": {}},
                    }
                ],
            },
            "step 'a': field 'input': reference steps.ghost.outputs.x names unknown step 'ghost'",
        ),
        (
            {
                "name": "p",
                "steps": [{"id": "a", "worker": "validator", "input": V, "timeout_seconds": -1}],
            },
            "step 'a': field 'timeout_seconds'",
        ),
        ({"name": "p", "steps": []}, "field 'steps'"),
        ({"steps": [{"id": "a", "worker": "validator", "input": V}]}, "field 'name'"),
        (
            {
                "name": "p",
                "steps": [
                    {
                        "id": "a",
                        "worker": "validator",
                        "input": V,
                        "when": {"value": 1, "schema": {"type": 5}},
                    }
                ],
            },
            "step 'a': field 'when.schema': invalid JSON Schema",
        ),
        (
            {
                "name": "p",
                "concurrency": {"key": "${{ steps.a.outputs.valid }}", "limit": 1},
                "steps": [{"id": "a", "worker": "validator", "input": V}],
            },
            "pipeline: field 'concurrency.key': steps.a.outputs.valid is not available "
            "before the steps run (use inputs)",
        ),
        (
            {
                "name": "p",
                "concurrency": {"key": "k", "limit": 0},
                "steps": [{"id": "a", "worker": "validator", "input": V}],
            },
            "field 'concurrency.limit'",
        ),
        ("not an object", "invalid pipeline"),
    ],
)
async def test_invalid_pipeline_fails_once_with_invalid_input(
    stack: Stack, pipeline: Any, expected: str
) -> None:
    err, h = await fail(stack, pipeline)
    assert err.type == "invalid_input"
    assert err.non_retryable
    assert expected in err.message
    assert await history.workflow_task_failures(h) == 0
    assert await history.count(h, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 0


async def test_input_failing_worker_schema_is_invalid_input_after_one_attempt(
    stack: Stack,
) -> None:
    """An input that fails its worker's schema only once its reference resolves: the
    worker refuses it, in JSON terms, after one attempt."""
    pipeline = {
        "name": "p",
        "inputs": {"schema": None},
        "steps": [
            {
                "id": "a",
                "worker": "validator",
                "input": {"data": 1, "schema": "${{ inputs.schema }}"},
            }
        ],
    }
    result = await pipeline_result(await stack.start(pipeline))
    step = result.steps["a"]
    assert result.status == "failed"
    assert step.error_code == "invalid_input"
    assert step.attempts == 1
    assert "input $.schema: null is not of type object or boolean" in (step.error_message or "")


async def test_a_misspelled_extraction_key_started_straight_through_temporal_runs_nothing(
    stack: Stack,
) -> None:
    """No CLI and no client check: the workflow's own check at start refuses ``selectr``
    (and a missing input) as ``invalid_input``, naming step, field and JSON path."""
    pipeline = {
        "name": "p",
        "inputs": {"site": "http://127.0.0.1:9/"},
        "steps": [
            {
                "id": "scrape",
                "worker": "web-scrape",
                "input": {
                    "url": "${{ inputs.sitee }}",
                    "extraction_spec": {"fields": {"price": {"selectr": ".price"}}},
                },
            }
        ],
    }
    err, h = await fail(stack, pipeline)
    assert err.type == "invalid_input" and err.non_retryable
    assert (
        "step 'scrape': field 'input.extraction_spec.fields.price.selectr': unknown key "
        "(did you mean 'selector'?)" in err.message
    )
    assert "step 'scrape': field 'input.url': inputs.sitee: inputs has no 'sitee'" in err.message
    assert await history.workflow_task_failures(h) == 0
    assert await history.count(h, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 0
    # The step inputs are checked against the recorded specs by the run config's
    # local activity: its marker is the only one (a pinned run records no patch);
    # its history replays to the same refusal.
    markers = [
        e.marker_recorded_event_attributes.marker_name
        for e in await history.events(h)
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert markers == [history.LOCAL_ACTIVITY_MARKER]
    replayed = await Replayer(
        workflows=[PipelineWorkflow], data_converter=data_converter(None)
    ).replay_workflow(await h.fetch_history())
    assert replayed.replay_failure is None
