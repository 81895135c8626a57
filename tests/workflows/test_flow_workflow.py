"""The keyed flow workflow (workflows/flow.py) against real Temporal servers.

Timed modes run on the time-skipping server (``ts_env``): the test moves its
clock (``ts_env.sleep``) past a quiet period or a deadline, so no test waits for
real time; the server has no search attributes, so starts go through
:func:`~aiworker.workers.client.flow_start.submit` with ``search_attributes=False``
(what ``PipelineClient.start`` calls with them on). The answers a caller sees
through ``PipelineClient.start`` are tested on the dev server with periods long
enough that nothing fires during the test.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from unittest.mock import ANY

import pytest
from conftest import running_stack
from google.protobuf.any_pb2 import Any as Any_
from support.waiting import wait_until
from temporalio.api.command.v1 import (
    Command,
    ContinueAsNewWorkflowExecutionCommandAttributes,
    ProtocolMessageCommandAttributes,
)
from temporalio.api.enums.v1 import CommandType, TaskQueueKind
from temporalio.api.protocol.v1 import Message
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.update.v1 import Acceptance
from temporalio.api.update.v1 import Request as UpdateRequest
from temporalio.api.workflowservice.v1 import (
    PollWorkflowTaskQueueRequest,
    RespondWorkflowTaskCompletedRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import flow_state, names
from aiworker.schemas.flow import flow_workflow_id
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.flow_start import (
    FlowHandle,
    FlowRefusedError,
    plan_flow_start,
    submit,
    wait_started,
)


def pipeline(name: str, flow: dict[str, Any], n: int, customer: str = "c1") -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"customer": customer, "n": n},
        "steps": [
            {
                "id": "check",
                "worker": names.VALIDATOR,
                "input": {"data": "${{ inputs.n }}", "schema": {"type": "integer"}},
            }
        ],
        "flow": {"key": "${{ inputs.customer }}", **flow},
    }


async def ts_start(env: WorkflowEnvironment, settings: Settings, raw: dict[str, Any]) -> FlowHandle:
    """A start as PipelineClient.start makes it, without search attributes."""
    plan = plan_flow_start(raw, settings.task_queue_suffix)
    assert plan is not None
    return await submit(
        env.client,
        raw,
        plan,
        task_queue=settings.queue(names.PIPELINES_QUEUE),
        search_attributes=False,
    )


async def started_inputs(client: Client, settings: Settings, handle: FlowHandle) -> Any:
    await asyncio.wait_for(wait_started(handle, poll_seconds=0.05), 30)
    raw = await PipelineClient(client, settings).started_input(handle.id)
    assert raw is not None
    return raw["inputs"]


@asynccontextmanager
async def flow_stack(client: Client, settings: Settings, name: str) -> AsyncIterator[str]:
    """Workers on the pipelines queue; the key c1's flow workflow id; at the end the
    flow workflow is ended (its idle timer would stop time for later tests)."""
    fid = flow_workflow_id("acme", name, "c1", settings.task_queue_suffix)
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        try:
            yield fid
        finally:
            handle = client.get_workflow_handle(fid)
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test over")


async def test_debounce_collapses_starts_into_one_run_with_the_last_input(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 600, "max_wait_seconds": 3600}}
    async with flow_stack(ts_env.client, settings, name) as fid:
        answers = [await ts_start(ts_env, settings, pipeline(name, flow, n)) for n in range(3)]
        assert [a.flow.status for a in answers] == ["queued", "collapsed", "collapsed"]
        assert {a.id for a in answers} == {answers[0].id}
        assert answers[0].id.startswith(fid + "/")
        assert answers[2].flow.starts == 3 and answers[2].flow.flow_workflow_id == fid
        state = await ts_env.client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
        assert state["pending"][0]["workflow_id"] == answers[0].id
        assert state["pending"][0]["starts"] == 3
        await ts_env.sleep(timedelta(seconds=601))
        assert await started_inputs(ts_env.client, settings, answers[2]) == {
            "customer": "c1",
            "n": 2,
        }
        result = await asyncio.wait_for(answers[0].result(), 60)
        assert result.status == "succeeded"
        desc = await answers[0].describe()
        assert desc.parent_id == fid  # the UI links the run to the flow that started it
        state = await ts_env.client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
        assert state["pending"] == [] and state["started"] == 1 and state["collapsed"] == 2
        # the next start after the run started opens a new one
        later = await ts_start(ts_env, settings, pipeline(name, flow, 9))
        assert later.flow.status == "queued" and later.id != answers[0].id


async def test_debounce_max_wait_starts_a_run_while_starts_keep_coming(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 600, "max_wait_seconds": 1000}}
    async with flow_stack(ts_env.client, settings, name):
        first = await ts_start(ts_env, settings, pipeline(name, flow, 0))
        for n in (1, 2):
            await ts_env.sleep(timedelta(seconds=400))  # never quiet 600 s
            again = await ts_start(ts_env, settings, pipeline(name, flow, n))
            assert again.flow.status == "collapsed" and again.id == first.id
        await ts_env.sleep(timedelta(seconds=250))  # past the maximum wait, not quiet yet
        assert await started_inputs(ts_env.client, settings, first) == {"customer": "c1", "n": 2}


async def test_debounce_inputs_all_gives_the_run_every_start(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 60, "inputs": "all"}}
    async with flow_stack(ts_env.client, settings, name):
        handles = [await ts_start(ts_env, settings, pipeline(name, flow, n)) for n in range(3)]
        await ts_env.sleep(timedelta(seconds=61))
        inputs = await started_inputs(ts_env.client, settings, handles[0])
        assert inputs["n"] == 2
        assert inputs["starts"] == [{"customer": "c1", "n": n} for n in range(3)]
        assert (await asyncio.wait_for(handles[0].result(), 60)).status == "succeeded"


async def test_pipeline_client_start_answers_collapsed_into_the_same_run(
    client: Client, settings: Settings
) -> None:
    """On the dev server, through the shared start path: a day's quiet period, so
    nothing starts during the test; the flow workflow shows why in the UI."""
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 86_400}}
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name) as fid:
        first = await pc.start(pipeline(name, flow, 1), check=False)
        second = await pc.start(pipeline(name, flow, 2), check=False)
        other = await pc.start(pipeline(name, flow, 3, customer="c2"), check=False)
        try:
            assert isinstance(first, FlowHandle) and isinstance(second, FlowHandle)
            assert first.flow.status == "queued" and second.flow.status == "collapsed"
            assert second.id == first.id and first.flow.flow_workflow_id == fid
            assert "quiet 86400 s" in first.flow.reason
            assert isinstance(other, FlowHandle) and other.flow.status == "queued"
            assert other.flow.flow_workflow_id != fid  # another key, another flow workflow
            desc = await client.get_workflow_handle(fid).describe()
            assert desc.workflow_type == names.FLOW_WORKFLOW
            assert desc.typed_search_attributes.get(names.PIPELINE_KEY) == name
            meta = await client.get_workflow_handle(fid).query("__temporal_workflow_metadata")
            details = meta.current_details
            assert "**flow** debounce" in details and first.id in details
        finally:
            await client.get_workflow_handle(other.flow.flow_workflow_id).terminate("test over")


async def _continued(client: Client, workflow_id: str) -> bool:
    """Whether the workflow's current run was continued from another."""
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events(page_size=1):
        attrs = event.workflow_execution_started_event_attributes
        return bool(attrs.continued_execution_run_id)
    return False


