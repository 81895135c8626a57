"""The parent's side of an ``llm-agent`` step: start ``AgentWorkflow``, read its end.

The step runner admits the step through the pipeline's budget as for any
worker, then :func:`run_agent` hands the child the admission (tokens, external
calls, the timeout) and the pipeline's deadline; ``schemas.agent.ends_pipeline``
tells a spent pipeline budget from a bound of the agent's own (``max_turns``,
``max_calls``), which fails the step but leaves the pipeline's status to the
step's ``on_failure``. The child gets the specs it needs from the run's
(``AgentInput.specs``). Deterministic code only.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.agent import AgentInput, AgentLimits, agent_specs
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import ChunkAllowance, StepResult
    from aiworker.schemas.spec import WorkerSpec

from aiworker.workflows.agent import AgentWorkflow
from aiworker.workflows.budget import Admission
from aiworker.workflows.calls import WorkerCall


async def run_agent(
    call: WorkerCall,
    admission: Admission,
    *,
    specs: Mapping[str, WorkerSpec],
    child_id: str,
    deadline: float | None,
    limits: AgentLimits | None = None,
) -> StepResult:
    """Run an llm-agent call as ``AgentWorkflow``; its result (never raises on failure).

    The step runner's ``invoke`` for :func:`~aiworker.workflows.governed.governed_call`:
    the step's permits and admission are taken, the child spends the admission.
    ``specs`` are the run's worker specs: the child gets the ones it uses
    (:func:`~aiworker.schemas.agent.agent_specs`), so it decides from what the
    pipeline recorded, never from a catalog. ``limits``: the run's rate-limited
    workers and the tenant's worker list, which the child holds each model turn and
    tool call to (cut to the workers it uses).
    """
    worker, ctx, step_id = call.worker, call.context, call.context.step_id or ""
    used = agent_specs(worker, call.input, specs)
    if limits is not None:
        limits = limits.model_copy(
            update={"rate_limited": [w for w in limits.rate_limited if w in used]}
        )
    req = AgentInput(
        step_id=step_id,
        key=call.key,
        tenant=ctx.tenant,
        trace_id=ctx.trace_id,
        queue_suffix=ctx.queue_suffix,
        input=call.input,
        allowance=ChunkAllowance(
            max_tokens=admission.max_tokens,
            max_external_calls=admission.max_external_calls,
            deadline=deadline,
        ),
        timeout_seconds=admission.timeout_seconds,
        specs=used,
        limits=limits,
    )
    try:
        return await workflow.execute_child_workflow(
            AgentWorkflow.run,
            req,
            id=child_id,
            task_queue=workflow.info().task_queue,
            static_summary=call.summary or f"{req.step_id} ({worker.worker_id})",
            priority=ctx.priority,
        )
    except ChildWorkflowError as e:
        cause = e.cause
        return StepResult(
            status="failed",
            attempts=1,
            error_code=ErrorCode.INTERNAL.value,
            error_message=f"step {step_id!r}: the agent workflow failed: {cause or e}",
        )


__all__ = ["run_agent"]
