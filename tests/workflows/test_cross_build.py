"""Across builds: what the previous build sends, this build's auto-upgrade workflows
take and answer.

The limiter, breaker, registry and flow workflows move to the newest build at
their next workflow task, while the previous build's pinned runs (pipelines,
chunks, agents), worker processes and clients keep sending them what that build
sends. ``cross_build/*.json`` holds those calls as a build sent them
(``capture_calls.py``: signal-with-start inputs, signals, updates with the
answer that build gave, and the signals the workflow sent back, a limiter's
``permit``). Each is decoded into this build's handler types, then sent to this
build's workflows on a real dev server: every update answered, every signal
taking effect. What goes back to the previous build's callers must decode there
too: the limiter's and breaker's models forbid unknown fields
(``schemas/base.py``), so their answers and the permits a limiter signals carry
no field the previous build did not send; the flow's and registry's models
ignore unknown fields, so theirs keep at least the previous fields. Inputs
only grow, with defaults.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import capture_calls
import pytest
from conftest import running_stack
from pydantic import BaseModel
from support.history import workflow_task_failures
from support.waiting import wait_until
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

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
        if call["kind"] == "sent":
            continue  # decoded by the previous build's callers: the live test bounds it
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


def _fields_by_name(calls: list[dict[str, Any]], kind: str) -> dict[str, set[str]]:
    """The fields each ``kind`` call (``update``: its answers; ``sent``: its
    payloads) carried, by its name."""
    out: dict[str, set[str]] = {}
    for call in calls:
        if call["kind"] == kind:
            values = [call["answer"]] if kind == "update" else call["args"]
            out.setdefault(call["name"], set()).update(*(_keys(v) for v in values))
    return out


def _return_type(cls: type, update: str) -> Any:
    return workflow._Definition.must_from_class(cls).updates[update].ret_type


def _forbids_extra(kind: Any) -> bool:
    return (
        isinstance(kind, type)
        and issubclass(kind, BaseModel)
        and kind.model_config.get("extra") == "forbid"
    )


def _sent_by(history: WorkflowHistory) -> list[dict[str, Any]]:
    """The signals a workflow's history sent to other workflows, as captured."""
    return capture_calls.calls_of(json.loads(history.to_json()))[1]


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
        before = _fields_by_name(rest, "update")
        for call, answer in answered:
            name, recorded = call["name"], call["answer"]
            assert type(answer) is type(recorded) or _keys(recorded), (name, answer)
            assert _keys(recorded) <= _keys(answer), (name, recorded, answer)
            if _forbids_extra(_return_type(WORKFLOWS[kind], name)):
                assert _keys(answer) <= before[name], (name, "a field the caller refuses", answer)
        await _took_effect(handle, kind, rest, since, by)
        assert await workflow_task_failures(handle) == 0
        sent = _fields_by_name(_sent_by(await handle.fetch_history()), "sent")
        # the same kinds of signal back (a limiter's permits): none new, none missing
        assert sent.keys() == (previous := _fields_by_name(rest, "sent")).keys(), sent
        for name, fields in sent.items():
            assert fields <= previous[name], (name, "a field the caller refuses", fields)
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
