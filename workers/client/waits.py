"""What a pipeline waits for, told while ``aiworker run`` waits for its result.

A run that stands at a limiter (a worker's rate limit, a concurrency key, the
pipeline's own concurrency slot) shows it only in its ``progress`` query.
:func:`snapshot` reads that query (and, for a for_each, the progress of its
running chunk workflows); :class:`WaitNotices` picks the waits that have lasted
:data:`WAIT_NOTICE_SECONDS`, and :func:`report_waits` says one line per step
and kind of them (``aiworker run --json``, on stderr). The live display and
the plain lines of :mod:`aiworker.workers.client.watch` poll the same snapshot, which
also carries what streaming steps have said so far (their running attempts'
heartbeat details, from the same ``describe`` call).

A run whose workflow task no worker picks up answers no query at all:
:func:`tell_unserved` watches its description instead and says once, after
:data:`~aiworker.workers.client.pollers.NOTICE_SECONDS`, which queue and build it
waits for and which pollers are there (:mod:`aiworker.workers.client.pollers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.exceptions import TemporalError

from aiworker.schemas import names
from aiworker.workers.client.pollers import NOTICE_SECONDS, unserved
from aiworker.workers.client.progress import Snapshot, Wait, stream_of

if TYPE_CHECKING:
    from aiworker.workers.client.client import PipelineClient, PipelineHandle

# A step waiting longer than this gets a line; shorter waits are normal pacing.
WAIT_NOTICE_SECONDS = 5.0
POLL_SECONDS = 1.0
# The watch stops after this many polls (an hour at one a second): a bounded loop.
MAX_POLLS = 3600
# Running chunk workflows queried per poll (a for_each's waits show in its chunks).
MAX_CHUNKS = 10
# Running activities whose heartbeat details one poll decodes (streaming steps).
MAX_ACTIVITIES = 20

_WHY = {
    "rate": "at its worker's rate limit (the spec's rate_limit, or AIWORKER_RATE_LIMITS)",
    "concurrency": "for a concurrency slot (its concurrency key is at its limit)",
}


def wait_line(
    step: str, kind: str, seconds: float, items: int | None = None, limit: str | None = None
) -> str:
    """The line that says who has waited how long, and for what: ``limit`` names the
    limit and its configured rate (``rate:web-scrape:acme (10 per 60s)``)."""
    why = _WHY.get(kind, f"for a {kind} permit")
    if limit:
        why = f"{why}: {limit}"
    if not step:
        slot = f": {limit}" if limit else ""
        return f"the pipeline has waited {seconds:.0f}s for its concurrency slot{slot}"
    count = f"; {items} of its for_each items wait" if items else ""
    return f"step {step!r} has waited {seconds:.0f}s {why}{count}; it goes on when a permit comes"


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` when this task was asked to stop. A cancel that
    reaches a Temporal call mid-flight can come back as an ``RPCError`` ("operation
    was canceled"), which a poll here would take for a failed query and poll again:
    ``aiworker run`` would not stop on Ctrl-C."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def snapshot(temporal: Client, workflow_id: str) -> Snapshot:
    """The run's ``progress`` now, with who waits and how many: the pipeline's own
    waits and, for a running for_each, the waits of its chunks' items."""
    handle = temporal.get_workflow_handle(workflow_id)
    progress: dict[str, Any] = await handle.query(names.PROGRESS_QUERY)
    now: Counter[Wait] = Counter()
    limits: dict[str, str] = {}
    for who, kind in (progress.get("waiting") or {}).items():
        now[(who, kind, False)] += 1
    steps = progress.get("steps") or {}
    # a for_each's items wait in its chunk workflows (its step shows `running`)
    if not any(s.get("status") == "running" for s in steps.values()):
        return Snapshot.of(progress, now)
    desc = await handle.describe()
    streams = await _streams(temporal, desc)
    for child in list(desc.raw_description.pending_children)[:MAX_CHUNKS]:
        chunk_id = child.workflow_id
        if not chunk_id.startswith(workflow_id + "/"):
            continue
        step = chunk_id[len(workflow_id) + 1 :].rsplit("/", 1)[0]
        try:
            chunk = await temporal.get_workflow_handle(chunk_id).query(names.PROGRESS_QUERY)
        except TemporalError:
            stop_if_cancelled()
            continue
        for kind in (chunk.get("waiting") or {}).values():
            now[(step, kind, True)] += 1
        for text in (chunk.get("limits") or {}).values():
            limits[step] = text
    return Snapshot.of(progress, now, streams, limits)


