"""The ``wait`` step through the SDK: tokens, the ``callback`` Update, timeouts,
heartbeats, ``for_each``, a step that sends the token while the wait waits, and
the check of pipelines that use it. Real dev server (time-skipping for deadlines)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Stack, running_stack
from support import history
from support.pipelines import pipeline_result
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.callbacks import make_token, parse_token
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.workers.client.callbacks import CallbackError
from aiworker.workers.client.client import PipelineClient

SIGNED = {
    "type": "object",
    "required": ["signed_by"],
    "properties": {"signed_by": {"type": "string"}, "pages": {"type": "integer"}},
    "additionalProperties": False,
}
PUBLIC = "https://callbacks.example.com"


def sign_pipeline(timeout: float = 600, **wait_step: Any) -> dict[str, Any]:
    """``sign`` waits; ``send`` runs meanwhile with its token and URL; ``after``
    reads what the callback brought."""
    return {
        "name": "sign-flow",
        "tenant": "acme",
        "steps": [
            {"id": "sign", "wait": {"schema": SIGNED, "timeout_seconds": timeout}, **wait_step},
            {
                "id": "send",
                "worker": "aggregator",
                "input": {
                    "policy": "all",
                    "branches": {
                        "token": "${{ steps.sign.token }}",
                        "url": "${{ steps.sign.callback_url }}",
                    },
                },
            },
            {
                "id": "after",
                "worker": "aggregator",
                "input": {
                    "policy": "all",
                    "branches": {"signed_by": "${{ steps.sign.outputs.signed_by }}"},
                },
            },
        ],
        "output": {
            "sent": "${{ steps.send.outputs.result }}",
            "signed_by": "${{ steps.after.outputs.result.signed_by }}",
        },
    }


@pytest.fixture
def public_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"serve_public_url": PUBLIC})


async def sent_token(handle: WorkflowHandle[Any, Any], step: str = "send") -> dict[str, Any]:
    """What ``send`` got as ``data`` (token and URL), once it ran (sign still waits)."""

    async def check() -> dict[str, Any] | None:
        p = await handle.query(names.PROGRESS_QUERY, True)
        sent = p["steps"][step]
        if sent["status"] != "succeeded":
            return None
        assert p["steps"]["sign"]["status"] == "waiting", p["steps"]["sign"]
        assert [w["step"] for w in p["awaiting_callback"]] == ["sign"]
        data: dict[str, Any] = sent["outputs"]["result"]
        return data

    return await wait_until(check, "the send step to run while sign waits")


async def test_a_parallel_step_sends_the_token_and_the_sdk_completes_it(
    client: Client, public_settings: Settings
) -> None:
    async with running_stack(client, public_settings) as stack:
        handle = await stack.start(sign_pipeline())
        sent = await sent_token(handle)
        token = sent["token"]
        assert sent["url"] == f"{PUBLIC}/v1/callbacks/{token}"
        # the Temporal UI's step list shows the wait step waiting
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "- **sign** · wait · waiting" in meta.current_details
        assert parse_token(token)[0] == handle.id
        pipelines = PipelineClient(client, public_settings)
        reply = await pipelines.complete_callback(token, {"signed_by": "ann", "pages": 3})
        assert reply == {"step": "sign", "status": "completed"}
        result = await handle.result()
        # the same completion again: the first reply; another one: 409
        again = await pipelines.complete_callback(token, {"signed_by": "ann", "pages": 3})
        with pytest.raises(CallbackError) as other:
            await pipelines.complete_callback(token, {"signed_by": "bob"})
    assert result.status == "succeeded", result.error
    assert result.steps["sign"].outputs == {"signed_by": "ann", "pages": 3}
    assert result.output == {"sent": sent, "signed_by": "ann"}
    assert again == {**reply, "repeat": True}
    assert other.value.status == 409 and other.value.code == "invalid_input"
    # the secret came from the tokens local activity, recorded in the history
    events = await history.events(handle)
    markers = [e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert any(parse_token(token)[1] in json.dumps(str(m)) for m in markers)


async def test_refusals_leave_no_trace_in_the_history(client: Client, settings: Settings) -> None:
    """Unknown tokens, bodies off the schema, an answer after the first: each refused
    by the Update's validator with its status, nothing written to the history."""
    async with running_stack(client, settings) as stack:
        handle = await stack.start(sign_pipeline())
        token = (await sent_token(handle))["token"]
        assert (await sent_token(handle))["url"] == f"/v1/callbacks/{token}"  # no public URL
        pipelines = PipelineClient(client, settings)
        wid, secret = parse_token(token)
        forged = make_token(wid, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
        other_run = make_token("no-such-run", secret)
        refusals = {}
        for name, call in {
            "forged": pipelines.complete_callback(forged, {"signed_by": "x"}),
            "other-run": pipelines.complete_callback(other_run, {"signed_by": "x"}),
            "not-a-token": pipelines.complete_callback("awt1.x.y", {"signed_by": "x"}),
            "off-schema": pipelines.complete_callback(token, {"signed_by": 7}),
            "extra-field": pipelines.complete_callback(token, {"signed_by": "a", "x": 1}),
        }.items():
            with pytest.raises(CallbackError) as e:
                await call
            refusals[name] = e.value
        updates_before = await _updates(handle)
        await pipelines.fail_callback(token, "the signer declined")
        with pytest.raises(CallbackError) as late:
            await pipelines.complete_callback(token, {"signed_by": "ann"})
        result = await pipeline_result(handle)
    assert {k: v.status for k, v in refusals.items()} == {
        "forged": 404,
        "other-run": 404,
        "not-a-token": 404,
        "off-schema": 422,
        "extra-field": 422,
    }
    assert refusals["forged"].message == refusals["other-run"].message
    assert refusals["off-schema"].field == "outputs['signed_by']"
    assert "signed_by" in refusals["off-schema"].message
    assert refusals["off-schema"].code == "invalid_input"
    assert updates_before == 0
    assert late.value.status == 409
    assert await _updates(handle) == 1  # only the accepted failure
    assert result.status == "failed"
    sign = result.steps["sign"]
    assert sign.status == "failed" and sign.error_code == "callback_failed"
    assert "the signer declined" in (sign.error_message or "")
    assert result.steps["after"].status == "skipped"
    assert result.error is not None and result.error.step == "sign"


async def _updates(handle: WorkflowHandle[Any, Any]) -> int:
    events = await history.events(handle)
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    return sum(1 for e in events if e.event_type == accepted)


async def test_timeout_ends_the_wait_and_a_late_answer_is_gone(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    pipeline = sign_pipeline(timeout=3 * 86400, on_failure="continue")
    async with running_stack(ts_env.client, settings) as stack:
        handle = await stack.start(pipeline, memo={"search_attributes": False})
        result = await handle.result()
        token = result.steps["send"].outputs["result"]["token"]
        with pytest.raises(CallbackError) as late:
            await PipelineClient(ts_env.client, settings).complete_callback(
                token, {"signed_by": "ann"}
            )
    assert result.status == "partial"
    sign = result.steps["sign"]
    assert sign.status == "failed" and sign.error_code == "timeout"
    assert "no callback within 259200s" in (sign.error_message or "")
    assert late.value.status == 410


async def test_a_heartbeat_extends_the_wait(
    ts_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A heartbeat moves the deadline to now plus extend_seconds: the wait outlives
    its own timeout_seconds and a completion after it still counts."""
    async with running_stack(ts_env.client, settings) as stack:
        pipelines = PipelineClient(ts_env.client, settings)
        handle = await stack.start(sign_pipeline(timeout=3600), memo={"search_attributes": False})
        with ts_env.auto_time_skipping_disabled():
            token = (await sent_token(handle))["token"]
            first = await pipelines.heartbeat_callback(token, extend_seconds=10 * 86400)
        assert first["status"] == "waiting" and first["step"] == "sign"
        p = await handle.query(names.PROGRESS_QUERY)
        assert p["awaiting_callback"][0]["timeout_at"] == first["timeout_at"]
        await ts_env.sleep(2 * 86400)  # past the step's own hour, within the extension
        assert (await handle.query(names.PROGRESS_QUERY))["steps"]["sign"]["status"] == "waiting"
        await pipelines.complete_callback(token, {"signed_by": "late but fine"})
        result = await handle.result()
    assert result.status == "succeeded", result.error
    assert result.output["signed_by"] == "late but fine"


async def test_for_each_waits_for_one_token_per_item(stack: Stack, settings: Settings) -> None:
    pipeline = {
        "name": "sign-each",
        "tenant": "acme",
        "inputs": {"people": ["ann", "bob", "cy"]},
        "steps": [
            {
                "id": "sign",
                "for_each": "${{ inputs.people }}",
                "wait": {"schema": SIGNED, "timeout_seconds": 600},
            },
            {
                "id": "send",
                "worker": "aggregator",
                "for_each": "${{ steps.sign.token }}",
                "input": {"policy": "all", "branches": {"token": "${{ item }}"}},
            },
        ],
        "output": {"signed": "${{ steps.sign.outputs.items }}"},
    }
    handle = await stack.start(pipeline)
    pipelines = PipelineClient(stack.client, settings)

    async def tokens() -> list[str] | None:
        p = await handle.query(names.PROGRESS_QUERY, True)
        send = p["steps"]["send"]
        if send["status"] != "succeeded":
            return None
        assert len(p["awaiting_callback"]) == 3
        return [it["result"]["token"] for it in send["outputs"]["items"]]

    sent = await wait_until(tokens, "the tokens to be sent")
    assert len(set(sent)) == 3
    await pipelines.complete_callback(sent[2], {"signed_by": "cy"})
    await pipelines.complete_callback(sent[0], {"signed_by": "ann"})
    with pytest.raises(CallbackError):  # the item's token, another item's answer
        await pipelines.complete_callback(sent[0], {"signed_by": "bob"})
    await pipelines.fail_callback(sent[1], "bob is away")
    result = await handle.result()
    sign = result.steps["sign"]
    assert sign.status == "partial"
    assert sign.items == {"total": 3, "succeeded": 2, "failed": 1}
    assert result.output["signed"] == [{"signed_by": "ann"}, None, {"signed_by": "cy"}]
    assert sign.outputs["errors"][0]["index"] == 1
    assert sign.outputs["errors"][0]["error_code"] == "callback_failed"


WORKERS = {"validator", "aggregator"}
specs = load_specs()


def _check(pipeline: dict[str, Any]) -> list[str]:
    try:
        parse_pipeline(pipeline, {w: specs[w] for w in WORKERS})
    except PipelineSpecError as e:
        return e.problems
    return []


def test_check_takes_token_references_and_refuses_what_cannot_run() -> None:
    assert _check(sign_pipeline()) == []
    # a step that sign's waiting depends on reads sign's outputs: a cycle
    cyc = sign_pipeline()
    cyc["steps"][0]["depends_on"] = ["after"]
    assert any("cycle" in p for p in _check(cyc))
    # the token cannot exist before sign starts: sending it from a step sign needs
    before = sign_pipeline()
    before["steps"][0]["depends_on"] = ["send"]
    assert any("cycle" in p for p in _check(before))
    bad = sign_pipeline()
    bad["steps"][0]["wait"] = {"schema": {"type": 3}, "timeout_seconds": 10, "poll": 1}
    assert any("wait.poll" in p and "unknown" in p for p in _check(bad))
    bad["steps"][0]["wait"] = {"schema": {"type": 3}, "timeout_seconds": 10}
    assert any("wait.schema" in p for p in _check(bad))
    for timeout in (0, -1, 366 * 86400):
        bad["steps"][0]["wait"] = {"schema": {}, "timeout_seconds": timeout}
        assert any("wait.timeout_seconds" in p for p in _check(bad)), timeout
    worker = sign_pipeline()
    worker["steps"][0].update(worker="validator", retry={"max_attempts": 1})
    found = _check(worker)
    assert any("'worker'" in p and "calls no worker" in p for p in found)
    assert any("'retry'" in p and "calls no worker" in p for p in found)
    each = sign_pipeline()
    each["steps"][0].update(for_each=[1, 2], on_failure="escalate")
    assert any("'escalate' needs a single step" in p for p in _check(each))
    not_wait = sign_pipeline()
    not_wait["steps"][2]["input"]["branches"] = {"x": "${{ steps.send.token }}"}
    assert any("'send' is not a wait step" in p for p in _check(not_wait))
    deeper = sign_pipeline()
    deeper["steps"][1]["input"]["branches"] = {"x": "${{ steps.sign.token.x }}"}
    assert any("token has no fields" in p for p in _check(deeper))
    typo = sign_pipeline()
    typo["steps"][2]["input"]["branches"] = {"by": "${{ steps.sign.outputs.signed_bye }}"}
    found = _check(typo)
    assert any("the wait.schema of step 'sign' has no outputs.signed_bye" in p for p in found)
    nothing = {"name": "n", "steps": [{"id": "a", "input": {}}]}
    assert any("'worker'" in p and "required" in p for p in _check(nothing))


def test_a_redrive_sends_the_new_token_again() -> None:
    """A wait step that runs again hands out a new token: the step that sent the old
    one runs again with it, though it succeeded."""
    from aiworker.schemas.pipeline import PipelineSpec
    from aiworker.workflows.redrive import plan_redrive

    pipeline = sign_pipeline()
    pipeline["resume_from"] = {
        "workflow_id": "first",
        "steps": {
            "sign": {"status": "failed", "error_code": "timeout"},
            "send": {"status": "succeeded", "outputs": {"result": {}}},
            "after": {"status": "skipped"},
        },
    }
    plan = plan_redrive(PipelineSpec.model_validate(pipeline))
    assert plan is not None
    assert plan.reused == [] and plan.rerun == ["sign", "send", "after"]


async def test_a_failed_wait_escalates_to_review(client: Client, settings: Settings) -> None:
    """``on_failure: escalate`` as for any failed step: a retry waits again on the same
    token; an approval gives the outputs, held to wait.schema."""
    async with running_stack(client, settings) as stack:
        handle = await stack.start(sign_pipeline(on_failure="escalate"))
        token = (await sent_token(handle))["token"]
        pipelines = PipelineClient(client, settings)

        async def awaiting_review() -> bool:
            p = await handle.query(names.PROGRESS_QUERY)
            return bool(p["awaiting_review"] == ["sign"])

        await pipelines.fail_callback(token, "the signer is away")
        await wait_until(awaiting_review, "the failed wait to await review")
        await pipelines.send_review(handle.id, "retry", reviewer="r")
        await pipelines.fail_callback(token, "still away")  # the same token, waiting again
        await wait_until(awaiting_review, "the second failure to await review")
        with pytest.raises(WorkflowUpdateFailedError) as off:
            await pipelines.send_review(handle.id, "approve", outputs={"signed_by": 1})
        assert "wait.schema" in str(off.value.cause)
        await pipelines.send_review(handle.id, "approve", outputs={"signed_by": "by hand"})
        result = await handle.result()
    assert result.status == "succeeded", result.error
    assert result.steps["sign"].outputs == {"signed_by": "by hand"}
    assert result.steps["sign"].review is not None
    assert result.output["signed_by"] == "by hand"
