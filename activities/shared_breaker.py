"""The process side of breakers shared across worker processes.

A :class:`BreakerRegistry` with a :class:`SharedBreakers` publishes each
opening to the target's ``SharedBreakerWorkflow`` and, before letting a call
through, consults what the other processes published (refreshed in the
background at most every ``refresh_seconds``), so one process's failures
stop the others' calls too. Publishing and refreshing never block a call:
they run as background tasks on the activity's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio import activity
from temporalio.client import Client

from schemas import names
from schemas.limits import SharedBreakerState

log = logging.getLogger("aiworker.breaker")


class SharedBreakers:
    """Open-until times per breaker key, shared through Temporal."""

    def __init__(
        self, queue: str, client: Client | None = None, refresh_seconds: float = 1.0
    ) -> None:
        self.queue = queue
        self.refresh_seconds = refresh_seconds
        self._client = client
        self._suffix = names.queue_suffix_of(queue)
        self._open_until: dict[str, float] = {}
        self._refreshed: dict[str, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def _get_client(self) -> Client | None:
        if self._client is None and activity.in_activity():
            self._client = activity.client()
        return self._client

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()  # no loop (a synchronous caller): nothing to share now
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def open_until(self, key: str) -> float:
        """What the other processes said, as last refreshed (epoch seconds)."""
        now = time.monotonic()
        if now - self._refreshed.get(key, float("-inf")) >= self.refresh_seconds:
            self._refreshed[key] = now
            self._spawn(self._refresh(key))
        return self._open_until.get(key, 0.0)

    def publish(self, key: str, open_until: float) -> None:
        """Tell every process that ``key`` is open until ``open_until``."""
        self._open_until[key] = max(self._open_until.get(key, 0.0), open_until)
        self._spawn(self._publish(key, open_until))

    async def _refresh(self, key: str) -> None:
        client = self._get_client()
        if client is None:
            return
        handle = client.get_workflow_handle(names.shared_breaker_workflow_id(key, self._suffix))
        try:
            until = await handle.query(names.BREAKER_STATE_QUERY, result_type=float)
        except Exception:
            return
        self._open_until[key] = max(self._open_until.get(key, 0.0), float(until))

    async def _publish(self, key: str, open_until: float) -> None:
        client = self._get_client()
        if client is None:
            return
        try:
            await client.start_workflow(
                names.SHARED_BREAKER_WORKFLOW,
                SharedBreakerState(key=key, open_until=open_until),
                id=names.shared_breaker_workflow_id(key, self._suffix),
                task_queue=self.queue,
                start_signal=names.BREAKER_OPENED_SIGNAL,
                start_signal_args=[open_until],
                static_summary=f"breaker {key}",
            )
        except Exception as e:
            log.warning(
                "breaker.share_failed",
                extra={"aiworker": {"event": "breaker_share_failed", "key": key, "error": str(e)}},
            )