async def test_the_flow_workflow_continues_as_new_carrying_what_is_pending(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """History stays bounded: past its cap (lowered here) the flow workflow continues
    as new with the open run and every collected start, and goes on answering.
    A burst of starts at once, past the server's 10 updates in flight per workflow
    and across continue-as-new, is sent again until each is answered: none lost."""
    monkeypatch.setattr(flow_state, "MAX_HISTORY_EVENTS", 20)
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 86_400, "inputs": "all"}}
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name) as fid:
        handles = [await pc.start(pipeline(name, flow, n), check=False) for n in range(8)]
        assert await _continued(client, fid)
        handles += await asyncio.gather(
            *(pc.start(pipeline(name, flow, n), check=False) for n in range(8, 120))
        )
        assert {h.id for h in handles} == {handles[0].id}
        state = await client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
        assert state["pending"] == [{"workflow_id": handles[0].id, "starts": 120, "starts_at": ANY}]
        assert state["collapsed"] == 119 and state["queued"] == 1


async def test_a_start_sent_again_after_continue_as_new_gets_its_answer_not_a_count(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start whose run continued as new before its answer came back is sent again
    with the same update id: the next run answers it as the first did."""
    monkeypatch.setattr(flow_state, "MAX_HISTORY_EVENTS", 20)
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 86_400, "inputs": "all"}}
    raw = pipeline(name, flow, 0)
    plan = plan_flow_start(raw, settings.task_queue_suffix)
    assert plan is not None
    queue = settings.queue(names.PIPELINES_QUEUE)
    async with flow_stack(client, settings, name) as fid:
        first = await submit(client, raw, plan, task_queue=queue, update_id="start-once")
        for n in range(1, 8):  # past the lowered cap: the flow workflow continues as new
            await submit(client, pipeline(name, flow, n), plan, task_queue=queue)
        assert await _continued(client, fid)
        again = await submit(client, raw, plan, task_queue=queue, update_id="start-once")
        assert again.flow == first.flow
        state = await client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
        assert state["pending"] == [{"workflow_id": first.id, "starts": 8, "starts_at": ANY}]


async def test_starts_racing_continue_as_new_are_each_answered_and_counted_once(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its cap lowered to 20 events, the flow workflow continues as new every few
    starts while 60 starts reach it at once: starts arrive at a run that is closing
    (the server aborts them) or past the server's 10 updates in flight, and each is
    sent again with its update id until it lands. Every start gets one answer and
    is counted once: the answers' counts are 1..60, no gap and no repeat."""
    monkeypatch.setattr(flow_state, "MAX_HISTORY_EVENTS", 20)
    name = f"deb-{uuid.uuid4().hex[:6]}"
    flow = {"debounce": {"seconds": 86_400}}
    starts = 60
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name) as fid:
        handles = await asyncio.gather(
            *(pc.start(pipeline(name, flow, n), check=False) for n in range(starts))
        )
        answers = [h.flow for h in handles if isinstance(h, FlowHandle)]
        assert len(answers) == starts
        assert sorted(a.starts for a in answers) == list(range(1, starts + 1))
        assert [a.status for a in answers].count("queued") == 1
        assert {a.workflow_id for a in answers} == {answers[0].workflow_id}
        assert await _continued(client, fid)
        state = await client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
        assert state["pending"] == [
            {"workflow_id": answers[0].workflow_id, "starts": starts, "starts_at": ANY}
        ]
        assert state["collapsed"] == starts - 1 and state["queued"] == 1


