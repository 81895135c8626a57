"""Which activities and workflows each task queue serves.

Workflows are fixed; activities come from the process's :class:`WorkerSet`
(built-ins, plugins, prompt workers), each worker building its own activity
from its spec. External workers are in the catalog (pipelines call them) but
not served here: another process polls their queue.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from temporalio import activity

from aiworker.activities.callbacks import CallbackActivities
from aiworker.activities.evals import EvalActivities
from aiworker.activities.items import ItemsActivities
from aiworker.activities.limits import LimiterActivities
from aiworker.activities.run_config import RunConfigActivities
from aiworker.activities.runtime import WorkerRuntime
from aiworker.config.extras import MissingExtraError
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.process.live_registry import live_specs
from aiworker.workers.process.resources import artifact_store
from aiworker.workers.process.worker_set import ServedWorkers, WorkerSet
from aiworker.workers.schedules.flow_starts import ScheduledFlowActivities
from aiworker.workflows.agent import AgentWorkflow
from aiworker.workflows.breakers import SharedBreakerWorkflow
from aiworker.workflows.evals import EvalWorkflow
from aiworker.workflows.flow import PipelineFlowWorkflow, ScheduledFlowStartWorkflow
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.limits import LimiterWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow

log = logging.getLogger("aiworker.process")

WORKFLOWS_BY_QUEUE: dict[str, list[type]] = {
    names.PIPELINES_QUEUE: [
        PipelineWorkflow,
        PipelineForEachWorkflow,
        AgentWorkflow,
        LimiterWorkflow,
        SharedBreakerWorkflow,
        WorkerRegistryWorkflow,
        PipelineFlowWorkflow,
        ScheduledFlowStartWorkflow,
        EvalWorkflow,
    ],
}


def all_queues(specs: Mapping[str, WorkerSpec], workers: WorkerSet | None = None) -> list[str]:
    """Every base task queue this process can serve: the workflows' and each served worker's."""
    queues = set(WORKFLOWS_BY_QUEUE)
    served = workers.served if workers is not None else None
    queues.update(
        s.task_queue
        for wid, s in specs.items()
        if (wid in served if served is not None else s.kind != "external")
    )
    return sorted(queues)


def default_queues(specs: Mapping[str, WorkerSpec], workers: WorkerSet) -> list[str]:
    """The queues a process serves when none are named: :func:`all_queues`, less the
    queues whose every worker needs an extra this install lacks (logged, not fatal:
    a core install serves what it has; naming such a queue fails, naming the extra)."""
    served = workers.served
    lacking = {
        wid: extra
        for wid in served
        if isinstance(served, ServedWorkers) and (extra := served.missing_extra(wid))
    }
    if not lacking:
        return all_queues(specs, workers)
    able = {specs[wid].task_queue for wid in served if wid not in lacking and wid in specs}
    skipped = sorted({specs[wid].task_queue for wid in lacking} - able - set(WORKFLOWS_BY_QUEUE))
    for wid, extra in sorted(lacking.items()):
        log.warning(
            "worker.extra_missing",
            extra={
                "aiworker": {
                    "event": "extra_missing",
                    "worker_id": wid,
                    "extra": extra,
                    "message": str(MissingExtraError(wid, extra)),
                }
            },
        )
    return [q for q in all_queues(specs, workers) if q not in skipped]


def activities_for(
    queue: str, runtime: WorkerRuntime, workers: WorkerSet, skip: Collection[str] = ()
) -> list[Callable[..., Any]]:
    """The activities served on the base task queue ``queue`` (less the ids in ``skip``,
    which a caller replaces with stand-ins)."""
    # by spec first: only the workers on this queue are imported and built
    out: list[Callable[..., Any]] = [
        workers.served[wid].activity(runtime)
        for wid in workers.served
        if workers.specs[wid].task_queue == queue and wid not in skip
    ]
    # beside each python or prompt worker, its items activity (for_each items_per_task)
    out += [
        workers.served[wid].items_activity(runtime)
        for wid in workers.served
        if workers.specs[wid].task_queue == queue
        and workers.specs[wid].kind in ("python", "prompt")
        and wid not in skip
    ]
    # a candidate prompt spec of an eval (activities/evals.py) runs where prompt
    # workers and llm-call run: those processes have the model registry it needs
    if any(
        workers.specs[wid].task_queue == queue
        and (workers.specs[wid].kind == "prompt" or wid == names.LLM_CALL)
        for wid in workers.served
    ):
        out.append(EvalActivities(runtime).call)
    if queue == names.PIPELINES_QUEUE:
        # the run config's local activity runs beside the pipeline workflows; it
        # names the workers whose calls run as local activities here too
        # a run naming a worker this process lacks records the live registry's spec
        suffix = runtime.settings.task_queue_suffix

        def published() -> Awaitable[Mapping[str, WorkerSpec]]:
            return live_specs(activity.client(), suffix, secret=runtime.settings.registry_secret)

        limiter = LimiterActivities(runtime.settings, runtime.specs, live_specs=published)
        run_config = RunConfigActivities(
            runtime.settings,
            runtime.specs,
            local_workers(runtime.settings, workers),
            live_specs=published,
        )
        out += [limiter.acquire, limiter.acquire_many, run_config.run_config]
        # a large for_each's item outputs, stored by its chunks and loaded where needed
        store = runtime.tools.get("artifact_store") or artifact_store(runtime.settings)
        items = ItemsActivities(store)
        out += [items.store, items.load]
        # the secrets of wait steps' tokens (and the serve's public URL)
        out.append(CallbackActivities(runtime.settings).tokens)
        # a schedule's start of a pipeline with `flow`, through the key's flow workflow
        out.append(ScheduledFlowActivities(runtime.settings).submit)
    return out


def local_workers(settings: Settings, workers: WorkerSet) -> list[str]:
    """The workers a pipelines-queue process runs as local activities: those it serves
    whose spec says ``"execution": "local"`` (a spec may say so only on the pipelines
    queue, so their activity is registered beside the workflows), unless
    ``AIWORKER_LOCAL_ACTIVITIES`` is off."""
    if not settings.local_activities:
        return []
    return sorted(
        wid
        for wid in workers.served
        if workers.specs[wid].execution == "local"
        and workers.specs[wid].task_queue == names.PIPELINES_QUEUE
    )
