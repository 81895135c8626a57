"""Who serves a task queue: its pollers, their builds, and the build new work goes to.

A run whose workflow task no worker picks up waits in silence: Temporal keeps
the task on its queue until a worker of the right build polls, and a versioned
queue sends a new run only to its Worker Deployment's *current* build (a pinned
run only to its own). A worker of another build, or none at all, looks the same
from the run's side. This module says which it is, for ``aiworker run`` (one line
on stderr), the front door's status (``waiting_for_worker``) and ``aiworker
workers`` (a line per queue).

:func:`queue_service` is the one function that reads it: the workflow service's
``DescribeTaskQueue`` (classic mode) answers with the queue's pollers, each
with its deployment version (none for an unversioned worker), and the queue's
routing (its current and ramping version). A poller stays listed for minutes
after its worker stopped; a live idle one polls again at least every minute
(a long poll ends after one), so a poller not seen for
:data:`POLLER_LIVE_SECONDS` is taken for gone. :func:`unserved` decides from a
run's description whether its workflow task has waited
:data:`NOTICE_SECONDS` unpicked, and then reads the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio.api.enums.v1 import PendingWorkflowTaskState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError

from aiworker.workers.client.terminal import safe_text

# A workflow task waiting this long unpicked is worth a word (a worker picks one up
# in milliseconds; a busy one within a second or two).
NOTICE_SECONDS = 5.0
# A poller last seen longer ago than this is taken for gone: a live one polls again
# at least every minute (the server ends an idle long poll after one).
POLLER_LIVE_SECONDS = 90.0
# Temporal answers a describe in milliseconds; a hung one must not hold a caller.
DESCRIBE_TIMEOUT = timedelta(seconds=5)
# Pollers named in one line (a queue can have dozens).
MAX_NAMED_POLLERS = 5

Kind = Literal["workflow", "activity"]
_TYPES = {
    "workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}


@dataclass(frozen=True)
class Poller:
    """A worker seen polling a queue.

    Attributes:
        identity: the worker's identity (``pid@host`` by default).
        build_id: its build, ``None`` for an unversioned worker.
        deployment: its Worker Deployment, ``None`` for an unversioned worker.
        seconds_ago: when it last polled.
    """

    identity: str
    build_id: str | None
    deployment: str | None
    seconds_ago: float

    @property
    def live(self) -> bool:
        """Seen recently enough to be polling still (:data:`POLLER_LIVE_SECONDS`)."""
        return self.seconds_ago <= POLLER_LIVE_SECONDS

    def label(self) -> str:
        """``identity (build v2, 3s ago)``, printable on a terminal."""
        build = f"build {self.build_id}" if self.build_id else "unversioned"
        return f"{safe_text(self.identity)} ({safe_text(build)}, {self.seconds_ago:.0f}s ago)"

    def as_json(self) -> dict[str, Any]:
        """The JSON form (the front door's, ``aiworker workers --json``)."""
        return {
            "identity": self.identity,
            "build_id": self.build_id,
            "deployment": self.deployment,
            "seconds_ago": round(self.seconds_ago, 1),
            "live": self.live,
        }


@dataclass(frozen=True)
class QueueService:
    """One task queue of one kind: where its new work goes and who polls it.

    Attributes:
        task_queue: the queue.
        kind: ``workflow`` or ``activity`` (a queue name holds one of each).
        deployment: the Worker Deployment whose current build takes its new work,
            ``None`` when unversioned workers take it.
        current_build: that build, ``None`` when unversioned.
        ramping_build: a build that takes ``ramping_percentage`` of new work.
        ramping_percentage: its share.
        pollers: every poller the queue lists, live or not (:attr:`Poller.live`).
    """

    task_queue: str
    kind: Kind
    deployment: str | None
    current_build: str | None
    ramping_build: str | None
    ramping_percentage: float
    pollers: tuple[Poller, ...]

    def serving(self, build: str | None = None, deployment: str | None = None) -> list[Poller]:
        """The live pollers that take work of ``build`` of ``deployment`` (by default
        the current build; unversioned workers where there is none)."""
        if build is None:
            build, deployment = self.current_build, self.deployment
        if build is None:
            return [p for p in self.pollers if p.live and p.build_id is None]
        return [
            p
            for p in self.pollers
            if p.live and p.build_id == build and deployment in (None, p.deployment)
        ]

    @property
    def serves_current(self) -> bool:
        """A live poller takes the queue's new work."""
        return bool(self.serving())

    def target(self, build: str | None = None) -> str:
        """Which build the queue's work goes to, in words."""
        if build is not None and build != self.current_build:
            return f"build {safe_text(build)} (the run is pinned to it)"
        if self.current_build is None:
            return "unversioned workers (the queue has no current build)"
        where = f" of deployment {safe_text(self.deployment)}" if self.deployment else ""
        return f"build {safe_text(self.current_build)} (the current build{where})"

    def pollers_text(self) -> str:
        """The live pollers, a few by name; ``no poller`` when there is none."""
        live = [p for p in self.pollers if p.live]
        if not live:
            return "no poller"
        named = ", ".join(p.label() for p in live[:MAX_NAMED_POLLERS])
        more = len(live) - MAX_NAMED_POLLERS
        return named + (f" and {more} more" if more > 0 else "")

    def advice(self, build: str | None = None) -> str:
        """What to do so that the queue's work (of ``build``) is picked up."""
        wanted = build if build is not None else self.current_build
        others = sorted(
            {p.build_id for p in self.pollers if p.live and p.build_id not in (None, wanted)}
            - {None}
        )
        start = f"start a worker of build {safe_text(wanted)}" if wanted else "start a worker"
        if build is None and others:
            return (
                f"{start}, or make a polling build current: "
                f"aiworker deployment set-current {safe_text(str(others[0]))}"
            )
        return f"{start} on {safe_text(self.task_queue)} (aiworker worker, or aiworker dev)"

    def as_json(self) -> dict[str, Any]:
        """The JSON form (the front door's, ``aiworker workers --json``)."""
        return {
            "task_queue": self.task_queue,
            "kind": self.kind,
            "deployment": self.deployment,
            "current_build": self.current_build,
            "ramping_build": self.ramping_build,
            "ramping_percentage": self.ramping_percentage,
            "serves_current": self.serves_current,
            "pollers": [p.as_json() for p in self.pollers],
        }


async def queue_service(client: Client, task_queue: str, kind: Kind = "workflow") -> QueueService:
    """Where ``task_queue``'s new work of ``kind`` goes and who polls it (see the module).

    Raises:
        temporalio.service.RPCError: Temporal did not answer.
    """
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=_TYPES[kind],
        ),
        retry=True,
        timeout=DESCRIBE_TIMEOUT,
    )
    now = time.time()
    pollers = []
    for p in resp.pollers:
        options = p.deployment_options
        pollers.append(
            Poller(
                identity=p.identity,
                build_id=options.build_id or None,
                deployment=options.deployment_name or None,
                seconds_ago=max(0.0, now - p.last_access_time.ToMicroseconds() / 1e6)
                if p.HasField("last_access_time")
                else 0.0,
            )
        )
    routing = resp.versioning_info
    current = routing.current_deployment_version
    ramping = routing.ramping_deployment_version
    return QueueService(
        task_queue=task_queue,
        kind=kind,
        deployment=current.deployment_name or None,
        current_build=current.build_id or None,
        ramping_build=ramping.build_id or None,
        ramping_percentage=routing.ramping_version_percentage if ramping.build_id else 0.0,
        pollers=tuple(sorted(pollers, key=lambda p: p.seconds_ago)),
    )