async def _streams(
    temporal: Client, desc: WorkflowExecutionDescription
) -> dict[str, Mapping[str, Any]]:
    """Step id -> the streaming progress its running attempt heartbeats (the
    pending activities' last heartbeat details, decoded with the data converter)."""
    out: dict[str, Mapping[str, Any]] = {}
    for act in list(desc.raw_description.pending_activities)[:MAX_ACTIVITIES]:
        if not act.heartbeat_details.payloads:
            continue
        try:
            details = await temporal.data_converter.decode(act.heartbeat_details.payloads)
        except (TemporalError, ValueError, TypeError):  # not ours to read: no line for it
            continue
        if (stream := stream_of(details)) is not None:
            out[str(stream.get("step") or act.activity_type.name)] = stream
    return out


@dataclass
class WaitNotices:
    """Which waits have lasted ``notice_after`` seconds: each told once."""

    notice_after: float = WAIT_NOTICE_SECONDS
    since: dict[Wait, float] = field(default_factory=dict)  # when each wait was first seen
    told: set[Wait] = field(default_factory=set)

    def seen(
        self, now: Counter[Wait], clock: float, limits: Mapping[str, str] | None = None
    ) -> list[str]:
        """The waits of one poll at ``clock`` (monotonic seconds); the lines to say
        (``limits``: step -> the limit it waits for, :attr:`Snapshot.limits`)."""
        self.since = {key: self.since.get(key, clock) for key in now}
        lines = []
        for key, first in self.since.items():
            if key not in self.told and clock - first >= self.notice_after:
                self.told.add(key)
                step, kind, items = key
                count = now[key] if items else None
                text = (limits or {}).get(step)
                lines.append(wait_line(step, kind, clock - first, count, text))
        return lines


async def report_waits(
    temporal: Client,
    workflow_id: str,
    say: Callable[[str], None],
    *,
    notice_after: float = WAIT_NOTICE_SECONDS,
    poll: float = POLL_SECONDS,
) -> None:
    """Say a line (through ``say``) for each step and kind of wait that lasts
    ``notice_after`` seconds, once each; runs until cancelled or
    :data:`MAX_POLLS` polls. A query that fails (the run has not started its
    first task yet, or has ended) is tried again at the next poll."""
    notices = WaitNotices(notice_after)
    for _ in range(MAX_POLLS):
        await asyncio.sleep(poll)
        try:
            snap = await snapshot(temporal, workflow_id)
        except TemporalError:  # RPC errors and refused queries: advice only, try again
            stop_if_cancelled()
            continue
        for line in notices.seen(snap.waits, time.monotonic(), snap.limits):
            say(line)


async def tell_unserved(
    temporal: Client,
    workflow_id: str,
    say: Callable[[str], None],
    *,
    notice_after: float = NOTICE_SECONDS,
    poll: float = POLL_SECONDS,
) -> None:
    """Say one line (through ``say``) when the run's workflow task has waited
    ``notice_after`` seconds with no worker picking it up: the queue, the build
    it goes to, the pollers seen. Once; returns then, when the run ends, or after
    :data:`MAX_POLLS` polls. A describe that fails is tried again at the next poll."""
    handle = temporal.get_workflow_handle(workflow_id)
    for _ in range(MAX_POLLS):
        await asyncio.sleep(poll)
        try:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return
            found = await unserved(temporal, desc, notice_after)
        except TemporalError:  # advice only: try again
            stop_if_cancelled()
            continue
        if found is not None:
            say(found.message())
            return


@contextlib.asynccontextmanager
async def beside(*jobs: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``jobs`` as tasks for as long as the block runs; cancelled and awaited
    when it ends, however it ends."""
    tasks = [asyncio.create_task(job) for job in jobs]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def telling_unserved(
    temporal: Client, workflow_id: str, say: Callable[[str], None]
) -> contextlib.AbstractAsyncContextManager[None]:
    """:func:`tell_unserved` for as long as the block runs."""
    return beside(tell_unserved(temporal, workflow_id, say))


async def outcome_telling_waits(
    pipelines: PipelineClient, handle: PipelineHandle, say: Callable[[str], None]
) -> dict[str, Any]:
    """:meth:`PipelineClient.outcome` of ``handle``, with :func:`report_waits`
    saying (through ``say``) what the run waits for meanwhile, and
    :func:`tell_unserved` when no worker picks it up."""
    async with beside(
        report_waits(pipelines.temporal, handle.id, say),
        tell_unserved(pipelines.temporal, handle.id, say),
    ):
        return await pipelines.outcome(handle.id, handle.result_run_id)