async def test_a_start_whose_run_closed_after_accepting_it_is_sent_again(
    client: Client, settings: Settings
) -> None:
    """A run that accepted a start and continued as new without answering it (here a
    bare poller answers the flow workflow's first task so): the server fails the
    update with ``AcceptedUpdateCompletedWorkflow``; the start is sent again with
    its update id and the next run, on the real worker, answers it, counted once."""
    name = f"deb-{uuid.uuid4().hex[:6]}"
    raw = pipeline(name, {"debounce": {"seconds": 86_400}}, 0)
    plan = plan_flow_start(raw, settings.task_queue_suffix)
    assert plan is not None
    queue = settings.queue(names.PIPELINES_QUEUE)
    sent = asyncio.create_task(submit(client, raw, plan, task_queue=queue))
    try:
        await accept_then_continue_as_new(client, queue)
        async with flow_stack(client, settings, name) as fid:
            handle = await asyncio.wait_for(sent, 60)
            assert (handle.flow.status, handle.flow.starts) == ("queued", 1)
            state = await client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
            assert state["pending"] == [{"workflow_id": handle.id, "starts": 1, "starts_at": ANY}]
            assert await _continued(client, fid)
    finally:
        sent.cancel()


async def accept_then_continue_as_new(client: Client, queue: str) -> None:
    """Take the next workflow task of ``queue`` as a bare poller would: accept the
    update it carries, and continue as new (same input) in the same completion."""
    service, namespace = client.workflow_service, client.namespace
    task = await service.poll_workflow_task_queue(
        PollWorkflowTaskQueueRequest(
            namespace=namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            identity="bare-poller",
        ),
        timeout=timedelta(seconds=70),
    )
    (message,) = task.messages
    request = UpdateRequest()
    assert message.body.Unpack(request)
    started = task.history.events[0].workflow_execution_started_event_attributes
    acceptance = Any_()
    acceptance.Pack(
        Acceptance(
            accepted_request_message_id=message.id,
            accepted_request_sequencing_event_id=message.event_id,
            accepted_request=request,
        )
    )
    accept_id = f"{message.protocol_instance_id}/accept"
    await service.respond_workflow_task_completed(
        RespondWorkflowTaskCompletedRequest(
            namespace=namespace,
            task_token=task.task_token,
            identity="bare-poller",
            messages=[
                Message(
                    id=accept_id, protocol_instance_id=message.protocol_instance_id, body=acceptance
                )
            ],
            commands=[
                Command(
                    command_type=CommandType.COMMAND_TYPE_PROTOCOL_MESSAGE,
                    protocol_message_command_attributes=ProtocolMessageCommandAttributes(
                        message_id=accept_id
                    ),
                ),
                Command(
                    command_type=CommandType.COMMAND_TYPE_CONTINUE_AS_NEW_WORKFLOW_EXECUTION,
                    continue_as_new_workflow_execution_command_attributes=(
                        ContinueAsNewWorkflowExecutionCommandAttributes(
                            workflow_type=started.workflow_type,
                            task_queue=started.task_queue,
                            input=started.input,
                        )
                    ),
                ),
            ],
        )
    )


