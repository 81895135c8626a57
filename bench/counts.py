"""What one pipeline costs Temporal, counted from its real fetched history.

Per workflow run (and its child workflows, followed through their
``ChildWorkflowExecutionStarted`` events): workflow tasks, history events,
activities, local activities, payload bytes and history bytes.

- ``workflow_tasks``: ``WorkflowTaskCompleted`` events (one per round trip
  of the workflow code); failed or timed-out tasks are counted apart.
- ``payload_bytes``: the ``data`` bytes of every ``Payload`` in the history
  (workflow input and result, activity inputs and results, failure details,
  marker details, headers, memo and search attributes), without their
  metadata; ``payload_bytes_by_kind`` splits the same sum by what holds the
  payload, ``payload_bytes_by_event`` by event type.
- ``history_bytes``: the serialized protobuf size of the history, what
  Temporal's 50 MB history limit is measured in.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory

_PAYLOAD = "temporal.api.common.v1.Payload"
# The SDK's marker for a local activity's result (temporalio core).
LOCAL_ACTIVITY_MARKER = "core_local_activity"
# The field names that put a payload in a kind other than "data" (first match on
# the path from the event down to the payload wins).
_KINDS = (
    ("search_attributes", "search_attributes"),
    ("memo", "memo"),
    ("header", "headers"),
    ("marker_recorded_event_attributes", "markers"),
)
KINDS = ("data", "markers", "headers", "memo", "search_attributes")


def _kind(field_name: str) -> str | None:
    for needle, kind in _KINDS:
        if needle in field_name:
            return kind
    return None


def _walk_payloads(msg: Message, kind: str, acc: Counter[str]) -> None:
    """Add the data bytes of every Payload under ``msg`` to ``acc[kind]``."""
    if msg.DESCRIPTOR.full_name == _PAYLOAD:
        acc[kind] += len(msg.data)  # type: ignore[attr-defined]
        return
    for field, value in msg.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        sub = kind if kind != "data" else (_kind(field.name) or "data")
        entry = field.message_type
        assert entry is not None  # a message field has a message type
        if entry.GetOptions().map_entry:
            if entry.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                for v in value.values():
                    _walk_payloads(v, sub, acc)
        elif field.is_repeated:
            for v in value:
                _walk_payloads(v, sub, acc)
        else:
            _walk_payloads(value, sub, acc)


def count_history(history: WorkflowHistory) -> dict[str, Any]:
    """The counts of one workflow run's history (its children not included)."""
    types = Counter(e.event_type for e in history.events)
    payloads: Counter[str] = Counter(dict.fromkeys(KINDS, 0))
    by_event: Counter[str] = Counter()
    local = 0
    for e in history.events:
        one: Counter[str] = Counter()
        _walk_payloads(e, "data", one)
        payloads.update(one)
        if one.total():
            by_event[_event_name(e.event_type)] += one.total()
        if (
            e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        ):
            local += 1
    return {
        "workflows": 1,
        "workflow_tasks": types[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED],
        "workflow_tasks_failed": types[EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        + types[EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT],
        "events": len(history.events),
        "activities": types[EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED],
        "local_activities": local,
        "child_workflows": types[EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED],
        "payload_bytes": sum(payloads.values()),
        "payload_bytes_by_kind": dict(payloads),
        "payload_bytes_by_event": dict(sorted(by_event.items())),
        "history_bytes": History(events=history.events).ByteSize(),
    }


def _event_name(event_type: int) -> str:
    """``EVENT_TYPE_ACTIVITY_TASK_SCHEDULED`` -> ``ActivityTaskScheduled``."""
    words = EventType.Name(event_type).removeprefix("EVENT_TYPE_").split("_")  # type: ignore[arg-type]
    return "".join(w.capitalize() for w in words)


def _children(history: WorkflowHistory) -> list[str]:
    return [
        e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
    ]


async def run_histories(client: Client, workflow_id: str) -> AsyncIterator[WorkflowHistory]:
    """The history of one run, then those of its child workflows at any depth."""
    pending = [workflow_id]
    while pending:
        history = await client.get_workflow_handle(pending.pop()).fetch_history()
        pending.extend(_children(history))
        yield history


async def pipeline_counts(client: Client, workflow_id: str) -> dict[str, Any]:
    """The counts of one run summed with those of its child workflows (recursively).

    ``largest_history_bytes`` is the biggest single history among them.
    """
    total: dict[str, Any] = {}
    largest = 0
    async for history in run_histories(client, workflow_id):
        one = count_history(history)
        largest = max(largest, one["history_bytes"])
        _add(total, one)
    total["largest_history_bytes"] = largest
    return total


def _add(total: dict[str, Any], one: dict[str, Any]) -> None:
    for k, v in one.items():
        if isinstance(v, dict):
            _add(total.setdefault(k, {}), v)
        else:
            total[k] = total.get(k, 0) + v


def median_counts(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-key median of several runs' counts (they should agree; the median keeps
    one odd run, a retried task, from moving the figure). A key one run lacks
    counts 0 there."""
    out: dict[str, Any] = {}
    for k in dict.fromkeys(k for r in runs for k in r):
        if any(isinstance(r.get(k), dict) for r in runs):
            out[k] = median_counts([r.get(k, {}) for r in runs])
        else:
            out[k] = statistics.median_low(r.get(k, 0) for r in runs)
    return out
