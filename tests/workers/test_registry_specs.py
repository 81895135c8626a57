"""A run records the live registry's spec of a worker its pipelines process
lacks (issue #28): the process that runs pipelines knows only the built-ins,
another process serves ``remote-count`` on its own queue and publishes it; the
run's plan records that spec and calls the worker there, under the rate limit
the spec declares. With nothing
published, the same pipeline is refused at start naming the worker."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any

import pytest
from conftest import running_stack
from module_workers import SPEC as WORD_COUNT
from module_workers import WordCount
from support.registry import entry
from temporalio.client import Client, WorkflowFailureError

from aiworker.config.catalog import Catalog, CatalogEntry
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.process.live_registry import publishing
from aiworker.workers.process.worker_set import WorkerSet

REMOTE_QUEUE = "aiworker-remote"
REMOTE_SPEC = WORD_COUNT | {
    "worker_id": "remote-count",
    "task_queue": REMOTE_QUEUE,
    # a limit far above demand: the call asks the limiter, and is granted at once
    "constraints": WORD_COUNT["constraints"] | {"rate_limit": "6000/min"},
}


class RemoteCount(WordCount):
    spec = REMOTE_SPEC


PIPELINE: dict[str, Any] = {
    "name": "remote",
    "inputs": {"text": "three short words"},
    "steps": [{"id": "count", "worker": "remote-count", "input": {"text": "${{ inputs.text }}"}}],
    "output": {"words": "${{ steps.count.outputs.words }}"},
}


def remote_set() -> WorkerSet:
    worker = RemoteCount()
    return WorkerSet(
        Catalog([CatalogEntry(worker.spec, "module test")]),
        MappingProxyType({worker.worker_id: worker}),
    )


async def test_a_run_records_the_registry_spec_of_a_worker_another_process_serves(
    client: Client, settings: Settings
) -> None:
    published = entry("remote@test", specs={"remote-count": REMOTE_SPEC})
    async with (
        running_stack(client, settings) as pipelines,  # the built-ins only
        running_stack(client, settings, workers=remote_set(), queues=[REMOTE_QUEUE]),
        publishing(client, settings, published) as publisher,
    ):
        await asyncio.wait_for(publisher.publish_once(), 30)
        handle = await pipelines.start(PIPELINE)
        result = await handle.result()
        assert isinstance(result, PipelineResult)
        assert result.status == "succeeded", result
        assert result.output == {"words": 3}
        # the spec the run recorded is the registry's: the call went to its queue
        history = await handle.fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        assert [(s.activity_type.name, s.task_queue.name) for s in scheduled] == [
            ("remote-count", settings.queue(REMOTE_QUEUE))
        ]
        assert WorkerSpec.model_validate(REMOTE_SPEC).task_queue == REMOTE_QUEUE
        # the published spec's rate limit holds too: the call went through its limiter
        limiter = names.limiter_workflow_id("rate:remote-count:default", settings.task_queue_suffix)
        described = await client.get_workflow_handle(limiter).describe()
        assert described.workflow_type == names.LIMITER_WORKFLOW


async def test_a_worker_nobody_publishes_is_refused_at_start(
    client: Client, settings: Settings
) -> None:
    async with running_stack(client, settings) as pipelines:
        handle = await pipelines.start(PIPELINE)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert getattr(cause, "type", None) == "invalid_input"
    assert "unknown worker 'remote-count'" in str(cause)
    assert names.VALIDATOR in str(cause)  # the known list is named
