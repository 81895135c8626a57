"""Reading what happened from a workflow's real history."""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowHistory

from aiworker.schemas import names


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


LOCAL_ACTIVITY_MARKER = "core_local_activity"  # the SDK core's marker for a local activity


def patch_ids(events: list[Any]) -> set[str]:
    """The ``workflow.patched`` ids a history recorded (a pinned workflow records none)."""
    out = set()
    for e in events:
        attrs = e.marker_recorded_event_attributes
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED and attrs.marker_name == (
            "core_patch"
        ):
            out.add(json.loads(attrs.details["patch-data"].payloads[0].data)["id"])
    return out


def is_worker(local_activity: str | None) -> bool:
    """Whether a local activity is a worker's call, not aiworker's own (the run
    config and the ``limiter-*`` permit asks)."""
    return (
        local_activity is not None
        and not local_activity.startswith("limiter-")
        and local_activity != names.RUN_CONFIG
    )


def local_activity_type(event: Any) -> str | None:
    """The activity type a local activity's marker event records, else None."""
    if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != LOCAL_ACTIVITY_MARKER:
        return None
    name = json.loads(attrs.details["data"].payloads[0].data)["activity_type"]
    return str(name)


async def local_activities(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Worker local activities of this workflow (aiworker's own left out), in history order."""
    found = [local_activity_type(e) for e in await events(handle)]
    return [n for n in found if n is not None and is_worker(n)]


async def called_workers(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Every worker this workflow called, as an activity or a local activity, in
    history order (what ran, however it ran)."""
    out = []
    for e in await events(handle):
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif is_worker(name := local_activity_type(e)) and name is not None:
            out.append(name)
    return out


def worker_replies(events: list[Any]) -> list[Any]:
    """The replies of the workflow's completed worker calls, activities and local
    activities alike (aiworker's own left out), decoded from JSON, in history order."""
    out = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            out.append(
                json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
            )
        elif is_worker(name := local_activity_type(e)) and name is not None:
            result = e.marker_recorded_event_attributes.details["result"]
            out.append(json.loads(result.payloads[0].data))
    return out


def grant_times(history: WorkflowHistory) -> tuple[list[float], list[float]]:
    """(times of permits taken from leased blocks, times the limiter granted queued
    permits) in one workflow's history: the ``limiter-acquire`` results and the
    ``permit`` signals, as recorded."""
    pooled, queued = [], []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            a = e.marker_recorded_event_attributes
            if a.marker_name != LOCAL_ACTIVITY_MARKER:
                continue
            kind = json.loads(a.details["data"].payloads[0].data)["activity_type"]
            if kind not in (names.LIMITER_ACQUIRE, names.LIMITER_ACQUIRE_MANY):
                continue
            answer = json.loads(a.details["result"].payloads[0].data)
            answers = answer["results"] if kind == names.LIMITER_ACQUIRE_MANY else [answer]
            pooled += [r["granted_at"] for r in answers if r.get("pooled")]
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            a2 = e.workflow_execution_signaled_event_attributes
            if a2.signal_name == names.PERMIT_SIGNAL:
                queued.append(json.loads(a2.input.payloads[0].data)["granted_at"])
    return pooled, queued
