"""The Lambda worker handler, invoked locally against the session dev server.

A fake Lambda context gives the invocation a deadline; the handler polls the
queue as a versioned worker (temporalio.contrib.aws.lambda_worker), the probe
workflow sends it one ``validator`` call (the queue's activities come from
``workers.process.task_queues.activities_for``, so the llm queue picks up llm-call the
same way), and the activity completes before the deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from deploy_probe import DeployProbeWorkflow
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.schemas import names
from aiworker.workers.process.lambda_handler import LambdaConfigError, lambda_queue, make_handler

pytestmark = pytest.mark.timeout(90)


class FakeLambdaContext:
    """The attributes of the AWS Lambda context object that the worker reads."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.time() + seconds
        self.aws_request_id = uuid.uuid4().hex
        self.invoked_function_arn = "arn:aws:lambda:eu-west-1:000000000000:function:aiworker-llm"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.time()) * 1000))


async def _make_current(client: Client, deployment: str, build_id: str) -> None:
    """Make the function's version current, as an operator does after a deploy."""
    last: Exception | None = None

    async def made_current() -> bool:
        nonlocal last
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace,
                    deployment_name=deployment,
                    build_id=build_id,
                    ignore_missing_task_queues=True,
                )
            )
            return True
        except Exception as e:  # the version exists once the handler has polled
            last = e
            return False

    await wait_until(
        made_current,
        lambda: f"{deployment}/{build_id} to become current (last error: {last})",
        timeout=10,
        interval=0.2,
    )


async def test_lambda_handler_completes_an_activity_before_the_deadline(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = f"-t{uuid.uuid4().hex[:10]}"
    deployment = f"aiworker-lambda{suffix}"
    build_id = "build-1"
    for key, value in {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
        # The llm-call worker's queue in production; the validator's queue here,
        # because its activity exists on every branch.
        "AIWORKER_TASK_QUEUES": names.PIPELINES_QUEUE,
        "AIWORKER_TASK_QUEUE_SUFFIX": suffix,
        "AIWORKER_DATA_DIR": str(tmp_path / "data"),
        "AIWORKER_METRICS_PORT": "0",
        "AIWORKER_SHUTDOWN_GRACE_SECONDS": "3",
        "AIWORKER_DEPLOYMENT_NAME": deployment,
        "AIWORKER_BUILD_ID": build_id,
    }.items():
        monkeypatch.setenv(key, value)
    handler = make_handler()
    # 5 s go to the drain (3 s) and shutdown hooks (2 s); 13 s to poll. The drain's
    # share is what a loaded machine (the suite in parallel) needs to stop a worker.
    ctx = FakeLambdaContext(18)

    def invoke() -> float:
        handler({}, ctx)
        return time.time()  # when the handler returned, not when the test resumed

    invocation = asyncio.create_task(asyncio.to_thread(invoke))

    probe_queue = f"deploy-probe{suffix}"
    async with Worker(client, task_queue=probe_queue, workflows=[DeployProbeWorkflow]):
        await _make_current(client, deployment, build_id)
        request: dict[str, Any] = {
            "worker_id": names.VALIDATOR,
            "idempotency_key": f"lambda-probe{suffix}/check",
            "tenant": "acme",
            "input": {"data": {"title": "x"}, "schema": {"type": "object"}},
        }
        handle = await client.start_workflow(
            DeployProbeWorkflow.run,
            {
                "activity": names.VALIDATOR,
                "request": request,
                "task_queue": names.PIPELINES_QUEUE + suffix,
            },
            id=f"lambda-probe{suffix}",
            task_queue=probe_queue,
        )
        result = await asyncio.wait_for(handle.result(), 30)
    returned_at = await asyncio.wait_for(invocation, 30)

    assert result["status"] == "succeeded"
    assert result["outputs"]["valid"] is True
    completed = [
        e
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert len(completed) == 1
    assert completed[0].event_time.ToDatetime().timestamp() < ctx.deadline
    started = [
        e
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    # The Lambda worker's identity is <request id>@<function ARN>.
    assert started[0].activity_task_started_event_attributes.identity == (
        f"{ctx.aws_request_id}@{ctx.invoked_function_arn}"
    )
    # The handler drained and returned inside the invocation (Lambda would kill it after).
    assert returned_at < ctx.deadline


def test_lambda_polls_one_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiworker.config.settings import Settings

    assert lambda_queue(Settings()) == names.LLM_QUEUE
    assert lambda_queue(Settings(task_queues=(names.SCRAPE_QUEUE,))) == names.SCRAPE_QUEUE
    with pytest.raises(LambdaConfigError, match="one task queue"):
        lambda_queue(Settings(task_queues=(names.SCRAPE_QUEUE, names.LLM_QUEUE)))


def test_sam_template_sets_timeout_memory_and_environment() -> None:
    import yaml
    from deploy_tools import DEPLOY

    from aiworker.config.settings import Settings

    template = yaml.safe_load((DEPLOY / "lambda" / "template.yaml").read_text())
    fn = template["Resources"]["LlmWorkerFunction"]
    assert fn["Type"] == "AWS::Serverless::Function"
    props = fn["Properties"]
    assert props["MemorySize"] >= 512
    env = props["Environment"]["Variables"]
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    settings = Settings.from_env(plain)
    assert lambda_queue(settings) == names.LLM_QUEUE
    # Timeouts nest: the function outlives the drain plus hooks, with time left to poll.
    drain = settings.shutdown_grace_seconds
    assert drain >= 60 + 5
    assert props["Timeout"] - drain - 2 >= 60
    assert props["Timeout"] <= 900
    for secret in ("AIWORKER_LLM_API_KEY", "TEMPORAL_API_KEY"):
        assert secret not in plain, f"{secret} must come from a secret store"
    assert (
        DEPLOY / "lambda" / fn["Metadata"]["Dockerfile"].removeprefix("deploy/lambda/")
    ).exists()


def test_a_function_without_a_build_id_fails_at_cold_start(tmp_path: Path) -> None:
    env = {"AIWORKER_DATA_DIR": str(tmp_path)}
    with pytest.raises(LambdaConfigError, match="AIWORKER_BUILD_ID"):
        make_handler(env)
    # Inside Lambda the function version stands in for it.
    assert callable(make_handler({**env, "AWS_LAMBDA_FUNCTION_VERSION": "7"}))
