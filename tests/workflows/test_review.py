"""Escalation to a human: the ``review`` Workflow Update and its deadline."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support import history
from support.pipelines import pipeline_result
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.client import send_review

STATUS = SearchAttributeKey.for_keyword(names.SA_STATUS)
GOOD = {"policy": "all", "result": {"title": "fixed by a human"}, "used": [], "failed": []}


def _pipeline(timeout: float = 600) -> dict[str, Any]:
    return {
        "name": "review",
        "tenant": "acme",
        "steps": [
            {
                "id": "draft",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "on_failure": "escalate",
                "review_timeout_seconds": timeout,
            }
        ],
        "output": {"title": "${{ steps.draft.outputs.result.title }}"},
    }


def _producer(calls: list[dict[str, Any]], succeed_on: int = 99) -> Any:
    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        if len(calls) >= succeed_on:
            return GOOD
        raise fail("invalid_output", "the model returned garbage")

    return standin("aggregator", handler, calls)


async def _awaiting(handle: WorkflowHandle[Any, Any]) -> None:
    async def check() -> bool:
        p = await handle.query(names.PROGRESS_QUERY)
        return bool(p["awaiting_review"] == ["draft"])

    await wait_until(check, "the step to await review")


async def test_approve_with_corrected_outputs(client: Client, settings: Settings) -> None:
    calls: list[dict[str, Any]] = []
    acts = {"aggregator": _producer(calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        desc = await handle.describe()
        assert desc.typed_search_attributes.get(STATUS) == "awaiting_review"
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(names.REVIEW_UPDATE, {"decision": "maybe"})
        with pytest.raises(WorkflowUpdateFailedError) as e:
            await send_review(client, handle.id, "approve", outputs={"result": 1}, reviewer="ann")
        assert "schema" in str(e.value.cause)
        answer = await send_review(
            client, handle.id, "approve", outputs=GOOD, reviewer="ann", note="looks right"
        )
        result = await handle.result()
        desc = await handle.describe()
    assert answer["step"] == "draft" and answer["decision"] == "approve"
    assert answer["reviewer"] == "ann" and answer["update_id"]
    draft = result.steps["draft"]
    assert result.status == "succeeded"
    assert result.output == {"title": "fixed by a human"}
    assert draft.review is not None
    assert draft.review["reviewer"] == "ann" and draft.review["note"] == "looks right"
    assert len(calls) == 1
    assert desc.typed_search_attributes.get(STATUS) == "succeeded"


async def test_reject_ends_the_pipeline_rejected(client: Client, settings: Settings) -> None:
    calls: list[dict[str, Any]] = []
    async with running_stack(
        client, settings, replace_activities={"aggregator": _producer(calls)}
    ) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        await send_review(client, handle.id, "reject", reviewer="bob")
        result = await pipeline_result(handle)
    assert result.status == "rejected"
    assert result.steps["draft"].status == "rejected"


async def test_retry_runs_the_step_again(client: Client, settings: Settings) -> None:
    calls: list[dict[str, Any]] = []
    acts = {"aggregator": _producer(calls, succeed_on=2)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        await send_review(client, handle.id, "retry", reviewer="cy")
        result = await handle.result()
    assert result.status == "succeeded"
    assert len(calls) == 2
    assert calls[1]["idempotency_key"] == f"{handle.id}/draft#review-1"


async def test_no_review_before_the_deadline_times_out(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []
    async with running_stack(
        ts_env.client, settings, replace_activities={"aggregator": _producer(calls)}
    ) as stack:
        # The time-skipping server cannot register search attributes.
        handle = await stack.start(_pipeline(timeout=7 * 86400), memo={"search_attributes": False})
        result = await pipeline_result(handle)
    assert result.status == "escalation_timed_out"
    draft = result.steps["draft"]
    assert draft.status == "escalation_timed_out"
    assert "no review within 604800s" in (draft.error_message or "")


async def test_review_checks_both_contracts_with_formats_and_keeps_the_update_id(
    client: Client, settings: Settings
) -> None:
    """Approved outputs meet the worker's own output contract and ``validate.schema``
    (formats checked); an approval without outputs of a step that produced none is
    refused; every refusal happens in the Update's validator, so only the accepted
    decision is in the history, kept with its Update id."""
    calls: list[dict[str, Any]] = []
    pipeline = _pipeline()
    pipeline["steps"][0]["validate"] = {
        "schema": {
            "type": "object",
            "properties": {
                "result": {"type": "object", "properties": {"contact": {"format": "email"}}}
            },
        }
    }
    fine = {**GOOD, "result": {"title": "fixed", "contact": "ann@example.com"}}
    async with running_stack(
        client, settings, replace_activities={"aggregator": _producer(calls)}
    ) as stack:
        handle = await stack.start(pipeline)
        await _awaiting(handle)
        refusals = []
        for decision in (
            {"decision": "approve"},  # the step failed without outputs
            {"decision": "approve", "outputs": {**fine, "result": {"contact": "not an email"}}},
            {"decision": "approve", "outputs": {"result": {"contact": "ann@example.com"}}},
        ):
            with pytest.raises(WorkflowUpdateFailedError) as e:
                await handle.execute_update(names.REVIEW_UPDATE, {**decision, "reviewer": "mal"})
            refusals.append(str(e.value.cause))
        answer = await handle.execute_update(
            names.REVIEW_UPDATE,
            {"decision": "approve", "outputs": fine, "reviewer": "ann"},
            id="review-ann-1",
        )
        result = await handle.result()
        accepted = await history.count(
            handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        )
    assert "produced no outputs" in refusals[0]
    assert "validate.schema" in refusals[1] and "email" in refusals[1]
    assert "aggregator output_schema" in refusals[2] and "required" in refusals[2]
    assert answer["update_id"] == "review-ann-1" and answer["reviewer"] == "ann"
    assert result.status == "succeeded"
    review = result.steps["draft"].review
    assert review is not None
    assert review["update_id"] == "review-ann-1" and review["reviewer"] == "ann"
    assert accepted == 1


async def test_an_approved_step_says_how_it_got_there(client: Client, settings: Settings) -> None:
    """Approved: ``succeeded`` without a stale error code, the failure approved over
    kept as its cause, the review record naming its step (not given) and time."""
    calls: list[dict[str, Any]] = []
    acts = {"aggregator": _producer(calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        waiting = (await handle.query(names.PROGRESS_QUERY))["steps"]["draft"]
        await send_review(client, handle.id, "approve", outputs=GOOD, reviewer="ann")
        result = await handle.result()
    assert waiting["status"] == "awaiting_review" and waiting["error_code"] == "invalid_output"
    draft = result.steps["draft"]
    assert (draft.status, draft.error_code, draft.error_message) == ("succeeded", None, None)
    assert draft.cause[0].code == "invalid_output"
    assert "the model returned garbage" in draft.cause[0].message
    review = draft.review
    assert review is not None
    assert (review["decision"], review["reviewer"], review["step"]) == ("approve", "ann", "draft")
    assert review["at"].startswith("20") and review["update_id"]
    assert result.status == "succeeded" and result.error is None


async def test_a_rejected_step_is_the_pipelines_error_with_its_cause(
    client: Client, settings: Settings
) -> None:
    calls: list[dict[str, Any]] = []
    acts = {"aggregator": _producer(calls)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        # an Update without a reviewer: the record names the Update
        await handle.execute_update(
            names.REVIEW_UPDATE, {"decision": "reject", "note": "wrong shop"}, id="rv-1"
        )
        result = await pipeline_result(handle)
    draft = result.steps["draft"]
    assert draft.review is not None and draft.review["reviewer"] == "update rv-1"
    error = result.error
    assert result.status == "rejected" and error is not None
    assert (error.code, error.step) == ("invalid_output", "draft")
    assert error.message.startswith("rejected in review by update rv-1: wrong shop")
    assert error.cause[0].code == "invalid_output"


async def test_the_cli_names_the_reviewer_without_user(
    env: WorkflowEnvironment, settings: Settings, tmp_path: Path
) -> None:
    """``aiworker review`` with ``$USER`` and ``$LOGNAME`` unset names the uid's user."""
    calls: list[dict[str, Any]] = []
    acts = {"aggregator": _producer(calls)}
    proc_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIWORKER_", "TEMPORAL_", "OTEL_"))
        and k not in ("USER", "LOGNAME", "LNAME", "USERNAME")
    }
    proc_env["TEMPORAL_NAMESPACE"] = env.client.namespace
    proc_env["AIWORKER_DATA_DIR"] = str(tmp_path / "data")
    async with running_stack(env.client, settings, replace_activities=acts) as stack:
        handle = await stack.start(_pipeline())
        await _awaiting(handle)
        address = env.client.service_client.config.target_host
        cmd = ["review", handle.id, "approve", "--outputs", json.dumps(GOOD), "--address", address]
        # not subprocess.run: this event loop runs the workflow that answers the Update
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "aiworker.workers.cli.main",
            *cmd,
            env=proc_env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, errout = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
        result = await handle.result()
    assert proc.returncode == 0, errout.decode()
    me = pwd.getpwuid(os.getuid()).pw_name
    assert json.loads(out)["reviewer"] == me
    review = result.steps["draft"].review
    assert review is not None and (review["reviewer"], review["step"]) == (me, "draft")
