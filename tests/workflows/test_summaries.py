"""Every timer, local activity, activity and child workflow a run schedules says what
it is for in the Temporal UI: its ``user_metadata.summary`` names what it waits
for, for which step and tenant, never a bare internal name (``limiter-acquire``,
``permit``, a timer's number). Checked on a fresh run's histories (the pipeline,
its for_each chunk and the limiter it waited at) and on the recorded histories
of older code, which the check must flag."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from conftest import running_stack
from support.payloads import stack_settings, workflow_tree
from support.summaries import limited_pipeline, limited_rate, summaries, unexplained
from temporalio.client import Client, WorkflowHistory

from aiworker.config.settings import parse_rate_limits
from aiworker.schemas import names

HISTORIES = Path(__file__).parent / "histories"


def _without_summaries(name: str) -> WorkflowHistory:
    """A committed history with every summary taken out: what code that wrote none
    (bare ``limiter-acquire-many`` asks, numbered timers) would have recorded."""
    history = json.loads((HISTORIES / f"{name}.json").read_text("utf-8"))
    for event in history["events"]:
        event.pop("userMetadata", None)
    return WorkflowHistory.from_json(name, history)


def test_histories_without_summaries_are_flagged() -> None:
    """The check can fail: a local activity or timer with no summary is named."""
    found = unexplained(_without_summaries("limited-queued-chunk").events)
    assert any("local activity 'limiter-acquire-many' has no summary" in f for f in found), found
    assert any(
        "timer" in f and "has no summary" in f
        for f in unexplained(_without_summaries("limiter-queued").events)
    )
    # the committed ones, recorded with summaries, are not
    text = (HISTORIES / "limited-queued-chunk.json").read_text("utf-8")
    assert unexplained(WorkflowHistory.from_json("w", text).events) == []


async def test_a_limited_run_explains_every_timer_and_activity(
    client: Client, tmp_path: Path
) -> None:
    tenant = f"t{uuid.uuid4().hex[:6]}"
    settings = stack_settings(tmp_path, rate_limits=tuple(parse_rate_limits(limited_rate(tenant))))
    async with running_stack(client, settings) as stack:
        handle = await stack.start(limited_pipeline(tenant))
        result = await handle.result()
    assert result.status == "succeeded", result
    histories = await workflow_tree(client, handle.id)
    limiter_id = names.limiter_workflow_id(f"rate:validator:{tenant}", settings.task_queue_suffix)
    histories[limiter_id] = await client.get_workflow_handle(limiter_id).fetch_history()
    assert len(histories) == 3, sorted(histories)  # pipeline, its chunk, the limiter
    for wid, history in histories.items():
        assert unexplained(history.events) == [], wid
    said = {s for h in histories.values() for s in summaries(h.events)}
    # the pipeline: asked and waited for each step's permit, named by step and tenant
    assert f"ask for a validator permit (tenant {tenant}) for step summarize" in said
    assert (
        f"wait for a validator permit (tenant {tenant}, limit 2 per 2s) for step summarize" in said
    )
    assert "ask for a concurrency slot of c1 (limit 1 at once) for the pipeline" in said, said
    assert "ask for a concurrency slot of writer (limit 1 at once) for step summarize" in said
    assert f"run config: limits, caps and worker specs (tenant {tenant}, 1 named)" in said
    # the chunk asked for its items' permits together
    assert f"ask for 3 validator permits (tenant {tenant}) for each[0..2]" in said, said
    # the limiter's own timers say what it waits for
    assert any(s.startswith(f"limiter rate:validator:{tenant} (2 per 2s): ") for s in said), said
