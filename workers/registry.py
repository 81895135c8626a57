"""Which activities and workflows each task queue serves.

Workflows are fixed; activities come from the process's :class:`WorkerSet`
(built-ins, plugins, prompt workers), each worker building its own activity
from its spec. External workers are in the catalog (pipelines call them) but
not served here: another process polls their queue.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from temporalio import activity

from aiworker.activities.items import ItemsActivities
from aiworker.activities.limits import LimiterActivities
from aiworker.activities.runtime import WorkerRuntime
from aiworker.schemas import names
from aiworker.schemas.settings import Settings
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.live_registry import live_specs
from aiworker.workers.plugins import WorkerSet
from aiworker.workers.resources import artifact_store
from aiworker.workflows.agent import AgentWorkflow
from aiworker.workflows.breakers import SharedBreakerWorkflow
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.limits import LimiterWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow
from aiworker.workflows.worker_registry import WorkerRegistryWorkflow

WORKFLOWS_BY_QUEUE: dict[str, list[type]] = {
    names.PIPELINES_QUEUE: [
        PipelineWorkflow,
        PipelineForEachWorkflow,
        AgentWorkflow,
        LimiterWorkflow,
        SharedBreakerWorkflow,
        WorkerRegistryWorkflow,
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


def activities_for(
    queue: str, runtime: WorkerRuntime, workers: WorkerSet, skip: Collection[str] = ()
) -> list[Callable[..., Any]]:
    """The activities served on the base task queue ``queue`` (less the workers ``skip`` names)."""
    out: list[Callable[..., Any]] = [
        w.activity(runtime)
        for w in workers.served.values()
        if w.spec.task_queue == queue and w.worker_id not in skip
    ]
    if queue == names.PIPELINES_QUEUE:
        # the limiter's local activity runs beside the pipeline workflows; its plan
        # names the workers whose calls run as local activities here too
        # a run naming a worker this process lacks records the live registry's spec
        suffix = runtime.settings.task_queue_suffix
        limiter = LimiterActivities(
            runtime.settings,
            runtime.specs,
            local_workers(runtime.settings, workers),
            live_specs=lambda: live_specs(activity.client(), suffix),
        )
        out += [limiter.acquire, limiter.acquire_many, limiter.plan]
        # a large for_each's item outputs, stored by its chunks and loaded where needed
        store = runtime.tools.get("artifact_store") or artifact_store(runtime.settings)
        items = ItemsActivities(store)
        out += [items.store, items.load]
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
        for wid, w in workers.served.items()
        if w.spec.execution == "local" and w.spec.task_queue == names.PIPELINES_QUEUE
    )
