"""``aiworker cancel|terminate ID`` and ``aiworker cancel|terminate|redrive --query Q``.

Beside :mod:`aiworker.workers.cli.main` (which lists ``cancel`` and ``terminate`` in
its ``COMMANDS`` and sends ``redrive --query`` here). One id: the handle's
``cancel()`` / ``terminate()``. A query: :mod:`aiworker.workers.client.bulk` scopes
it (pipelines, one tenant unless ``--all-tenants``, the runs the action applies
to), counts what it matches, prints the count and the first ids and stops with
``--dry-run``, asks above :data:`~aiworker.workers.client.bulk.BULK_CONFIRM_THRESHOLD`
runs unless ``--yes`` (without a terminal to ask on: exit 2), then acts with
progress on stderr. Failures read as one line in ``cli.main``
(:func:`aiworker.workers.cli.errors.explain`): a refused query is exit 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiworker.schemas import names
from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    err,
    pipelines_session,
)
from aiworker.workers.client.terminal import safe_text


def bulk_tenant(args: argparse.Namespace) -> str | None:
    """The tenant a bulk action is scoped to: ``--tenant``, else the default
    tenant; None with ``--all-tenants``."""
    if args.all_tenants:
        return None
    return str(args.tenant or names.DEFAULT_TENANT)


def _confirm(action: str, count: int, tenant: str | None, yes: bool) -> bool | None:
    """True to go on, False declined, None: asked nowhere (no terminal, no --yes)."""
    from aiworker.workers.client.bulk import BULK_CONFIRM_THRESHOLD

    if yes or count <= BULK_CONFIRM_THRESHOLD:
        return True
    if not sys.stdin.isatty():
        return None
    scope = f"tenant {tenant!r}" if tenant is not None else "ALL tenants"
    sys.stderr.write(f"{action} {count} pipelines of {scope}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


async def cmd_cancel(args: argparse.Namespace) -> int:
    """``aiworker cancel ID`` or ``aiworker cancel --query Q``."""
    return await _stop(args, "cancel")


async def cmd_terminate(args: argparse.Namespace) -> int:
    """``aiworker terminate ID`` or ``aiworker terminate --query Q``."""
    return await _stop(args, "terminate")


def _one_of(args: argparse.Namespace) -> str | None:
    """Why the id / --query pair is wrong (exactly one is needed), or None."""
    if (args.workflow_id is None) == (args.query is None):
        return f"aiworker {args.command}: give a workflow id or --query, not both or neither"
    if args.workflow_id is not None and (
        args.dry_run or args.all_tenants or args.tenant or args.yes
    ):
        return "--dry-run, --yes, --tenant and --all-tenants go with --query"
    return None


async def _stop(args: argparse.Namespace, action: str) -> int:
    # the Temporal client loads inside the command, as the other commands' do
    from temporalio.client import WorkflowExecutionStatus

    from aiworker.workers.client.bulk import match, scoped_query, start_batch, wait_batch

    if why := _one_of(args):
        err(why)
        return EXIT_USAGE
    reason = args.reason or f"aiworker {action}"
    if args.workflow_id is not None:
        async with pipelines_session(
            args, f"aiworker {action} {args.workflow_id}", workflow_id=args.workflow_id
        ) as pipelines:
            handle = pipelines.get_handle(args.workflow_id)
            # the server takes a cancel request for an ended run without a word
            desc = await handle.describe()
            if desc.workflow_type != names.PIPELINE_WORKFLOW:
                # aiworker's own workflows (limiters, breakers, the registry) are not
                # the user's to stop from here: `temporal workflow ...` can
                err(f"{args.workflow_id} is a {desc.workflow_type} workflow, not a pipeline")
                return EXIT_USAGE
            status = desc.status
            if status != WorkflowExecutionStatus.RUNNING:
                ended = status.name.lower() if status else "ended"
                err(
                    f"workflow {args.workflow_id!r} has already ended ({ended}); only a "
                    f"running pipeline takes `aiworker {action}`"
                )
                return EXIT_FAILED
            if action == "cancel":
                await handle.cancel()
            else:
                await handle.terminate(reason=reason)
            print(args.workflow_id)
            err(f"{action} requested for {args.workflow_id}")
            return EXIT_OK
    tenant = bulk_tenant(args)
    query = scoped_query(args.query, tenant, "cancel" if action == "cancel" else "terminate")
    async with pipelines_session(args, f"aiworker {action} --query") as pipelines:
        client = pipelines.temporal
        found = await match(client, query)
        if not _show(found.count, found.first, action, args.dry_run):
            return EXIT_OK
        if (code := _asked(action, found.count, tenant, args.yes)) is not None:
            return code
        job = await start_batch(
            client, query, "cancel" if action == "cancel" else "terminate", reason
        )
        err(f"{action}: batch job {job} started for {found.count} pipelines")

        def progress(p: Any) -> None:
            err(f"{action}: {p.done}/{p.total} done, {p.failed} failed ({p.state})")

        end = await wait_batch(client, job, progress)
        print(job)
        return EXIT_OK if end.state == "completed" and end.failed == 0 else EXIT_FAILED


def _show(count: int, first: list[str], action: str, dry_run: bool) -> bool:
    """Print what matched (count, then the first ids); False when nothing is left to do."""
    more = f" (first {len(first)})" if count > len(first) else ""
    print(f"{count} pipelines match{more}")
    for wid in first:
        print(f"  {safe_text(wid)}")
    if dry_run:
        done = {"cancel": "cancelled", "terminate": "terminated"}.get(action, "redriven")
        err(f"dry run: nothing was {done}")
        return False
    return count > 0


def _asked(action: str, count: int, tenant: str | None, yes: bool) -> int | None:
    """None to go on; else the exit code (declined: 1, nowhere to ask: 2)."""
    from aiworker.workers.client.bulk import BULK_CONFIRM_THRESHOLD

    answer = _confirm(action, count, tenant, yes)
    if answer is None:
        err(
            f"{count} pipelines match, more than {BULK_CONFIRM_THRESHOLD}: pass --yes to "
            f"{action} them (stdin is not a terminal to ask on)"
        )
        return EXIT_USAGE
    if not answer:
        err("nothing done")
        return EXIT_FAILED
    return None


async def redrive_query(args: argparse.Namespace, inputs: dict[str, Any]) -> int:
    """``aiworker redrive --query Q``: every ended run that matches, one by one."""
    from aiworker.workers.client.bulk import match, redrive_all, scoped_query

    tenant = bulk_tenant(args)
    query = scoped_query(args.query, tenant, "redrive")
    async with pipelines_session(args, "aiworker redrive --query") as pipelines:
        found = await match(pipelines.temporal, query)
        if not _show(found.count, found.first, "redrive", args.dry_run):
            return EXIT_OK
        if (code := _asked("redrive", found.count, tenant, args.yes)) is not None:
            return code

        def progress(i: int, n: int, old: str, new: str | None, why: str | None) -> None:
            if new is not None:
                print(f"{old} -> {new}")
                err(f"redrive {i}/{n}: {old} as {new}")
            else:
                err(f"redrive {i}/{n}: {old} not redriven: {why}")

        out = await redrive_all(
            pipelines,
            query,
            tenant=tenant,
            from_step=args.from_step,
            inputs=inputs,
            new_idempotency_keys=args.new_idempotency_keys,
            on_progress=progress,
        )
        err(f"redrive: {len(out.started)} started, {len(out.refused)} not redriven")
        return EXIT_FAILED if out.refused else EXIT_OK
