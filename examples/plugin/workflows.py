"""The project's own Temporal workflow, in ``workflows.py`` at its root.

``TicketWorkflow`` masks the personal data in a support ticket with the
plugin's ``pii-redact`` worker (a one-step aiworker pipeline, run as a child
workflow on aiworker's pipelines queue) and then opens the ticket with the
redacted text only. Run it on a worker of your own task queue::

    Worker(client, task_queue="acme-support", workflows=[TicketWorkflow],
           activities=[open_ticket])
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import open_ticket


@workflow.defn
class TicketWorkflow:
    """Redact a ticket's text with ``pii-redact``, then open the ticket."""

    @workflow.run
    async def run(self, text: str, pipelines_queue: str = "aiworker-pipelines") -> str:
        pipeline = {
            "name": "redact-ticket",
            "inputs": {"text": text},
            "steps": [
                {"id": "redact", "worker": "pii-redact", "input": {"text": "${{ inputs.text }}"}}
            ],
            "output": {"text": "${{ steps.redact.outputs.text }}"},
        }
        result: dict[str, Any] = await workflow.execute_child_workflow(
            "PipelineWorkflow", pipeline, task_queue=pipelines_queue, result_type=dict
        )
        if result["status"] != "succeeded":
            raise ApplicationError(f"redaction ended {result['status']}", non_retryable=True)
        return await workflow.execute_activity(
            open_ticket, result["output"]["text"], start_to_close_timeout=timedelta(seconds=30)
        )
