"""Pipelines on a schedule: Temporal Schedules whose action starts a pipeline.

A schedule is Temporal's own (``Client.create_schedule``): the server keeps
it and starts each run, and the Temporal UI's Schedules page and ``temporal
schedule describe|trigger|toggle|delete`` show and change it like any other.
Its action starts ``PipelineWorkflow`` exactly as
:meth:`~aiworker.workers.client.client.PipelineClient.start` does (the same task
queue, search attributes and summary:
:meth:`~aiworker.workers.client.client.PipelineClient.start_options`); the pipeline
is checked first, as ``aiworker run`` checks it, and encoded once, when the
schedule is created, by the client's data converter (external storage
included), so every run starts from the same input. A pipeline that declares
``flow`` cannot be started by the server directly (its starts go through the
key's flow workflow): its schedule's action starts
:class:`~aiworker.workflows.flow.ScheduledFlowStartWorkflow`, whose one activity
makes the start as ``aiworker run`` does and returns the flow's answer.

Each run's workflow id is the action's workflow id (the schedule id unless
``workflow_id`` says otherwise) with the run's nominal time appended by the
server: ``nightly-2025-06-01T02:00:00Z``. A pipeline's idempotency keys are
``{workflow_id}/{step}[/{item}]``, so each run has keys of its own and every
retry of a step inside one run repeats them: a scheduled publish writes once
per run, however often its activity is delivered.

The schedule itself carries the pipeline's tenant and name as search
attributes, which ``aiworker schedule list --tenant/--pipeline`` filters on.
How a schedule's times are written and read back:
:mod:`aiworker.workers.schedules.specs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, get_args

from temporalio.client import (
    Client,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    WorkflowExecutionStatus,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names
from aiworker.schemas.pipeline import TerminalStatus
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.flow_start import plan_flow_start
from aiworker.workers.client.visibility import quote
from aiworker.workers.schedules.specs import (
    OVERLAP_NAMES,
    ScheduleOptions,
    ScheduleSpecError,
    calendar_text,
    format_duration,
    interval_text,
    spec_text,
)
from aiworker.workflows.flow import ScheduledFlowStartWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow

__all__ = [
    "ScheduleExistsError",
    "ScheduleOptions",
    "ScheduleSpecError",
    "ScheduleSummary",
    "create_schedule",
    "describe_schedule",
    "list_schedules",
    "trigger_schedule",
]


class ScheduleExistsError(ValueError):
    """A schedule with this id exists already; nothing was changed."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(
            f"schedule {schedule_id!r} already exists; delete it first "
            f"(`aiworker schedule delete {schedule_id}`) or pick another --schedule-id"
        )
        self.schedule_id = schedule_id


def _iso(moment: datetime | None) -> str | None:
    """A UTC time in whole seconds (``2025-06-01T02:00:00Z``), as run ids carry it."""
    if moment is None:
        return None
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _refused_spec(e: RPCError, options: ScheduleOptions) -> ScheduleSpecError:
    """The flag Temporal's refusal of a schedule spec is about, and its reason."""
    reason = e.message.removeprefix("Invalid schedule spec: ")
    lowered = reason.lower()
    if "time zone" in lowered:
        return ScheduleSpecError(f"--time-zone {options.time_zone!r}", reason)
    if "interval" in lowered:
        return ScheduleSpecError("--interval", reason)
    if "jitter" in lowered:
        return ScheduleSpecError("--jitter", reason)
    flag = f"--cron {options.cron[0]!r}" if len(options.cron) == 1 else "--cron"
    return ScheduleSpecError(flag, reason)


