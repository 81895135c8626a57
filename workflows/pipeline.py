"""``PipelineWorkflow``: runs a pipeline spec as a DAG of worker calls.

The definition only: what a run does, its handlers (``progress``, ``events``,
``review``, ``callback``, ``callback_state``, the permit signals) and how it ends
are :class:`~aiworker.workflows.pipeline_body.PipelineBody`'s, in a module
shared with every run. Sandboxed (``AIWORKER_WORKFLOW_SANDBOX=true``, and the
replay tests), this module is imported again for each run and checked, as
every workflow module is; kept to the class, that import costs what
Temporal's own bare workflow module costs.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.pipeline import PipelineResult

from aiworker.workflows.pipeline_body import (
    PipelineBody,
    error_code_of,
    invalid_input,
    recorded_workers,
)

__all__ = ["PipelineWorkflow", "error_code_of", "invalid_input", "recorded_workers"]


@workflow.defn(name=names.PIPELINE_WORKFLOW)
class PipelineWorkflow(PipelineBody):
    """Runs a pipeline: a DAG of AI worker steps with references between them."""

    @workflow.run
    async def run(self, pipeline: Any) -> PipelineResult:
        """Run the pipeline; the argument is the pipeline JSON users write (typed
        ``Any``: it is checked in the run, so that malformed input fails the
        workflow with ``invalid_input`` rather than its payload decoding). See
        :meth:`~aiworker.workflows.pipeline_body.PipelineBody.run_pipeline`."""
        return await self.run_pipeline(pipeline)
