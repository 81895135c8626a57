"""A pipeline's live events, read from Temporal: what ``GET /v1/pipelines/{id}/events``
streams and :meth:`PipelineClient.events <aiworker.workers.client.client.PipelineClient.events>`
yields.

Event types (fixed by DESIGN.md): ``step_started``, ``step_progress``,
``llm_text``, ``step_ended``, ``review_awaited``, ``run_ended``.

Where each comes from (all of it Temporal's state, nothing kept by the reader):

- the step events (``step_started``, ``step_progress`` (attempts, for_each
  items), ``review_awaited``, ``step_ended``) are numbered by the workflow
  itself (:mod:`aiworker.workflows.step_events`) and read with the ``events``
  query, asking for those after the last number seen;
- ``llm_text`` is a streaming step's running attempt's heartbeat details (its
  partial text, chars, tokens: :func:`~aiworker.workers.client.progress.stream_of`),
  read with ``describe``, stamped with the time the server recorded that
  heartbeat (``last_heartbeat_time``, microseconds);
- ``run_ended`` is the workflow's close (describe's status), with the run's
  terminal status.

**Ids.** Every event but ``run_ended`` has the id ``"<n>.<t>"``: ``n`` the
number of the last step event delivered, ``t`` the heartbeat time of the last
``llm_text`` delivered (0 before any). Both parts only grow, and both come
from Temporal (the workflow's numbering, replayed identically; the server's
heartbeat clock), so any reader, in any ``serve`` process, resumes from an id
the same way: step events numbered above ``n``, partial texts whose heartbeat
is later than ``t``. ``run_ended`` has the id ``"end"``; resuming after it
yields nothing.

**What "misses nothing" means for partial text.** Step events are never
missed nor repeated (as long as the run keeps them: its last 5,000). Partial
text is a *snapshot*: each ``llm_text`` carries the latest tail of the reply
(up to 2,000 characters) and its total ``chars``; heartbeats that came between
two polls merge into the latest, so a client replaces the text it shows rather
than appending. After a reconnect the latest snapshot comes again only if a
newer heartbeat was recorded. A for_each's items and an ``llm-agent``'s turns
run in child workflows: their partial text is not streamed (their step events
are).

**Polling.** A reader long-polls the history (``wait_new_event``): each new
history event wakes it to ask the ``events`` query; it reads ``describe`` for
heartbeats (a heartbeat writes no history event) every ``poll_seconds`` while a
step streams text, every :data:`QUIET_SECONDS` while steps run that do not (yet),
and otherwise only when the history moves (at least every :data:`IDLE_SECONDS`).
A run that has ended is read with the same query, which a worker process
answers by replaying it; without one within :data:`ENDED_QUERY_SECONDS` the
reader sends ``run_ended`` alone. Why our own loop rather than Temporal's Workflow Streams: this
SDK (temporalio 1.35) and server (1.32) have none; the loop uses only the
history, a query and describe, so a worker or ``serve`` restart loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names
from aiworker.workers.client.progress import stream_of

log = logging.getLogger("aiworker.events")

EVENT_TYPES = (
    "step_started",
    "step_progress",
    "llm_text",
    "step_ended",
    "review_awaited",
    "run_ended",
)
END_ID = "end"
# "<n>.<t>": ASCII digits only (str.isdigit takes other scripts' digits too)
_ID = re.compile(r"([0-9]{1,18})\.([0-9]{1,20})", re.ASCII)
# While a step runs, describe is read this often for heartbeats (partial text).
POLL_SECONDS = 0.5
# A running step that has not streamed text (yet) is looked at this often: most
# steps never stream, and each look is a describe call per open stream.
QUIET_SECONDS = 2.0
# With nothing running, the history long-poll wakes the reader; this bounds its nap.
IDLE_SECONDS = 5.0
# Running activities whose heartbeat details one poll decodes.
MAX_ACTIVITIES = 20
# The terminal query of a closed run needs a worker to replay it: this long at most.
ENDED_QUERY_SECONDS = 5.0


@dataclass(frozen=True)
class Event:
    """One live event: ``id`` (resume from it with ``Last-Event-ID``), ``type``, ``data``."""

    id: str
    type: str
    data: Mapping[str, Any]


@dataclass
class Cursor:
    """Where a reader stands: the last step event number and llm_text heartbeat time."""

    n: int = 0
    t: int = 0
    ended: bool = False

    @classmethod
    def parse(cls, last_event_id: str | None) -> Cursor:
        """The cursor of an event id (``"<n>.<t>"``, ``"end"``); the start for None.

        Raises:
            ValueError: not an id this stream gave.
        """
        if last_event_id is None or last_event_id.strip() == "":
            return cls()
        text = last_event_id.strip()
        if text == END_ID:
            return cls(ended=True)
        m = _ID.fullmatch(text)
        if m is None:
            raise ValueError(f"not an event id of this stream: {last_event_id[:60]!r}")
        return cls(int(m[1]), int(m[2]))

    def id(self) -> str:
        """The id of an event delivered at this cursor."""
        return END_ID if self.ended else f"{self.n}.{self.t}"


@dataclass
class _Wake:
    """Set by the history long-poll on every new event (the run's close included)."""

    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def _watch_history(temporal: Client, workflow_id: str, run_id: str, wake: _Wake) -> None:
    handle = temporal.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        async for _event in handle.fetch_history_events(wait_new_event=True):
            wake.changed.set()
    except (RPCError, TemporalError) as e:  # the reader falls back to its poll
        log.info("history of %s: %s", workflow_id, e)
    wake.changed.set()


def _micros(ts: Any) -> int:
    return int(ts.seconds) * 1_000_000 + int(ts.nanos) // 1000


async def _streams(temporal: Client, desc: Any) -> list[tuple[int, Mapping[str, Any], int]]:
    """(heartbeat time in µs, stream details, attempt) of the running attempts that stream."""
    out = []
    for act in list(desc.raw_description.pending_activities)[:MAX_ACTIVITIES]:
        if not act.heartbeat_details.payloads or not act.HasField("last_heartbeat_time"):
            continue
        try:
            details = await temporal.data_converter.decode(act.heartbeat_details.payloads)
        except (TemporalError, ValueError, TypeError):
            continue
        if (stream := stream_of(details)) is not None:
            out.append((_micros(act.last_heartbeat_time), stream, int(act.attempt)))
    return sorted(out, key=lambda x: x[0])


def _step_data(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("n", "type")}


async def follow(
    temporal: Client,
    workflow_id: str,
    run_id: str,
    *,
    last_event_id: str | None = None,
    poll_seconds: float = POLL_SECONDS,
) -> AsyncIterator[Event]:
    """The run's events after ``last_event_id``, as they happen, ending with ``run_ended``.

    Raises:
        ValueError: ``last_event_id`` is not an id of this stream.
    """
    cursor = Cursor.parse(last_event_id)
    if cursor.ended:
        return
    handle = temporal.get_workflow_handle(workflow_id, run_id=run_id)
    wake = _Wake()
    watcher = asyncio.create_task(_watch_history(temporal, workflow_id, run_id, wake))
    try:
        while True:
            wake.changed.clear()
            desc = await handle.describe()
            running = desc.status == WorkflowExecutionStatus.RUNNING
            status: str | None = None
            async for ev in _step_events(handle, cursor, running):
                if ev.type == "status":
                    status = str(ev.data.get("status"))
                    continue
                yield ev
            if not running:
                execution = desc.status.name.lower() if desc.status else "unknown"
                sa = desc.typed_search_attributes.get(names.STATUS_KEY)
                cursor.ended = True
                yield Event(
                    END_ID,
                    "run_ended",
                    {
                        "workflow_id": workflow_id,
                        "status": status or sa or execution,
                        "execution_status": execution,
                    },
                )
                return
            streams = await _streams(temporal, desc)
            for t, stream, attempt in streams:
                if t <= cursor.t:
                    continue
                cursor.t = t
                yield Event(
                    cursor.id(),
                    "llm_text",
                    {
                        "step": stream.get("step"),
                        "text": stream.get("partial_text"),
                        "chars": stream.get("chars"),
                        "tokens": stream.get("tokens"),
                        "attempt": attempt,
                    },
                )
            nap = IDLE_SECONDS
            if streams:
                nap = poll_seconds
            elif desc.raw_description.pending_activities:
                nap = max(poll_seconds, QUIET_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.changed.wait(), nap)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _step_events(handle: Any, cursor: Cursor, running: bool) -> AsyncIterator[Event]:
    """The step events numbered above ``cursor.n`` (advancing it), then a ``status``
    pseudo-event with the run's status (not for the caller's caller)."""
    for _ in range(10_000):  # each answer carries at most 500: a bounded loop
        try:
            answer: dict[str, Any] = await asyncio.wait_for(
                handle.query(names.EVENTS_QUERY, cursor.n),
                None if running else ENDED_QUERY_SECONDS,
            )
        except (RPCError, TemporalError, TimeoutError) as e:
            if isinstance(e, RPCError) and e.status == RPCStatusCode.UNAVAILABLE:
                raise
            # the run has not run its first task yet, or an ended run no worker
            # replays: nothing to read now (the next wake asks again)
            log.info("events query of %s: %s", handle.id, type(e).__name__)
            return
        events = answer.get("events") or []
        for doc in events:
            n = int(doc["n"])
            if n <= cursor.n:
                continue
            cursor.n = n
            yield Event(cursor.id(), str(doc["type"]), _step_data(doc))
        yield Event("", "status", {"status": answer.get("status")})
        if not events or int(answer.get("count") or 0) <= cursor.n:
            return
