"""The worker process: polls the configured task queues until told to stop.

``aiworker worker [--task-queue Q ...]`` (or ``AIWORKER_TASK_QUEUES``) runs
one Temporal worker per queue in one process. On SIGTERM or SIGINT it stops
polling, lets running activities finish within the graceful-shutdown
timeout, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from aiworker.activities.metrics import WorkerMetrics
from aiworker.activities.runtime import WorkerRuntime
from aiworker.schemas import catalog, names
from aiworker.schemas.extras import MissingExtraError
from aiworker.schemas.settings import Settings
from aiworker.schemas.spec import PromptImplementation
from aiworker.workers.deployments import deployment_config
from aiworker.workers.errors import StartupError
from aiworker.workers.http_server import Health
from aiworker.workers.plugin import AiworkerPlugin
from aiworker.workers.plugins import PluginError, WorkerSet, builtin_set, install, load_workers
from aiworker.workers.registry import all_queues

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


def build_runtime(
    settings: Settings,
    metrics: WorkerMetrics | None = None,
    tools: dict[str, Any] | None = None,
    workers: WorkerSet | None = None,
) -> WorkerRuntime:
    """The runtime shared by every activity of this process (under ``workers``' specs,
    else the installed catalog's)."""
    from aiworker.workers.logs import redact_also
    from aiworker.workers.resources import build_tools

    runtime = WorkerRuntime(
        settings,
        workers.specs if workers is not None else catalog.current_specs(),
        tools=build_tools(settings, metrics) if tools is None else tools,
        metrics=metrics,
    )
    # keys from the models file are known only now: logs must hide them too
    redact_also(runtime.redactor.secrets)
    if workers is not None:
        warn_unknown_aliases(workers, runtime.tools.get("language_model"))
    return runtime


def warn_unknown_aliases(workers: WorkerSet, language_model: Any) -> None:
    """Say at start which prompt workers name a model alias this process lacks.

    Not fatal: a process may serve other workers while the model is configured
    elsewhere; each call of such a worker fails ``invalid_input`` naming the alias.
    """
    aliases = set(getattr(getattr(language_model, "registry", None), "aliases", None) or ())
    for worker_id in workers.served:  # specs only: nothing is imported to warn
        impl = workers.specs[worker_id].implementation
        if isinstance(impl, PromptImplementation) and impl.model not in aliases:
            log.warning(
                "worker.model_alias_unknown",
                extra={
                    "aiworker": {
                        "event": "model_alias_unknown",
                        "worker_id": worker_id,
                        "alias": impl.model,
                        "known_aliases": sorted(aliases),
                        "origin": workers.origin(worker_id),
                    }
                },
            )


# The workflows' helper modules are shared with the sandbox instead of being
# re-imported (and their dataclasses rebuilt) for every workflow run: that import
# was about a third of a short pipeline's worker CPU. Temporal's guidance is to
# pass through every module whose calls are deterministic. Safe because each of
# these modules (a) keeps no module state a run could change: only constants,
# functions and classes, whose instances live in the run's own objects
# (tests/workers/test_sandbox_modules.py checks every module-level value is
# immutable), and (b) follows the sandbox rules like any workflow code (the replay
# tests run them in the SDK's default sandbox, which passes none of them through).
# The modules that define the workflows the SDK loads per run (pipeline, foreach,
# agent, breakers, conformance) stay sandboxed: each run re-imports its own
# workflow module, so the sandbox still checks that code and isolates its state.
# limits is shared although it defines LimiterWorkflow: its PermitSignals mixin and
# permit book are the same classes for the pipeline, the chunks and the limiter.
SHARED_WORKFLOW_MODULES = (
    "aiworker.workflows.agent_step",
    "aiworker.workflows.budget",
    "aiworker.workflows.calls",
    "aiworker.workflows.chunks",
    "aiworker.workflows.dag",
    "aiworker.workflows.details",
    "aiworker.workflows.fanout",
    "aiworker.workflows.governed",
    "aiworker.workflows.items",
    "aiworker.workflows.limits",
    "aiworker.workflows.pipeline_limits",
    "aiworker.workflows.review",
    "aiworker.workflows.runs",
    "aiworker.workflows.state",
    "aiworker.workflows.steps",
    "aiworker.workflows.tally",
)


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox every aiworker workflow runs in (restrictions stay on)."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*SHARED_WORKFLOW_MODULES)
    )


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
                # One Worker Deployment version per process (workers/deployments.py).
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
                    extra={"aiworker": {"event": "temporal_unreachable", "error": str(e)}},
                )
            health.set_connected(False, f"cannot reach Temporal at {target}: {e}")
        else:
            health.set_connected(True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


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