SIGNED = {"type": "object", "properties": {"by": {"type": "string"}}}


def held(name: str, flow: dict[str, Any], n: int) -> dict[str, Any]:
    """A run that holds its key until its ``sign`` token is answered."""
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"customer": "c1", "n": n},
        "steps": [
            {"id": "sign", "wait": {"schema": SIGNED, "timeout_seconds": 3600}},
            {
                "id": "send",
                "worker": names.AGGREGATOR,
                "input": {"policy": "all", "branches": {"token": "${{ steps.sign.token }}"}},
            },
        ],
        "flow": {"key": "${{ inputs.customer }}", **flow},
    }


async def token_of(pc: PipelineClient, handle: FlowHandle) -> str:
    """The run's ``sign`` token, once it started and ``send`` got it."""
    await asyncio.wait_for(wait_started(handle, poll_seconds=0.05), 30)

    async def sent() -> str | None:
        p = await pc.progress(handle.id, include_outputs=True)
        send = p["steps"]["send"]
        return send["outputs"]["result"]["token"] if send["status"] == "succeeded" else None

    return await wait_until(sent, f"{handle.id} to hand out its token")


async def state_of(client: Client, fid: str) -> dict[str, Any]:
    state: dict[str, Any] = await client.get_workflow_handle(fid).query(names.FLOW_STATE_QUERY)
    return state


async def test_singleton_wait_runs_one_at_a_time_in_order(
    client: Client, settings: Settings
) -> None:
    name = f"one-{uuid.uuid4().hex[:6]}"
    flow = {"singleton": "wait"}
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name) as fid:
        a, b, c = [await pc.start(held(name, flow, n), check=False) for n in range(3)]
        assert isinstance(a, FlowHandle) and isinstance(b, FlowHandle) and isinstance(c, FlowHandle)
        assert a.flow.status == "started" and a.flow.run_id is not None
        assert (b.flow.status, b.flow.behind) == ("queued", a.id)
        assert (c.flow.status, c.flow.behind) == ("queued", b.id)
        state = await state_of(client, fid)
        assert state["running"] == a.id
        assert [p["workflow_id"] for p in state["pending"]] == [b.id, c.id]
        # a's normal end lets b start; c waits behind b
        await pc.complete_callback(await token_of(pc, a), {"by": "ann"})
        assert (await asyncio.wait_for(a.result(), 30)).status == "succeeded"
        token_b = await token_of(pc, b)
        state = await state_of(client, fid)
        assert state["running"] == b.id and [p["workflow_id"] for p in state["pending"]] == [c.id]
        assert (await pc.started_input(b.id) or {})["inputs"]["n"] == 1
        # any end counts: b cancelled, c starts with its own inputs
        await b.cancel()
        await token_of(pc, c)
        assert (await pc.started_input(c.id) or {})["inputs"]["n"] == 2
        assert (await b.describe()).status == WorkflowExecutionStatus.CANCELED
        assert token_b  # b had started before it was cancelled
        await c.terminate("test over")


async def test_singleton_cancel_running_cancels_the_run_then_starts_the_new_one(
    client: Client, settings: Settings
) -> None:
    name = f"one-{uuid.uuid4().hex[:6]}"
    flow = {"singleton": "cancel_running"}
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name):
        a = await pc.start(held(name, flow, 0), check=False)
        await token_of(pc, a)  # a runs, waiting for its token
        b = await pc.start(held(name, flow, 1), check=False)
        assert isinstance(b, FlowHandle)
        assert (b.flow.status, b.flow.behind) == ("queued", a.id)
        assert f"{a.id} is asked to cancel" in b.flow.reason
        await token_of(pc, b)  # b started once a had closed
        assert (await a.describe()).status == WorkflowExecutionStatus.CANCELED
        assert (await pc.started_input(b.id) or {})["inputs"]["n"] == 1
        await b.terminate("test over")