@dataclass(frozen=True)
class Unserved:
    """A run whose workflow task has waited unpicked, and its queue as it stands.

    Attributes:
        workflow_id: the run's workflow id.
        waited_seconds: how long its workflow task has waited.
        pinned_build: the build the run is pinned to (it started on it), ``None``
            for a run that has not started: it goes to the queue's current build.
        queue: its workflow task queue.
    """

    workflow_id: str
    waited_seconds: float
    pinned_build: str | None
    queue: QueueService

    def message(self) -> str:
        """One line: the run, the queue, the build it waits for, the pollers seen,
        what to do."""
        q = self.queue
        served = q.serving(self.pinned_build) if self.pinned_build else q.serving()
        busy = "; they poll, so the task may be about to start" if served else ""
        return (
            f"no worker has picked up {safe_text(self.workflow_id)} for "
            f"{self.waited_seconds:.0f}s: task queue {safe_text(q.task_queue)} sends it to "
            f"{q.target(self.pinned_build)}; pollers seen: {q.pollers_text()}{busy}. "
            f"To go on: {q.advice(self.pinned_build)}"
        )

    def as_json(self) -> dict[str, Any]:
        """The front door's ``waiting_for_worker``."""
        q = self.queue
        served = q.serving(self.pinned_build) if self.pinned_build else q.serving()
        return {
            "task_queue": q.task_queue,
            "waited_seconds": round(self.waited_seconds, 1),
            "build_id": self.pinned_build or q.current_build,
            "current_build": q.current_build,
            "deployment": q.deployment,
            "served": bool(served),
            "pollers": [p.as_json() for p in q.pollers],
            "message": self.message(),
        }


