"""Which activities and workflows each task queue serves.

Each AI worker contributes one factory here; the worker process builds the
activities for the queues it polls. This is the only place that imports
worker implementations (entry points only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.aggregator import AggregatorActivities
from activities.limiter import LimiterActivities
from activities.llm_call import LlmCallActivities
from activities.publish import PublishActivities
from activities.runtime import WorkerRuntime
from activities.validator import ValidatorActivities
from activities.web_scrape import WebScrapeActivities
from schemas import names
from schemas.spec import WorkerSpec
from workflows.breaker import SharedBreakerWorkflow
from workflows.foreach import PipelineForEachWorkflow
from workflows.limiter import LimiterWorkflow
from workflows.pipeline import PipelineWorkflow

ActivityFactory = Callable[[WorkerRuntime], list[Callable[..., Any]]]

# worker_id -> factory of its activity callables (bound to the shared runtime)
ACTIVITY_FACTORIES: dict[str, ActivityFactory] = {
    names.VALIDATOR: lambda rt: [ValidatorActivities(rt).validator],
    names.LLM_CALL: lambda rt: [LlmCallActivities(rt).llm_call],
    names.WEB_SCRAPE: lambda rt: [WebScrapeActivities(rt).web_scrape],
    names.AGGREGATOR: lambda rt: [AggregatorActivities(rt).aggregator],
    names.PUBLISH: lambda rt: [PublishActivities(rt).publish],
}

WORKFLOWS_BY_QUEUE: dict[str, list[type]] = {
    names.PIPELINES_QUEUE: [
        PipelineWorkflow,
        PipelineForEachWorkflow,
        LimiterWorkflow,
        SharedBreakerWorkflow,
    ],
}


def all_queues(specs: dict[str, WorkerSpec]) -> list[str]:
    """Every base task queue: the workflows' and each implemented worker's."""
    queues = set(WORKFLOWS_BY_QUEUE)
    queues.update(specs[w].task_queue for w in ACTIVITY_FACTORIES if w in specs)
    return sorted(queues)


def activities_for(queue: str, runtime: WorkerRuntime) -> list[Callable[..., Any]]:
    """The activities served on the base task queue ``queue``."""
    out: list[Callable[..., Any]] = []
    for worker_id, factory in ACTIVITY_FACTORIES.items():
        spec = runtime.specs.get(worker_id)
        if spec is not None and spec.task_queue == queue:
            out.extend(factory(runtime))
    if queue == names.PIPELINES_QUEUE:
        # the limiter's local activity runs beside the pipeline workflows
        limiter = LimiterActivities(runtime.settings, runtime.specs)
        out += [limiter.acquire, limiter.plan]
    return out
