"""Flow control at the shared start path (PipelineClient.start) on the real dev server.

No worker polls the test's fresh queue, so a started run stays running and holds
its key for the whole test: no timing is involved.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from test_cli import address, run_cli

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.flow import flow_workflow_id
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.flow_start import FlowRefusedError, lands_if_sent_again


def _pipeline(name: str, customer: Any, flow: dict[str, Any] | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "tenant": "acme",
        "inputs": {"customer": customer, "doc": {"title": "t"}},
        "steps": [
            {
                "id": "check",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.doc }}", "schema": {"required": ["title"]}},
            }
        ],
    }
    if flow is not None:
        raw["flow"] = {"key": "${{ inputs.customer }}", **flow}
    return raw


async def test_singleton_refuse_refuses_a_second_start_for_the_same_key(
    client: Client, settings: Settings
) -> None:
    pc = PipelineClient(client, settings)
    name = f"flow-{uuid.uuid4().hex[:8]}"
    flow = {"singleton": "refuse"}
    first = await pc.start(_pipeline(name, "c1", flow), check=False)
    try:
        assert first.id == f"flow{settings.task_queue_suffix}/acme/{name}/c1"
        with pytest.raises(FlowRefusedError) as refused:
            await pc.start(_pipeline(name, "c1", flow), check=False)
        assert refused.value.workflow_id == first.id
        assert refused.value.run_id == first.result_run_id
        assert "holds flow key 'c1'" in str(refused.value)
        other = await pc.start(_pipeline(name, "c2", flow), check=False)
        assert other.id == f"flow{settings.task_queue_suffix}/acme/{name}/c2"
        await other.terminate("test over")
    finally:
        await first.terminate("test over")


@pytest.mark.parametrize("customer", [None, "", "x" * 201])
async def test_a_key_that_resolves_to_nothing_or_too_much_starts_nothing(
    client: Client, settings: Settings, customer: Any
) -> None:
    pc = PipelineClient(client, settings)
    with pytest.raises(PipelineSpecError, match=r"flow\.key"):
        await pc.start(_pipeline("flow-bad", customer, {"singleton": "refuse"}), check=False)


async def test_aiworker_run_prints_the_refusal_and_exits_2(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """The real CLI process; the held run has no worker, so it holds the key."""
    pc = PipelineClient(client, settings)
    name = f"flow-{uuid.uuid4().hex[:8]}"
    pipeline = _pipeline(name, "c1", {"singleton": "refuse"})
    held = await pc.start(pipeline, check=False)
    try:
        f = tmp_path / "p.json"
        f.write_text(json.dumps(pipeline))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
        env["TEMPORAL_ADDRESS"] = address(client)
        env["AIWORKER_TASK_QUEUE_SUFFIX"] = settings.task_queue_suffix
        proc = await run_cli(["run", str(f)], env)
        assert proc.returncode == 2, proc.stderr
        assert f"refused: run {held.id} holds flow key 'c1'" in proc.stderr
        assert "(flow_refused)" in proc.stderr
    finally:
        await held.terminate("test over")


async def test_aiworker_run_says_what_flow_control_did_with_each_start(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """The real CLI process, a debounce of a day: the first start is queued, the
    second collapsed into the same run; with --no-wait stdout keeps the run's id."""
    name = f"flow-{uuid.uuid4().hex[:8]}"
    pipeline = _pipeline(name, "c1", {"debounce": {"seconds": 86_400}})
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = address(client)
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = settings.task_queue_suffix
    fid = flow_workflow_id("acme", name, "c1", settings.task_queue_suffix)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        try:
            first = await run_cli(["run", "--no-wait", str(f)], env)
            assert first.returncode == 0, first.stderr
            wid = first.stdout.strip()
            assert wid.startswith(fid + "/")
            assert f"{name}: queued as {wid} (debounce: starts once key 'c1'" in first.stderr
            second = await run_cli(["run", "--no-wait", str(f)], env)
            assert second.returncode == 0, second.stderr
            assert second.stdout.strip() == wid
            assert f"{name}: collapsed into {wid} (debounce:" in second.stderr
            assert "2 starts so far" in second.stderr
        finally:
            await client.get_workflow_handle(fid).terminate("test over")


