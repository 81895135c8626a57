"""``aiworker schedule create|list|describe|pause|unpause|trigger|delete``.

Beside :mod:`aiworker.workers.cli.main` (which lists :func:`cmd_schedule` in its
``COMMANDS``); the Temporal client and the schedule modules load inside each
command. The commands over :mod:`aiworker.workers.schedules.schedules`: each prints a line a
person reads (or JSON with ``--json``); what Temporal refuses (no such
schedule, an id that exists, a bad cron line) ends in one line and an exit
code through :mod:`aiworker.workers.cli.errors`, like every other command.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    command_client,
    command_settings,
    configure_logs,
    err,
    read_checked_pipeline,
)
from aiworker.workers.client.terminal import safe_text

if TYPE_CHECKING:
    from aiworker.workers.client.client import PipelineClient


async def _client(args: argparse.Namespace, *, storage: bool = False) -> PipelineClient:
    """The pipeline client; with ``storage``, reading and writing large payloads in
    the configured external storage (the pipeline a schedule starts may be large)."""
    from aiworker.workers.client.client import PipelineClient

    settings = command_settings(args)
    configure_logs(settings)
    if storage or getattr(args, "_client", None) is not None:
        # the command's one connection (command_client): a create checked its
        # pipeline through it; it carries the settings' payload storage
        return PipelineClient(await command_client(args), settings)
    return await PipelineClient.connect(args.profile, target_host=args.address)


async def schedule_create(args: argparse.Namespace) -> int:
    """``aiworker schedule create FILE``: check the pipeline, then create its schedule."""
    from aiworker.workers.process.resources import close_connections
    from aiworker.workers.schedules.schedules import create_schedule, describe_schedule
    from aiworker.workers.schedules.specs import ScheduleOptions

    # exit 2 naming each problem (against the live registry's workers): nothing created
    pipeline = await read_checked_pipeline(args)
    schedule_id = args.schedule_id or str(pipeline["name"])
    args.schedule_id = schedule_id  # for the error line (cli_errors)
    options = ScheduleOptions(
        cron=args.cron or (),
        intervals=args.interval or (),
        time_zone=args.time_zone,
        jitter=args.jitter,
        catchup_window=args.catchup_window,
        overlap=args.overlap_policy,
        pause_on_failure=args.pause_on_failure,
        note=args.notes,
        paused=args.paused,
    )
    pipelines = await _client(args, storage=True)
    try:
        await create_schedule(
            pipelines, schedule_id, pipeline, options, workflow_id=args.workflow_id, check=False
        )
    finally:
        await close_connections()  # the S3 client a large pipeline may have used
    doc = await describe_schedule(pipelines.temporal, schedule_id)
    nxt = "paused" if args.paused else f"next run {(doc['next_runs'] or ['-'])[0]}"
    print(
        f"created schedule {schedule_id!r}: {doc['spec']['text']}; {nxt}; "
        f"runs start as workflow {doc['workflow_id']}-<time>"
    )
    return EXIT_OK


async def schedule_list(args: argparse.Namespace) -> int:
    """``aiworker schedule list``: one line per pipeline schedule, or JSON."""
    from aiworker.workers.schedules.schedules import list_schedules

    pipelines = await _client(args)
    rows = await list_schedules(pipelines.temporal, tenant=args.tenant, pipeline=args.pipeline)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return EXIT_OK
    width = max([11, *(len(safe_text(r.schedule_id)) for r in rows)])
    print(f"{'schedule id':<{width}} {'pipeline':<20} {'next run':<21} {'paused':<6} spec")
    for r in rows:
        nxt = r.to_json()["next_run"] or "-"
        print(
            f"{safe_text(r.schedule_id):<{width}} {safe_text(r.pipeline or '-'):<20} {nxt:<21} "
            f"{'yes' if r.paused else 'no':<6} {safe_text(r.spec)}"
        )
    return EXIT_OK


def render_description(doc: dict[str, Any]) -> str:
    """``aiworker schedule describe``'s text: spec, state, recent runs, next runs."""
    policy, state, actions = doc["policy"], doc["state"], doc["actions"]
    lines = [
        f"schedule     {doc['schedule_id']}",
        f"pipeline     {doc['pipeline'] or '-'} (tenant {doc['tenant'] or '-'})",
        f"starts       {doc['workflow_type']} on {doc['task_queue']} "
        f"as workflow {doc['workflow_id']}-<time>",
        f"spec         {doc['spec']['text']}",
        f"policy       overlap {policy['overlap']}, catch-up window "
        f"{policy['catchup_window'] or 'default'}, pause on failure "
        f"{'yes' if policy['pause_on_failure'] else 'no'}",
        f"state        {'paused' if state['paused'] else 'active'}"
        + (f" ({state['note']})" if state["note"] else ""),
        f"actions      {actions['total']} started, {actions['skipped_overlap']} skipped "
        f"(overlap), {actions['missed_catchup_window']} missed (catch-up window)",
        "recent runs" + ("" if doc["recent"] else "  none"),
    ]
    for r in doc["recent"]:
        lines.append(f"  {r['scheduled_at']}  {r['workflow_id']}  {r['status']}")
    lines.append("next runs" + ("" if doc["next_runs"] else "    none"))
    lines.extend(f"  {t}" for t in doc["next_runs"][:5])
    return "\n".join(lines)