async def create_schedule(
    pipelines: PipelineClient,
    schedule_id: str,
    pipeline: Mapping[str, Any],
    options: ScheduleOptions,
    *,
    workflow_id: str | None = None,
    check: bool = True,
) -> ScheduleHandle:
    """Create a schedule that starts ``pipeline`` as ``aiworker run`` would.

    Args:
        pipelines: the client (its data converter encodes the pipeline once).
        schedule_id: the schedule's id.
        pipeline: the pipeline spec as JSON.
        options: when and how it runs.
        workflow_id: each run's workflow id before the server appends its
            nominal time; the schedule id when omitted.
        check: check the pipeline first (:meth:`PipelineClient.check_live`).

    Returns:
        The new schedule's handle.

    Raises:
        PipelineSpecError: the pipeline is invalid (its ``flow`` key resolves to
            nothing or too much from the fixed inputs); nothing was created.
        ScheduleSpecError: no time given, or Temporal refused one (a bad cron
            line, an unknown time zone); nothing was created.
        ScheduleExistsError: a schedule with this id exists already.
    """
    if not options.cron and not options.intervals:
        raise ScheduleSpecError("--cron/--interval", "a schedule needs a cron line or an interval")
    if check:
        await pipelines.check_live(pipeline)
    start = pipelines.start_options(pipeline)
    name = str(pipeline.get("name") or "pipeline")
    tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
    # the key resolves from the schedule's fixed inputs: a bad one is refused here
    plan = plan_flow_start(pipeline, pipelines.settings.task_queue_suffix)
    if plan is not None:
        # the server cannot send a start through the key's flow workflow: it starts
        # a ScheduledFlowStart, whose activity does, as `aiworker run` would
        action = ScheduleActionStartWorkflow(
            ScheduledFlowStartWorkflow.run,
            dict(pipeline),
            id=workflow_id or schedule_id,
            task_queue=start.pop("task_queue"),
            typed_search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(names.TENANT_KEY, tenant),
                    SearchAttributePair(names.PIPELINE_KEY, name),
                ]
            ),
            static_summary=f"scheduled start of pipeline {name} (tenant {tenant}) "
            f"through its flow ({plan.mode}, key {plan.key})",
            priority=start["priority"],
        )
    else:
        action = ScheduleActionStartWorkflow(
            PipelineWorkflow.run,
            dict(pipeline),
            id=workflow_id or schedule_id,
            task_queue=start.pop("task_queue"),
            typed_search_attributes=start.pop("search_attributes"),
            **start,
        )
    try:
        return await pipelines.temporal.create_schedule(
            schedule_id,
            options.schedule(action),
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(names.TENANT_KEY, tenant),
                    SearchAttributePair(names.PIPELINE_KEY, name),
                ]
            ),
        )
    except ScheduleAlreadyRunningError:
        raise ScheduleExistsError(schedule_id) from None
    except RPCError as e:
        if e.status == RPCStatusCode.INVALID_ARGUMENT and "schedule spec" in e.message:
            raise _refused_spec(e, options) from None
        raise


@dataclass(frozen=True)
class ScheduleSummary:
    """One pipeline schedule as ``aiworker schedule list`` shows it.

    Attributes:
        schedule_id: the schedule's id.
        pipeline: the pipeline's name.
        tenant: the tenant it runs for.
        spec: when it runs (:func:`spec_text`).
        next_run: its next run's time, if any.
        paused: whether it is paused.
        note: its note.
    """

    schedule_id: str
    pipeline: str | None
    tenant: str | None
    spec: str
    next_run: datetime | None
    paused: bool
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """The row as ``aiworker schedule list --json`` prints it."""
        return {
            "schedule_id": self.schedule_id,
            "pipeline": self.pipeline,
            "tenant": self.tenant,
            "spec": self.spec,
            "next_run": _iso(self.next_run),
            "paused": self.paused,
            "note": self.note,
        }


async def list_schedules(
    client: Client, *, tenant: str | None = None, pipeline: str | None = None
) -> list[ScheduleSummary]:
    """The namespace's pipeline schedules, filtered by tenant and pipeline name.

    The list comes from the visibility store: a schedule just created or
    deleted shows there shortly after.
    """
    terms = [
        f"{k} = {quote(v)}"
        for k, v in ((names.SA_TENANT, tenant), (names.SA_PIPELINE, pipeline))
        if v
    ]
    out: list[ScheduleSummary] = []
    async for s in await client.list_schedules(" AND ".join(terms) or None):
        if s.schedule is None or getattr(s.schedule.action, "workflow", None) not in (
            names.PIPELINE_WORKFLOW,
            names.FLOW_SCHEDULED_WORKFLOW,
        ):
            continue  # another workflow's schedule
        sa = s.typed_search_attributes
        times = s.info.next_action_times if s.info else []
        out.append(
            ScheduleSummary(
                schedule_id=s.id,
                pipeline=sa.get(names.PIPELINE_KEY),
                tenant=sa.get(names.TENANT_KEY),
                spec=spec_text(s.schedule.spec),
                next_run=times[0] if times else None,
                paused=s.schedule.state.paused,
                note=s.schedule.state.note,
            )
        )
    return sorted(out, key=lambda row: row.schedule_id)


# The terminal statuses a pipeline fails or cancels its execution with.
_ENDED_BY_PIPELINE = frozenset(get_args(TerminalStatus)) - set(names.OK_STATUSES)


async def run_status(client: Client, workflow_id: str, run_id: str | None = None) -> str:
    """How a scheduled run stands: the pipeline's status (``succeeded``, ``partial``,
    ``awaiting_review``, ``budget_exhausted``...) while it runs or once it ended
    with one (completed, or failed or cancelled by the pipeline itself), else
    Temporal's (``failed``, ``terminated``...); ``unknown`` once the run is gone."""
    try:
        desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return "unknown"
        raise
    execution = desc.status or WorkflowExecutionStatus.RUNNING
    own = desc.typed_search_attributes.get(names.STATUS_KEY)
    if own and execution in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
        return own
    # a pipeline that did not succeed fails (or cancels) its execution with its
    # terminal status set; a terminate or a timeout leaves a running one behind
    ended_by_pipeline = execution in (
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
    )
    if own is not None and ended_by_pipeline and own in _ENDED_BY_PIPELINE:
        return own
    return execution.name.lower()


