"""A tiny workflow that calls one worker the way pipelines do, so runtime
tests can run any spec (including test-only specs) through a real server."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.options import activity_options
    from aiworker.schemas.protocol import RequestConstraints, WorkerResponse
    from aiworker.schemas.spec import WorkerSpec


@workflow.defn(name="CallWorkerWorkflow")
class CallWorkerWorkflow:
    """Runs one activity call with options derived from the given spec."""

    @workflow.run
    async def run(self, args: dict[str, Any]) -> WorkerResponse:
        spec = WorkerSpec.model_validate(args["spec"])
        request = dict(args["request"])
        constraints = RequestConstraints.model_validate(request.get("constraints") or {})
        options = activity_options(spec, constraints=constraints)
        options["task_queue"] = args["task_queue"]
        return await workflow.execute_activity(
            spec.worker_id, request, result_type=WorkerResponse, **options
        )
