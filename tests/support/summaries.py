"""What a person sees of a history's commands in the Temporal UI: each activity,
local activity, timer and child workflow by its summary (``user_metadata.summary``).

:func:`unexplained` lists the events that would show a bare row: no summary, or a
summary that only repeats an internal name (``limiter-acquire``, ``permit``, the
activity's own type). Signals a workflow sends carry none: the SDK takes no
summary for them, so they are not checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from aiworker.schemas import names

# Names that mean nothing to a person when a row shows only them.
BARE_NAMES = frozenset(
    {
        names.LIMITER_ACQUIRE,
        names.LIMITER_ACQUIRE_MANY,
        names.RUN_CONFIG,
        names.PERMIT_SIGNAL,
        "run config",
    }
)
_LOCAL_ACTIVITY_MARKER = "core_local_activity"


def summary_of(event: HistoryEvent) -> str | None:
    """The event's summary as the UI shows it (None when it has none)."""
    payload = event.user_metadata.summary
    if not payload.data:
        return None
    text = json.loads(payload.data)
    return text if isinstance(text, str) else str(text)


def _local_activity_type(event: HistoryEvent) -> str:
    details = event.marker_recorded_event_attributes.details.get("data")
    if details is None or not details.payloads:
        return ""
    return str(json.loads(details.payloads[0].data).get("activity_type", ""))


def described(event: HistoryEvent) -> tuple[str, str] | None:
    """(what the event starts, its own name) for the events a summary describes:
    an activity, a local activity, a timer, a child workflow; None for the rest."""
    t = event.event_type
    if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return "activity", event.activity_task_scheduled_event_attributes.activity_type.name
    if t == EventType.EVENT_TYPE_TIMER_STARTED:
        return "timer", event.timer_started_event_attributes.timer_id
    if t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
        return (
            "child workflow",
            event.start_child_workflow_execution_initiated_event_attributes.workflow_type.name,
        )
    if (
        t == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name == _LOCAL_ACTIVITY_MARKER
    ):
        return "local activity", _local_activity_type(event)
    return None


def unexplained(events: Iterable[HistoryEvent]) -> list[str]:
    """One line per event whose UI row would not say what it is."""
    out = []
    for e in events:
        kind = described(e)
        if kind is None:
            continue
        what, name = kind
        summary = summary_of(e)
        if not summary:
            out.append(f"event {e.event_id}: {what} {name!r} has no summary")
        elif summary in BARE_NAMES or summary == name:
            out.append(f"event {e.event_id}: {what} {name!r} has a bare summary {summary!r}")
    return out


def summaries(events: Iterable[HistoryEvent]) -> list[str]:
    """Every summary of the events :func:`described` covers, in history order."""
    return [s for e in events if described(e) is not None and (s := summary_of(e))]


def limited_pipeline(tenant: str) -> dict[str, Any]:
    """A small pipeline whose every call waits at a limiter under :data:`LIMITED_RATE`:
    two steps one after the other, a for_each of three items, one step and the
    pipeline each under a concurrency key of its own, and a deadline (so each wait for a permit
    is bounded by a timer)."""
    check = {"data": "${{ inputs.n }}", "schema": {"type": "integer"}}
    return {
        "name": "explained",
        "tenant": tenant,
        "inputs": {"n": 3, "customer": "c1"},
        "budget": {"deadline_seconds": 120},
        "concurrency": {"key": "${{ inputs.customer }}", "limit": 1},
        "steps": [
            {"id": "read", "worker": "validator", "input": check},
            {
                "id": "summarize",
                "worker": "validator",
                "depends_on": ["read"],
                "concurrency": {"key": "writer", "limit": 1},
                "input": check,
            },
            {
                "id": "each",
                "worker": "validator",
                "depends_on": ["summarize"],
                "for_each": [1, 2, 3],
                "input": {"data": "${{ item }}", "schema": {"type": "integer"}},
            },
        ],
    }


def limited_rate(tenant: str) -> str:
    """The rate limit :func:`limited_pipeline` runs under (``AIWORKER_RATE_LIMITS``)."""
    return f"validator:{tenant}=2/2s"
