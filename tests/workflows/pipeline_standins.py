"""Stand-in activities for workflow tests (STYLE.md: same-name activities may
stand in for a worker), and small helpers to read what a pipeline did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError


@dataclass
class Reply:
    """What a stand-in returns: outputs plus optional status and usage."""

    outputs: dict[str, Any]
    status: str = "succeeded"
    usage: dict[str, int] = field(default_factory=dict)


def fail(
    code: str,
    message: str = "stand-in failure",
    retryable: bool = False,
    reasons: list[dict[str, Any]] | None = None,
) -> ApplicationError:
    """A failure shaped like the runtime's (code as type, ErrorInfo in details)."""
    return ApplicationError(
        message,
        {
            "code": code,
            "message": message,
            "retryable": retryable,
            "reasons": reasons or [],
            "context": {"attempt": 1},
        },
        type=code,
        non_retryable=not retryable,
    )


Handler = Callable[[dict[str, Any]], Awaitable[Reply | dict[str, Any]]]


def standin(name: str, handler: Handler, calls: list[dict[str, Any]] | None = None) -> Any:
    """An activity named ``name`` that answers every request with ``handler``."""

    @activity.defn(name=name)
    async def act(request: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append(request)
        reply = await handler(request)
        if isinstance(reply, dict):
            reply = Reply(reply)
        return {
            "worker_id": name,
            "version": "1",
            "status": reply.status,
            "outputs": reply.outputs,
            "usage": reply.usage,
            "observability": {"worker_id": name, "attempt": activity.info().attempt},
        }

    return act


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, tries: int = 200, pause: float = 0.1
) -> None:
    """Poll ``predicate`` a bounded number of times; fail naming ``what``."""
    for _ in range(tries):
        if await predicate():
            return
        await asyncio.sleep(pause)
    raise AssertionError(f"gave up waiting for {what}")


async def scheduled_activities(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Activity types scheduled by this workflow, in history order."""
    history = await handle.fetch_history()
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
