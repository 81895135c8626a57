"""Across builds: what the previous build sends, this build's auto-upgrade workflows
take and answer.

The limiter, breaker, registry and flow workflows move to the newest build at
their next workflow task, while the previous build's pinned runs (pipelines,
chunks, agents), worker processes and clients keep sending them what that build
sends. ``cross_build/*.json`` holds those calls as a build sent them
(``capture_calls.py``: signal-with-start inputs, signals, updates with the
answer that build gave). Each is decoded into this build's handler types, then
sent to this build's workflows on a real dev server: every update answered with
at least the fields the previous build answered, every signal taking effect.
Payloads only grow.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support.history import workflow_task_failures
from support.waiting import wait_until
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workflows.breakers import SharedBreakerWorkflow
from aiworker.workflows.flow import PipelineFlowWorkflow
from aiworker.workflows.limits import LimiterWorkflow
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow

FOLDER = Path(__file__).parent / "cross_build"
CAPTURES = sorted(FOLDER.glob("*.json"))
WORKFLOWS: dict[str, type] = {
    "LimiterWorkflow": LimiterWorkflow,
    "SharedBreakerWorkflow": SharedBreakerWorkflow,
    "WorkerRegistryWorkflow": WorkerRegistryWorkflow,
    "PipelineFlowWorkflow": PipelineFlowWorkflow,
}
# Epoch seconds in a payload (deadlines, open-until times) are moved by this much
# past the recording's own time, so a breaker opened then is open now.
_YEAR = 366 * 86400.0


def _histories() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in CAPTURES:
        for h in json.loads(path.read_text("utf-8"))["histories"]:
            out.append((f"{path.stem}:{h['history']}", h))
    return out


HISTORIES = _histories()


def test_every_auto_upgrade_workflow_has_captured_calls() -> None:
    assert CAPTURES, "no cross_build/*.json"
    assert {h["workflow"] for _, h in HISTORIES} == set(WORKFLOWS)


def _handler_types(cls: type, kind: str, name: str | None) -> list[Any]:
    defn = workflow._Definition.must_from_class(cls)
    if kind == "start":
        return list(defn.arg_types or [])
    table: Any = defn.signals if kind == "signal" else defn.updates
    assert name in table, f"{cls.__name__} has no {kind} {name!r}"
    return list(table[name].arg_types or [])


@pytest.mark.parametrize(("label", "history"), HISTORIES, ids=[i for i, _ in HISTORIES])
def test_each_payload_decodes_into_this_builds_types(label: str, history: dict[str, Any]) -> None:
    """Decoded exactly as the SDK decodes a handler's input: a field this build
    renamed or made required would fail here."""
    cls = WORKFLOWS[history["workflow"]]
    converter = data_converter(None).payload_converter
    for call in history["calls"]:
        types = _handler_types(cls, call["kind"], call.get("name"))
        assert len(call["args"]) == len(types), (label, call)
        decoded = converter.from_payloads(converter.to_payloads(call["args"]), types)
        assert len(decoded) == len(types)


def _shifted(value: Any, since: float, by: float) -> Any:
    """``value`` with every epoch time after ``since`` (within a year) moved by ``by``."""
    if isinstance(value, dict):
        return {k: _shifted(v, since, by) for k, v in value.items()}
    if isinstance(value, list):
        return [_shifted(v, since, by) for v in value]
    if isinstance(value, float) and since - 86400 <= value <= since + _YEAR:
        return value + by
    return value


def _keys(value: Any) -> set[str]:
    return set(value) if isinstance(value, dict) else set()


async def _send(
    handle: WorkflowHandle[Any, Any], calls: list[dict[str, Any]], since: float, by: float
) -> list[tuple[dict[str, Any], Any]]:
    """Each signal and update in order; the updates' answers."""
    answered = []
    for call in calls:
        args = _shifted(call["args"], since, by)
        if call["kind"] == "signal":
            await handle.signal(call["name"], args=args)
        elif call["kind"] == "update":
            answer = await handle.execute_update(call["name"], args=args)
            answered.append((call, answer))
    return answered


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("label", "history"), HISTORIES, ids=[i for i, _ in HISTORIES])
async def test_this_build_answers_the_previous_builds_calls(
    label: str, history: dict[str, Any], client: Client, settings: Settings
) -> None:
    calls = history["calls"]
    start, rest = calls[0], calls[1:]
    since = float(history["recorded_at"])
    by = time.time() - since  # workflow time is the dev server's, this machine's clock
    kind = history["workflow"]
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]) as stack:
        handle = await client.start_workflow(
            kind,
            args=_shifted(start["args"], since, by),
            id=f"xbuild-{uuid.uuid4().hex[:8]}",
            task_queue=stack.pipelines_queue,
        )
        answered = await _send(handle, rest, since, by)
        for call, answer in answered:
            recorded = call["answer"]
            assert type(answer) is type(recorded) or _keys(recorded), (call["name"], answer)
            assert _keys(recorded) <= _keys(answer), (call["name"], recorded, answer)
        await _took_effect(handle, kind, rest, since, by)
        assert await workflow_task_failures(handle) == 0
        await handle.terminate("test over")


async def _took_effect(
    handle: WorkflowHandle[Any, Any],
    kind: str,
    calls: list[dict[str, Any]],
    since: float,
    by: float,
) -> None:
    """What each workflow's signals must have changed, read through its query."""
    signals = [c for c in calls if c["kind"] == "signal"]
    if kind == "LimiterWorkflow":
        asks = sum(c["name"] == names.LIMITER_ACQUIRE_SIGNAL for c in signals)

        async def all_seen() -> bool:
            s = await handle.query("state")
            return bool(s["granted_total"] + len(s["waiting"]) >= asks)

        await wait_until(all_seen, f"{asks} acquire signals granted or queued")
    elif kind == "SharedBreakerWorkflow":
        opened = [c["args"][0] for c in signals if c["name"] == names.BREAKER_OPENED_SIGNAL]
        if opened:
            until = await handle.query(names.BREAKER_STATE_QUERY)
            assert until >= max(_shifted(opened, since, by)) - 1e-6
    elif kind == "WorkerRegistryWorkflow":
        gone = {c["args"][0] for c in signals if c["name"] == names.REGISTRY_WITHDRAW_SIGNAL}
        published = {
            c["args"][0]["identity"]
            for c in calls
            if c.get("name") == names.REGISTRY_PUBLISH_UPDATE
        }
        assert gone <= published  # each withdraw takes back an entry it published

        async def withdrawn() -> bool:
            snapshot = await handle.query(names.REGISTRY_ENTRIES_QUERY)
            # an entry published with a short ttl may have expired too: only the
            # withdrawn ones must be gone (a dropped signal would leave them listed)
            return not set(snapshot["records"]) & gone

        await wait_until(withdrawn, f"{gone} withdrawn")
    elif kind == "PipelineFlowWorkflow":
        state = await handle.query(names.FLOW_STATE_QUERY)
        assert state["flow_workflow_id"] == handle.id
