"""The ``flow-submit`` activity: a schedule's start of a pipeline that declares ``flow``.

A Temporal Schedule starts its action on the server. For a pipeline with
``flow`` that action is :class:`~aiworker.workflows.flow.ScheduledFlowStartWorkflow`,
and this activity, on the pipelines queue beside it, makes the start the way
every client makes it (:meth:`PipelineClient.start`): through the key's flow
workflow, or with the keyed id for ``singleton: refuse``. Nothing here decides
anything of its own; the flow's answer is the activity's result.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.flow_state import FlowAnswer
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.flow_start import FlowHandle, FlowRefusedError


class ScheduledFlowActivities:
    """The activity a pipelines-queue worker serves for schedules of flow pipelines."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @activity.defn(name=names.FLOW_SUBMIT_ACTIVITY)
    async def submit(self, pipeline: dict[str, Any]) -> FlowAnswer:
        """Start ``pipeline`` under its ``flow``; the flow's answer.

        The schedule checked the pipeline when it was created; the run checks it
        again when it starts. The update id is the scheduled workflow's id and run
        id, so a retried attempt is answered once.

        Raises:
            ApplicationError: ``flow_refused`` (the flow did not take the start) or
                ``invalid_input`` (the key resolves to nothing or too much); neither
                is retried.
        """
        info = activity.info()
        pipelines = PipelineClient(activity.client(), self.settings)
        try:
            # two triggers in one second share a workflow id: the run id tells them apart
            # like a schedule's plain runs, not held to a cost quote
            handle = await pipelines.start(
                pipeline,
                workflow_id=f"{info.workflow_id}/{info.workflow_run_id}",
                check=False,
                accept_quote=True,
            )
        except FlowRefusedError as e:
            raise ApplicationError(
                str(e), type=ErrorCode.FLOW_REFUSED.value, non_retryable=True
            ) from None
        except PipelineSpecError as e:
            raise ApplicationError(
                str(e), type=ErrorCode.INVALID_INPUT.value, non_retryable=True
            ) from None
        if not isinstance(handle, FlowHandle):
            raise ApplicationError(
                "the scheduled pipeline declares no flow",
                type=ErrorCode.INVALID_INPUT.value,
                non_retryable=True,
            )
        activity.logger.info("flow start %s: %s", handle.flow.status, handle.flow.workflow_id)
        return handle.flow
