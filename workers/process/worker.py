"""The worker process: polls the configured task queues until told to stop.

``aiworker worker [--task-queue Q ...]`` (or ``AIWORKER_TASK_QUEUES``) runs
one Temporal worker per queue in one process. On SIGTERM or SIGINT it stops
polling, lets running activities finish within the graceful-shutdown
timeout, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.extras import MissingExtraError
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.errors import StartupError
from aiworker.workers.process.deployments import deployment_config
from aiworker.workers.process.plugin import AiworkerPlugin
from aiworker.workers.process.probes import Health
from aiworker.workers.process.task_queues import all_queues
from aiworker.workers.process.worker_set import (
    PluginError,
    WorkerSet,
    builtin_set,
    install,
    load_workers,
)

log = logging.getLogger("aiworker.process")


async def ensure_search_attributes(client: Client) -> None:
    """Register aiworker's search attributes, or explain how to."""
    svc = client.operator_service
    resp = await svc.list_search_attributes(ListSearchAttributesRequest(namespace=client.namespace))
    missing = [n for n in names.SEARCH_ATTRIBUTES if n not in resp.custom_attributes]
    if not missing:
        return
    try:
        await svc.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for n in missing},
            )
        )
    except Exception as e:
        cmds = "; ".join(
            f"temporal operator search-attribute create --name {n} --type Keyword" for n in missing
        )
        raise StartupError(
            f"search attributes {missing} are not registered in namespace "
            f"{client.namespace!r} and could not be added ({e}); run: {cmds}"
        ) from e


def load_process_workers(settings: Settings) -> WorkerSet:
    """Every worker this process knows (built-ins, plugins, spec files), installed as
    the catalog its workflows read; a broken plugin stops the process here."""
    try:
        return install(load_workers(settings))
    except PluginError as e:
        raise StartupError(str(e)) from None


def build_workers(
    client: Client,
    settings: Settings,
    runtime: WorkerRuntime,
    queues: Sequence[str],
    replace: Mapping[str, Callable[..., Any]] | None = None,
    workers: WorkerSet | None = None,
) -> list[Worker]:
    """One Temporal worker per base queue (with the deployment suffix).

    ``workers`` are the AI workers to serve (the built-ins when omitted);
    ``replace`` maps worker ids to same-name stand-in activities (tests and
    local development stand in for a worker that is not deployed).
    """
    served = workers if workers is not None else builtin_set()
    known = all_queues(runtime.specs, served)
    unknown = [q for q in queues if q not in known]
    if unknown:
        raise StartupError(f"unknown task queue(s) {unknown}; known: {', '.join(known)}")
    versioned = deployment_config(settings)  # None: unversioned (settings built in code)
    out = []
    for q in queues:
        # one wiring: the process's Worker is built with the plugin users embed
        try:
            plugin = AiworkerPlugin(
                settings, queue=q, workers=served, runtime=runtime, replace=replace
            )
        except MissingExtraError as e:  # the queue was named: say which extra to install
            raise StartupError(f"cannot serve task queue {q!r}: {e}") from None
        out.append(
            Worker(
                client,
                task_queue=settings.queue(q),
                # workflows, activities, sandbox pass-throughs and the telemetry
                # interceptor (after the client's TracingInterceptor: each call's
                # span sits in RunActivity) come from the plugin
                plugins=[plugin],
                max_concurrent_activities=settings.max_concurrent_activities,
                max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
                max_concurrent_activity_task_polls=settings.pollers,
                max_concurrent_workflow_task_polls=settings.pollers,
                graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
                # An activity without a heartbeat timeout (a streaming llm-call) would
                # reach the server every 30 s; its progress is read live (describe).
                default_heartbeat_throttle_interval=timedelta(seconds=1),
                # One Worker Deployment version per process (workers/process/deployments.py).
                deployment_config=versioned,
            )
        )
    return out


async def watch_connection(
    client: Client,
    health: Health,
    stop: asyncio.Event,
    *,
    interval: float = 5.0,
    probe_timeout: float = 5.0,
) -> None:
    """Probe the Temporal frontend every ``interval`` seconds until ``stop``; flip readiness.

    A worker whose server is gone keeps running (the SDK reconnects), but it
    polls nothing: /readyz says so, and why, until the server answers again.
    """
    target = client.service_client.config.target_host
    while not stop.is_set():
        try:
            await client.workflow_service.get_system_info(
                GetSystemInfoRequest(), timeout=timedelta(seconds=probe_timeout)
            )
        except Exception as e:
            if health.ready:
                log.warning(
                    "temporal.unreachable",
                    extra={
                        "aiworker": {
                            "event": "temporal_unreachable",
                            "target": target,
                            "error": str(e),
                        }
                    },
                )
            # /readyz may be reachable by more than the operator: the address and
            # the error's text stay in the log
            health.set_connected(False, "cannot reach Temporal")
        else:
            health.set_connected(True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


_frozen = False


def freeze_startup_heap() -> bool:
    """Move every object alive now out of the collector's sight; once per process.

    A worker process imports the SDK, protobufs, pydantic models and every
    worker before it polls: a few hundred thousand objects that live as long as
    the process. CPython's full collection (every ~1,000 pages of a crawl, say)
    walks all of them each time, ~65 ms at a time, about 0.13 ms of CPU a page.
    :func:`gc.freeze` (what CPython's documentation advises for long-lived
    servers; Instagram's Django fleet does the same) keeps them out of every
    later collection. A collection first, so no garbage is frozen; the objects
    are still freed by reference counting; only a cycle among them that dies
    later is never collected, which is the startup heap's size at most.

    Returns whether this call froze (a second one in the same process does not:
    in a test process, it would freeze the earlier tests' live objects).
    """
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True


async def run_until_stopped(
    workers: Sequence[Worker],
    stop: asyncio.Event,
    health: Health | None = None,
    *,
    probe_interval: float = 5.0,
) -> None:
    """Run ``workers`` until ``stop`` is set, then shut them down gracefully."""
    tasks = [asyncio.create_task(w.run()) for w in workers]
    watch: asyncio.Task[None] | None = None
    if health:
        health.set(True, "polling " + ", ".join(w.task_queue for w in workers))
        if workers:
            watch = asyncio.create_task(
                watch_connection(workers[0].client, health, stop, interval=probe_interval)
            )
    stop_task = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stop_task, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t in done and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        if health:
            health.set(False, "shutting down")
        log.info("worker.draining", extra={"aiworker": {"event": "worker_draining"}})
        await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        stop_task.cancel()
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch


def install_signal_handlers(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (drain, then exit 0)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
