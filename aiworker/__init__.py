"""aiworker: durable orchestration of AI workers on Temporal.

The public API for worker authors. A worker is a spec (its published
contract) and an ``execute`` method::

    from pathlib import Path

    import aiworker


    class Slugify(aiworker.Worker):
        spec = aiworker.WorkerSpec.from_file(Path(__file__).with_name("slugify.json"))

        async def execute(self, ctx: aiworker.Context, input: dict) -> aiworker.Result:
            if not input["title"].strip():
                raise aiworker.InvalidInputError("input.title is blank", field="input.title")
            return aiworker.Result(outputs={"slug": "-".join(input["title"].lower().split())})

Register it under the entry-point group ``aiworker.plugins`` of your package
(or list its module in ``AIWORKER_WORKER_MODULES``) and every aiworker
process serves it on the task queue its spec names, with the same contract
checks, limits, retries, error codes and telemetry as the built-ins.
:mod:`aiworker.testing` runs a worker without a server; ``aiworker
conformance WORKER_ID`` checks a live one through Temporal.

Pipelines are started and watched from Python with :class:`PipelineClient`
(the client ``aiworker run`` uses); its handles are the SDK's, typed, so
``await handle.result()`` is a :class:`PipelineResult` for a run that ended
``succeeded`` or ``partial`` and raises ``WorkflowFailureError`` for any other
(:func:`result_from_failure` takes the result from it);
``pipelines.result(id)`` returns the result of any ended run::

    pipelines = await aiworker.PipelineClient.connect()  # envconfig, or target_host=...
    handle = await pipelines.start(json.loads(Path("pipeline.json").read_text()))
    result = await pipelines.result(handle.id)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiworker.activities.errors import (
        AccessDeniedError,
        BudgetExceededError,
        CircuitOpenError,
        EgressDeniedError,
        FetchFailedError,
        FetchTimeoutError,
        InternalError,
        InvalidInputError,
        InvalidOutputError,
        NotFoundError,
        PayloadTooLargeError,
        RateLimitedError,
        ToolNotAllowedError,
        UpstreamError,
        ValidationFailedError,
        WorkerError,
        WorkerTimeoutError,
    )
    from aiworker.activities.prompt import PromptWorker
    from aiworker.activities.runtime import WorkerContext, WorkerResult
    from aiworker.activities.sdk import Worker
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.outcomes import result_from_failure
    from aiworker.schemas.pipeline import PipelineResult
    from aiworker.schemas.pipeline_check import PipelineSpecError
    from aiworker.schemas.protocol import (
        ArtifactRef,
        ErrorInfo,
        Usage,
        WarningInfo,
        WorkerRequest,
        WorkerResponse,
    )
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.workers.client.callbacks import CallbackError
    from aiworker.workers.client.client import (
        PipelineClient,
        PipelineHandle,
        QuoteNotAcceptedError,
        RedriveError,
        StepItemsError,
        TemporalUnreachableError,
    )
    from aiworker.workers.process.plugin import AiworkerPlugin

    Context = WorkerContext
    Result = WorkerResult

# Names load on first use (PEP 562): the workflow modules live under this
# package and the workflow sandbox imports it for every run, so `import
# aiworker` itself must cost nothing and pull in no activity code.
_LAZY: dict[str, str] = {
    "AccessDeniedError": "aiworker.activities.errors:AccessDeniedError",
    "AiworkerPlugin": "aiworker.workers.process.plugin:AiworkerPlugin",
    "ArtifactRef": "aiworker.schemas.protocol:ArtifactRef",
    "BudgetExceededError": "aiworker.activities.errors:BudgetExceededError",
    "CallbackError": "aiworker.workers.client.callbacks:CallbackError",
    "CircuitOpenError": "aiworker.activities.errors:CircuitOpenError",
    "Context": "aiworker.activities.runtime:WorkerContext",
    "EgressDeniedError": "aiworker.activities.errors:EgressDeniedError",
    "ErrorCode": "aiworker.schemas.errors:ErrorCode",
    "ErrorInfo": "aiworker.schemas.protocol:ErrorInfo",
    "FetchFailedError": "aiworker.activities.errors:FetchFailedError",
    "FetchTimeoutError": "aiworker.activities.errors:FetchTimeoutError",
    "InternalError": "aiworker.activities.errors:InternalError",
    "InvalidInputError": "aiworker.activities.errors:InvalidInputError",
    "InvalidOutputError": "aiworker.activities.errors:InvalidOutputError",
    "NotFoundError": "aiworker.activities.errors:NotFoundError",
    "PipelineClient": "aiworker.workers.client.client:PipelineClient",
    "PipelineHandle": "aiworker.workers.client.client:PipelineHandle",
    "PipelineResult": "aiworker.schemas.pipeline:PipelineResult",
    "PipelineSpecError": "aiworker.schemas.pipeline_check:PipelineSpecError",
    "PromptWorker": "aiworker.activities.prompt:PromptWorker",
    "PayloadTooLargeError": "aiworker.activities.errors:PayloadTooLargeError",
    "RateLimitedError": "aiworker.activities.errors:RateLimitedError",
    "QuoteNotAcceptedError": "aiworker.workers.client.client:QuoteNotAcceptedError",
    "RedriveError": "aiworker.workers.client.client:RedriveError",
    "StepItemsError": "aiworker.workers.client.step_items:StepItemsError",
    "TemporalUnreachableError": "aiworker.workers.client.temporal_client:TemporalUnreachableError",
    "Result": "aiworker.activities.runtime:WorkerResult",
    "ToolNotAllowedError": "aiworker.activities.errors:ToolNotAllowedError",
    "UpstreamError": "aiworker.activities.errors:UpstreamError",
    "Usage": "aiworker.schemas.protocol:Usage",
    "ValidationFailedError": "aiworker.activities.errors:ValidationFailedError",
    "WarningInfo": "aiworker.schemas.protocol:WarningInfo",
    "Worker": "aiworker.activities.sdk:Worker",
    "WorkerContext": "aiworker.activities.runtime:WorkerContext",
    "WorkerError": "aiworker.activities.errors:WorkerError",
    "WorkerRequest": "aiworker.schemas.protocol:WorkerRequest",
    "WorkerResponse": "aiworker.schemas.protocol:WorkerResponse",
    "WorkerResult": "aiworker.activities.runtime:WorkerResult",
    "WorkerSpec": "aiworker.schemas.spec:WorkerSpec",
    "WorkerTimeoutError": "aiworker.activities.errors:WorkerTimeoutError",
    "result_from_failure": "aiworker.schemas.outcomes:result_from_failure",
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'aiworker' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AccessDeniedError",
    "AiworkerPlugin",
    "ArtifactRef",
    "BudgetExceededError",
    "CallbackError",
    "CircuitOpenError",
    "Context",
    "EgressDeniedError",
    "ErrorCode",
    "ErrorInfo",
    "FetchFailedError",
    "FetchTimeoutError",
    "InternalError",
    "InvalidInputError",
    "InvalidOutputError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PipelineClient",
    "PipelineHandle",
    "PipelineResult",
    "PipelineSpecError",
    "PromptWorker",
    "QuoteNotAcceptedError",
    "RateLimitedError",
    "RedriveError",
    "Result",
    "StepItemsError",
    "TemporalUnreachableError",
    "ToolNotAllowedError",
    "UpstreamError",
    "Usage",
    "ValidationFailedError",
    "WarningInfo",
    "Worker",
    "WorkerContext",
    "WorkerError",
    "WorkerRequest",
    "WorkerResponse",
    "WorkerResult",
    "WorkerSpec",
    "WorkerTimeoutError",
    "result_from_failure",
]