def waiting_task(desc: WorkflowExecutionDescription, now: float | None = None) -> float | None:
    """How long a running workflow's workflow task has waited for a worker to pick
    it up (scheduled, not started), or ``None`` when none waits.

    A task past its first attempt is not counted: a worker took it and failed it
    (a bug in workflow code, which waits for a fixed build), and the server
    schedules its retries with a backoff; that is not a missing worker.
    """
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return None
    raw = desc.raw_description
    if not raw.HasField("pending_workflow_task"):
        return None
    task = raw.pending_workflow_task
    if task.state != PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
        return None
    if task.attempt > 1:
        return None
    since = task.original_scheduled_time if task.HasField("original_scheduled_time") else None
    if since is None and task.HasField("scheduled_time"):
        since = task.scheduled_time
    if since is None:
        return None
    clock = time.time() if now is None else now
    return max(0.0, clock - since.ToMicroseconds() / 1e6)


def pinned_build(desc: WorkflowExecutionDescription) -> str | None:
    """The build a run is pinned to (it ran a task there, or was moved there)."""
    info = desc.raw_description.workflow_execution_info.versioning_info
    if info.versioning_override.HasField("pinned"):
        return info.versioning_override.pinned.version.build_id or None
    return info.deployment_version.build_id or None


async def unserved(
    client: Client, desc: WorkflowExecutionDescription, notice_after: float = NOTICE_SECONDS
) -> Unserved | None:
    """The run of ``desc`` when its workflow task has waited ``notice_after``
    seconds unpicked, with its queue read now; else ``None`` (nothing read)."""
    waited = waiting_task(desc)
    if waited is None or waited < notice_after:
        return None
    queue = await queue_service(client, desc.task_queue, "workflow")
    return Unserved(desc.id, waited, pinned_build(desc), queue)


__all__ = [
    "NOTICE_SECONDS",
    "POLLER_LIVE_SECONDS",
    "Poller",
    "QueueService",
    "Unserved",
    "pinned_build",
    "queue_service",
    "queue_services",
    "unserved",
    "waiting_task",
]


async def queue_services(
    client: Client, queues: Iterable[tuple[str, Kind]]
) -> dict[tuple[str, Kind], QueueService | str]:
    """:func:`queue_service` of each queue, read together; a queue Temporal would
    not describe maps to why."""
    wanted = list(dict.fromkeys(queues))

    async def one(queue: str, kind: Kind) -> QueueService | str:
        try:
            return await queue_service(client, queue, kind)
        except RPCError as e:
            return f"not described: {e.message}"

    found = await asyncio.gather(*(one(q, k) for q, k in wanted))
    return dict(zip(wanted, found, strict=True))
