"""AiworkerPlugin on a user's own Client and Worker, against the dev server."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence

from conftest import running_stack
from embed_user import UserGreeting, user_shout
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import aiworker
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import CheckedPayloadConverter
from aiworker.workers.process.plugin import AiworkerPlugin
from aiworker.workers.process.task_queues import all_queues
from aiworker.workers.process.worker_set import builtin_set


class UserInterceptor(Interceptor):
    """A user's own worker interceptor: the plugin must keep it."""


def _pipeline(name: str) -> dict[str, object]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"doc": {"title": "t"}},
        "steps": [
            {
                "id": "check",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.doc }}", "schema": {"required": ["title"]}},
            }
        ],
        "output": {"valid": "${{ steps.check.outputs.valid }}"},
    }


async def test_a_user_worker_with_the_plugin_runs_a_pipeline_and_its_own_workflow(
    env: WorkflowEnvironment, client: Client, settings: Settings
) -> None:
    plugin = AiworkerPlugin(settings)
    config = client.config()
    config["plugins"] = [plugin]
    user_client = Client(**config)
    user_worker = Worker(
        user_client,
        task_queue=plugin.task_queue,
        workflows=[UserGreeting],
        activities=[user_shout],
    )
    others = [
        q for q in all_queues(plugin.runtime.specs, builtin_set()) if q != names.PIPELINES_QUEUE
    ]
    async with running_stack(client, settings, queues=others), user_worker:
        pipelines = aiworker.PipelineClient(user_client, settings)
        handle = await pipelines.start(_pipeline("embed"))
        greeting = user_client.execute_workflow(
            UserGreeting.run,
            "ada",
            id=f"greet-{uuid.uuid4().hex[:8]}",
            task_queue=plugin.task_queue,
        )
        result, greeted = await asyncio.gather(handle.result(), greeting)
    assert result.status == "succeeded"
    assert result.output == {"valid": True}
    assert greeted == "HELLO ADA!"


async def test_the_plugin_appends_to_a_users_worker_settings(
    client: Client, settings: Settings
) -> None:
    plugin = AiworkerPlugin(settings)
    config = client.config()
    config["plugins"] = [plugin]
    user_client = Client(**config)
    mine = UserInterceptor()
    worker = Worker(
        user_client,
        task_queue=plugin.task_queue,
        workflows=[UserGreeting],
        activities=[user_shout],
        interceptors=[mine],
    )
    wconfig = worker.config(active_config=True)
    interceptors = list(wconfig.get("interceptors") or [])
    assert mine in interceptors
    # the plugin's telemetry interceptor sits on the client (the SDK hands a client's
    # worker interceptors to every Worker built from it), beside the user's own
    on_client = list(user_client.config(active_config=True).get("interceptors", [])) + interceptors
    assert any(type(i).__name__ == "CallTelemetryInterceptor" for i in on_client)
    workflows = list(wconfig.get("workflows") or [])
    assert UserGreeting in workflows and len(workflows) > 1
    activities = list(wconfig.get("activities") or [])
    assert user_shout in activities and len(activities) > 1
    runner = wconfig.get("workflow_runner")
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert "aiworker.workflows.steps" in runner.restrictions.passthrough_modules
    # aiworker's converter is on the user's client
    assert user_client.data_converter.payload_converter_class is CheckedPayloadConverter


class _Tag(PayloadCodec):
    """A user's payload codec (stands in for encryption): the plugin must keep it."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={**p.metadata, "tag": b"1"}, data=p.data) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


async def test_the_plugin_keeps_a_users_payload_codec(client: Client, settings: Settings) -> None:
    codec = _Tag()
    config = client.config()
    config["data_converter"] = dataclasses.replace(DataConverter.default, payload_codec=codec)
    config["plugins"] = [AiworkerPlugin(settings)]
    user_client = Client(**config)
    assert user_client.data_converter.payload_codec is codec
    assert user_client.data_converter.payload_converter_class is CheckedPayloadConverter