async def _exists(handle: FlowHandle) -> bool:
    try:
        await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def test_throttle_starts_one_run_per_period_and_queues_the_rest(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    name = f"thr-{uuid.uuid4().hex[:6]}"
    flow = {"throttle": {"max_starts": 1, "period_seconds": 600}}
    async with flow_stack(ts_env.client, settings, name):
        a, b, c = [await ts_start(ts_env, settings, pipeline(name, flow, n)) for n in range(3)]
        assert [h.flow.status for h in (a, b, c)] == ["started", "queued", "queued"]
        assert b.flow.starts_at is not None and c.flow.starts_at is not None
        assert c.flow.starts_at - b.flow.starts_at == pytest.approx(600, abs=1)
        assert await _exists(a) and not await _exists(b)
        await ts_env.sleep(timedelta(seconds=601))
        assert await started_inputs(ts_env.client, settings, b) == {"customer": "c1", "n": 1}
        assert not await _exists(c)  # its slot is a period after b's
        await ts_env.sleep(timedelta(seconds=600))
        assert await started_inputs(ts_env.client, settings, c) == {"customer": "c1", "n": 2}
        for h in (a, b, c):
            assert (await asyncio.wait_for(h.result(), 60)).status == "succeeded"


def batched(name: str, n: int) -> dict[str, Any]:
    """A batch pipeline whose step reads the collected starts."""
    raw = pipeline(name, {"batch": {"max_items": 3, "max_seconds": 600}}, n)
    raw["steps"] = [
        {
            "id": "check",
            "worker": names.VALIDATOR,
            "input": {"data": "${{ inputs.starts }}", "schema": {"type": "array", "minItems": 1}},
        }
    ]
    return raw


async def test_batch_gives_one_run_every_start_at_max_items_or_max_seconds(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    name = f"bat-{uuid.uuid4().hex[:6]}"
    async with flow_stack(ts_env.client, settings, name):
        full = [await ts_start(ts_env, settings, batched(name, n)) for n in range(3)]
        assert [h.flow.status for h in full] == ["queued", "collapsed", "started"]
        assert {h.id for h in full} == {full[0].id} and full[2].flow.run_id is not None
        inputs = await started_inputs(ts_env.client, settings, full[0])
        assert [s["n"] for s in inputs["starts"]] == [0, 1, 2]
        # the next batch does not fill: it starts at its deadline with what it has
        late = [await ts_start(ts_env, settings, batched(name, n)) for n in (3, 4)]
        assert [h.flow.status for h in late] == ["queued", "collapsed"]
        assert late[0].id != full[0].id and not await _exists(late[0])
        await ts_env.sleep(timedelta(seconds=601))
        inputs = await started_inputs(ts_env.client, settings, late[0])
        assert [s["n"] for s in inputs["starts"]] == [3, 4]
        for h in (full[0], late[0]):
            assert (await asyncio.wait_for(h.result(), 60)).status == "succeeded"


async def test_waiting_for_a_start_its_flow_workflow_dropped_fails_naming_it(
    client: Client, settings: Settings
) -> None:
    """Terminating a flow workflow drops the starts it holds: a caller waiting for
    such a run is told, rather than waiting for ever."""
    name = f"drop-{uuid.uuid4().hex[:6]}"
    pc = PipelineClient(client, settings)
    async with flow_stack(client, settings, name) as fid:
        handle = await pc.start(pipeline(name, {"debounce": {"seconds": 86_400}}, 1), check=False)
        assert isinstance(handle, FlowHandle) and handle.flow.status == "queued"
        await client.get_workflow_handle(fid).terminate("an operator drops the held starts")
        with pytest.raises(FlowRefusedError, match=f"flow workflow {fid} closed without starting"):
            await asyncio.wait_for(wait_started(handle, poll_seconds=0.05), 30)


def test_a_redrive_is_not_a_new_start_and_skips_flow_control() -> None:
    raw = pipeline("p", {"singleton": "wait"}, 1)
    assert plan_flow_start(raw) is not None
    raw["resume_from"] = {"workflow_id": "flow/acme/p/c1/ab-1", "run_id": "r", "steps": {}}
    assert plan_flow_start(raw) is None