async def test_aiworker_run_waits_for_a_queued_run_then_follows_it(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """A one-second debounce: `aiworker run` says the start was queued, waits for the
    run to start, then follows it to its outcome (plain lines, and --json)."""
    name = f"flow-{uuid.uuid4().hex[:8]}"
    f = tmp_path / "p.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = address(client)
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = settings.task_queue_suffix
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        f.write_text(json.dumps(_pipeline(name, "c1", {"debounce": {"seconds": 1}})))
        plain = await run_cli(["run", str(f)], env)
        assert plain.returncode == 0, plain.stderr
        lines = plain.stdout.splitlines()
        queued = re.fullmatch(rf"{name}: queued as (\S+) \(debounce: .*\)", lines[0])
        assert queued is not None, lines[0]
        assert lines[1].startswith(f"{name}: started {queued.group(1)}")
        assert "succeeded" in plain.stdout
        f.write_text(json.dumps(_pipeline(name, "c2", {"debounce": {"seconds": 1}})))
        as_json = await run_cli(["run", "--json", str(f)], env)
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        assert doc["status"] == "succeeded" and "/c2/" in doc["workflow_id"]
        assert f"{name}: queued as {doc['workflow_id']}" in as_json.stderr


# What the server answers a start's update-with-start that did not land (messages as
# temporalio/temporal spells them), and whether sending it again with its update id
# lands it. The dev-server tests in tests/workflows/test_flow_workflow.py provoke the
# races themselves; this table pins the reading of each answer.
SENT_AGAIN = [
    (RPCError("workflow update was aborted", RPCStatusCode.UNAVAILABLE, b""), True),
    (
        RPCError(
            "workflow operation can not be applied because workflow is closing",
            RPCStatusCode.RESOURCE_EXHAUSTED,
            b"",
        ),
        True,
    ),
    (RPCError("too many outstanding updates", RPCStatusCode.RESOURCE_EXHAUSTED, b""), True),
    (
        RPCError("workflow update was aborted by closing workflow", RPCStatusCode.NOT_FOUND, b""),
        True,
    ),
    (RPCError("Update-with-Start could not be executed.", RPCStatusCode.ABORTED, b""), True),
    (
        WorkflowUpdateFailedError(
            ApplicationError(
                "Workflow Update failed because the Workflow completed before the Update "
                "completed.",
                type="AcceptedUpdateCompletedWorkflow",
                non_retryable=True,
            )
        ),
        True,
    ),
    (RPCError("Namespace acme is not found.", RPCStatusCode.NOT_FOUND, b""), False),
    (RPCError("bad request", RPCStatusCode.INVALID_ARGUMENT, b""), False),
    (
        RPCError(
            "Unable to perform workflow execution update due to unexpected workflow task failure.",
            RPCStatusCode.FAILED_PRECONDITION,
            b"",
        ),
        False,
    ),
    (RPCError("request unauthorized", RPCStatusCode.PERMISSION_DENIED, b""), False),
    (
        WorkflowUpdateFailedError(
            ApplicationError("queue full", type="flow_refused", non_retryable=True)
        ),
        False,
    ),
    (
        WorkflowUpdateFailedError(
            ApplicationError("internal error", type="internal", non_retryable=True)
        ),
        False,
    ),
    (WorkflowUpdateRPCTimeoutOrCancelledError(), False),
    (ValueError("not from Temporal"), False),
]


@pytest.mark.parametrize(("error", "lands"), SENT_AGAIN, ids=lambda v: repr(v)[:60])
def test_which_answers_a_start_is_sent_again_after(error: BaseException, lands: bool) -> None:
    assert lands_if_sent_again(error) is lands