async def schedule_describe(args: argparse.Namespace) -> int:
    """``aiworker schedule describe ID``: the schedule, its recent and next runs."""
    from aiworker.workers.schedules.schedules import describe_schedule

    pipelines = await _client(args)
    doc = await describe_schedule(pipelines.temporal, args.schedule_id)
    print(json.dumps(doc, indent=2) if args.json else render_description(doc))
    return EXIT_OK


async def schedule_pause(args: argparse.Namespace) -> int:
    """``aiworker schedule pause|unpause ID``: stop or resume its runs."""
    pipelines = await _client(args)
    handle = pipelines.temporal.get_schedule_handle(args.schedule_id)
    if args.action == "pause":
        await handle.pause(note=args.note or "paused with `aiworker schedule pause`")
    else:
        await handle.unpause(note=args.note or "unpaused with `aiworker schedule unpause`")
    print(f"schedule {args.schedule_id!r} {args.action}d")
    return EXIT_OK


async def schedule_trigger(args: argparse.Namespace) -> int:
    """``aiworker schedule trigger ID``: one run now, under the overlap policy."""
    from aiworker.workers.schedules.schedules import trigger_schedule

    pipelines = await _client(args)
    done = await trigger_schedule(pipelines.temporal, args.schedule_id, overlap=args.overlap_policy)
    if done.skipped:
        err(
            f"schedule {args.schedule_id!r}: the run was skipped, one is still running "
            "(overlap policy); `--overlap-policy AllowAll` starts one beside it"
        )
        return EXIT_FAILED
    started = f"started workflow {done.workflow_id}" if done.workflow_id else "run not seen yet"
    print(f"triggered schedule {args.schedule_id!r}: {started}")
    return EXIT_OK


async def schedule_delete(args: argparse.Namespace) -> int:
    """``aiworker schedule delete ID``: no more runs; the runs it started go on."""
    pipelines = await _client(args)
    await pipelines.temporal.get_schedule_handle(args.schedule_id).delete()
    print(f"deleted schedule {args.schedule_id!r} (the runs it started are not affected)")
    return EXIT_OK


ACTIONS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "create": schedule_create,
    "list": schedule_list,
    "describe": schedule_describe,
    "pause": schedule_pause,
    "unpause": schedule_pause,
    "trigger": schedule_trigger,
    "delete": schedule_delete,
}


async def cmd_schedule(args: argparse.Namespace) -> int:
    """``aiworker schedule create|list|describe|pause|unpause|trigger|delete``; the
    schedule id may come as an argument or, as ``temporal schedule`` takes it, as
    ``-s/--schedule-id``."""
    if args.action not in ("create", "list"):
        args.schedule_id = args.schedule_id or args.schedule_id_flag
        if not args.schedule_id:
            err(f"schedule {args.action}: give the schedule id (SCHEDULE_ID or -s ID)")
            return EXIT_USAGE
    return await ACTIONS[args.action](args)


__all__ = ["cmd_schedule", "render_description"]
