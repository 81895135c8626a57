"""``aiworker deployment list|versions|set-current|ramp|drain``: rolling deploys.

Beside :mod:`aiworker.workers.cli.main` (which lists :func:`cmd_deployment` in its
``COMMANDS``). Each command is a thin layer over
:mod:`aiworker.workers.process.deployments` and the same requests the
``temporal worker deployment ...`` commands send; the deployment defaults to
this stack's (``AIWORKER_DEPLOYMENT_NAME`` plus the task-queue suffix). Exit
codes: 0 done (``drain``: nothing left running), 1 Temporal refused or (``drain``)
runs still open, 2 bad usage, 3 no such deployment or build.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion

from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    command_client,
    command_settings,
    err,
)
from aiworker.workers.client.terminal import safe_text
from aiworker.workers.process.deployments import (
    DeploymentError,
    DeploymentState,
    deployment_name,
    describe_deployment,
    list_deployments,
    running_on,
    set_current,
    set_ramping,
)

# How often ``drain --wait`` asks again.
DRAIN_POLL_SECONDS = 1.0


async def _connect(args: argparse.Namespace) -> tuple[Client, str]:
    settings = command_settings(args)
    client = await command_client(args)
    return client, getattr(args, "deployment_name", None) or deployment_name(settings)


def _print_state(state: DeploymentState) -> None:
    ramp = f", ramping {state.ramping} at {state.ramp_percentage:g}%" if state.ramping else ""
    # build ids are whatever a worker process registered: escaped
    ramp = ramp and safe_text(ramp)
    print(f"deployment {safe_text(state.name)}: current {safe_text(state.current or 'none')}{ramp}")
    width = max([8, *(len(safe_text(v.build_id)) for v in state.versions)])
    print(f"{'build id':<{width}} {'status':<9} {'open runs':>9}  created")
    for v in state.versions:
        runs = "?" if v.running is None else str(v.running)
        print(f"{safe_text(v.build_id):<{width}} {safe_text(v.status):<9} {runs:>9}  {v.created}")


async def _list(args: argparse.Namespace, client: Client, name: str) -> int:
    names = await list_deployments(client)
    print(json.dumps(names) if args.json else "\n".join(names) or "no worker deployments")
    return EXIT_OK


async def _versions(args: argparse.Namespace, client: Client, name: str) -> int:
    state = await describe_deployment(client, name)
    if args.json:
        print(json.dumps(state.as_json(), indent=2))
    else:
        _print_state(state)
    return EXIT_OK


async def _set_current(args: argparse.Namespace, client: Client, name: str) -> int:
    await set_current(client, name, args.build_id)
    state = await describe_deployment(client, name)
    if args.json:
        print(json.dumps(state.as_json(), indent=2))
    else:
        print(f"{name}: {args.build_id} is current; new pipelines start on it")
        _print_state(state)
    return EXIT_OK


async def _ramp(args: argparse.Namespace, client: Client, name: str) -> int:
    if args.stop:
        await set_ramping(client, name, None, 0.0)
        print(f"{name}: ramping stopped; new pipelines go to the current build")
        return EXIT_OK
    if args.build_id is None or args.percent is None or not 0 <= args.percent <= 100:
        err("deployment ramp: give BUILD_ID and PERCENT (0-100), or --stop")
        return EXIT_USAGE
    await set_ramping(client, name, args.build_id, args.percent)
    print(f"{name}: {args.percent:g}% of new pipelines go to {args.build_id}")
    return EXIT_OK


async def _drain(args: argparse.Namespace, client: Client, name: str) -> int:
    version = WorkerDeploymentVersion(name, args.build_id)
    deadline = time.monotonic() + max(0.0, args.wait)
    while True:
        state = await describe_deployment(client, name, count=False)
        v = state.version(args.build_id)
        if v is None:
            raise DeploymentError(f"deployment {name} has no build {args.build_id!r}", True)
        running = await running_on(client, version)
        if v.status in ("current", "ramping"):
            what = f"is {v.status}: it still gets new pipelines"
            code = EXIT_FAILED
        elif running:
            what = f"is {v.status}: {running} run(s) still open on it"
            code = EXIT_FAILED
        else:
            what = "has no open runs: its workers can be stopped"
            code = EXIT_OK
        if code == EXIT_OK or time.monotonic() >= deadline:
            break
        await asyncio.sleep(DRAIN_POLL_SECONDS)
    if args.json:
        print(json.dumps({"build_id": args.build_id, "status": v.status, "running": running}))
    else:
        print(f"{name}/{args.build_id} {what}")
    return code


_ACTIONS: dict[str, Callable[[argparse.Namespace, Client, str], Coroutine[Any, Any, int]]] = {
    "list": _list,
    "versions": _versions,
    "set-current": _set_current,
    "ramp": _ramp,
    "drain": _drain,
}


async def cmd_deployment(args: argparse.Namespace) -> int:
    """``aiworker deployment ACTION``: one line on stderr and exit 1 or 3 when refused."""
    client, name = await _connect(args)
    try:
        return await _ACTIONS[args.action](args, client, name)
    except DeploymentError as e:
        err(str(e))
        return EXIT_NOT_FOUND if e.not_found else EXIT_FAILED
