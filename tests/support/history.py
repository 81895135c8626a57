"""Reading what happened from a workflow's real history."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle


async def events(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    history = await handle.fetch_history()
    return list(history.events)


async def count(handle: WorkflowHandle[Any, Any], event_type: int) -> int:
    return sum(1 for e in await events(handle) if e.event_type == event_type)


async def activity_failures(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, int]]:
    """(failure type, attempt) of each ActivityTaskFailed event."""
    out = []
    for e in await events(handle):
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a = e.activity_task_failed_event_attributes
            out.append((a.failure.application_failure_info.type, 0))
    return out


async def last_activity_attempt(handle: WorkflowHandle[Any, Any]) -> int:
    """The attempt number recorded on the last ActivityTaskStarted event."""
    attempt = 0
    for e in await events(handle):
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attempt = e.activity_task_started_event_attributes.attempt
    return attempt


async def workflow_task_failures(handle: WorkflowHandle[Any, Any]) -> int:
    return await count(handle, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)


async def scheduled_activities(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Activity types scheduled by this workflow, in history order."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in await events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