def _action_workflow_id(result: Any) -> str | None:
    return getattr(result.action, "workflow_id", None)


async def describe_schedule(client: Client, schedule_id: str) -> dict[str, Any]:
    """A schedule as one JSON document: its action, spec, policy, state, recent runs
    (each with its workflow id and status) and next run times.

    Raises:
        temporalio.service.RPCError: ``NOT_FOUND`` when there is no such schedule.
    """
    desc = await client.get_schedule_handle(schedule_id).describe()
    return await _describe(client, desc)


async def _describe(client: Client, desc: ScheduleDescription) -> dict[str, Any]:
    sched, info = desc.schedule, desc.info
    action = sched.action
    recent = [r for r in info.recent_actions if _action_workflow_id(r)]
    statuses = await asyncio.gather(
        *(
            run_status(client, r.action.workflow_id, r.action.first_execution_run_id)  # type: ignore[attr-defined]
            for r in recent
        )
    )
    sa = desc.typed_search_attributes
    spec = sched.spec
    return {
        "schedule_id": desc.id,
        "pipeline": sa.get(names.PIPELINE_KEY),
        "tenant": sa.get(names.TENANT_KEY),
        "workflow_type": getattr(action, "workflow", None),
        "workflow_id": getattr(action, "id", None),
        "task_queue": getattr(action, "task_queue", None),
        "spec": {
            "text": spec_text(spec),
            "cron": [*spec.cron_expressions, *(calendar_text(c) for c in spec.calendars)],
            "intervals": [interval_text(i).removeprefix("every ") for i in spec.intervals],
            "time_zone": spec.time_zone_name,
            "jitter": format_duration(spec.jitter) if spec.jitter else None,
            "start_at": _iso(spec.start_at),
            "end_at": _iso(spec.end_at),
        },
        "policy": {
            "overlap": OVERLAP_NAMES.get(sched.policy.overlap, "Skip"),
            "catchup_window": format_duration(sched.policy.catchup_window)
            if sched.policy.catchup_window
            else None,
            "pause_on_failure": sched.policy.pause_on_failure,
        },
        "state": {"paused": sched.state.paused, "note": sched.state.note},
        "actions": {
            "total": info.num_actions,
            "skipped_overlap": info.num_actions_skipped_overlap,
            "missed_catchup_window": info.num_actions_missed_catchup_window,
        },
        "running": [getattr(r, "workflow_id", None) for r in info.running_actions],
        "recent": [
            {
                "workflow_id": r.action.workflow_id,  # type: ignore[attr-defined]
                "scheduled_at": _iso(r.scheduled_at),
                "started_at": _iso(r.started_at),
                "status": status,
            }
            for r, status in zip(recent, statuses, strict=True)
        ],
        "next_runs": [_iso(t) for t in info.next_action_times],
        "created_at": _iso(info.created_at),
        "updated_at": _iso(info.last_updated_at),
    }


@dataclass(frozen=True)
class Triggered:
    """What a trigger did: the run it started, or that the overlap policy skipped it.

    Attributes:
        workflow_id: the started run's workflow id (None: skipped, or not yet seen).
        skipped: the overlap policy skipped the run (one is still running).
    """

    workflow_id: str | None
    skipped: bool


async def trigger_schedule(
    client: Client,
    schedule_id: str,
    *,
    overlap: ScheduleOverlapPolicy | None = None,
    wait_seconds: float = 10.0,
) -> Triggered:
    """Run a schedule's action now, then watch (bounded) whether it started a run.

    Args:
        client: the Temporal client.
        schedule_id: the schedule.
        overlap: this run's overlap policy (default the schedule's).
        wait_seconds: how long to watch for the run before answering.

    Raises:
        temporalio.service.RPCError: ``NOT_FOUND`` when there is no such schedule.
    """
    handle = client.get_schedule_handle(schedule_id)
    before = (await handle.describe()).info
    await handle.trigger(overlap=overlap)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while True:
        info = (await handle.describe()).info
        if info.num_actions > before.num_actions:
            started = [_action_workflow_id(r) for r in info.recent_actions]
            return Triggered(started[-1] if started else None, skipped=False)
        if info.num_actions_skipped_overlap > before.num_actions_skipped_overlap:
            return Triggered(None, skipped=True)
        if loop.time() >= deadline:
            return Triggered(None, skipped=False)
        await asyncio.sleep(0.2)
