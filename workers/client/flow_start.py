"""Flow control at the one start path every client shares (:meth:`PipelineClient.start`).

Two roads, both Temporal's own primitives:

- ``"singleton": "refuse"``: the run's workflow id is derived from (tenant,
  pipeline, key) and started with ``WorkflowIDConflictPolicy.FAIL``, so the
  server refuses a second start while a run holds the key (``temporal workflow
  start --id ... --id-conflict-policy Fail`` does the same);
- every other mode (debounce, batch, singleton ``wait`` / ``cancel_running``,
  throttle): the start is the ``start`` update of the key's
  ``PipelineFlowWorkflow`` (``workflows/flow.py``), sent with update-with-start
  (conflict policy ``USE_EXISTING``: the first start creates the workflow),
  which answers at once with a :class:`~aiworker.schemas.flow_state.FlowAnswer`:
  ``started``, ``collapsed`` or ``queued``, the run that will do the work, and why.

Either way the caller gets a :class:`FlowHandle`: the handle of the run that will
do the work (which may not exist yet) with the answer as ``flow``.

A start the server did not land is sent again, with the same update id, until it
lands or :data:`START_RETRY_SECONDS` pass (:func:`lands_if_sent_again` says which
answers those are): the key's updates in flight are at the server's limit, the flow
workflow continued as new or completed as the update reached it, the server
dropped its in-memory updates (a workflow task that timed out on a loaded
machine), or the run it was accepted by closed before answering. The flow
workflow answers an update id it answered before with the answer it gave, across
continue-as-new too (``FlowState.answered``), so a start sent again is never
counted twice. One process sends at most :data:`KEY_STARTS_IN_FLIGHT` starts to a
key's flow workflow at once, so its own bursts queue in the process rather than
at the server.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    AutoUpgradeVersioningOverride,
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.flow import Flow, FlowKeyError, flow_workflow_id, mode_of, resolve_key
from aiworker.schemas.flow_state import FlowAnswer, FlowRequest, FlowState
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.schemas.problems import Problem
from aiworker.workflows.flow import PipelineFlowWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow

START_RETRY_SECONDS = 120.0
"""How long a start is sent again while the server does not land it
(:func:`lands_if_sent_again`): more than the server's in-flight updates per
workflow (``history.maxInFlightUpdates``, 10 by default) at once, or the flow
workflow closing (idle, continue-as-new) as it arrives. Two minutes: on a loaded
machine (load 20 on 2 cores) a burst of 60 starts to one key took over 30 s to
land its last start."""
KEY_STARTS_IN_FLIGHT = 8
"""Starts one process sends to one key's flow workflow at once, below the server's
10 updates in flight per workflow: a burst from one process waits its turn here
instead of being refused and sent again by every caller at once."""
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Gate]] = (
    weakref.WeakKeyDictionary()
)
START_RETRY_MAX_PAUSE = 1.0
"""The longest pause between two sends of one start (the pause doubles from 20 ms)."""
UPDATE_OUTLIVED_RUN = "AcceptedUpdateCompletedWorkflow"
"""The server's failure type for an update whose run closed after accepting it and
before completing it."""
STARTED_POLL_SECONDS = 1.0
"""How often :func:`wait_started` looks for a queued run."""


@dataclass(frozen=True)
class FlowStart:
    """How a start with flow control is made.

    Attributes:
        mode: :func:`~aiworker.schemas.flow.mode_of` the declaration.
        key: the start's resolved key.
        workflow_id: ``singleton: refuse``: the run's own id; any other mode: the
            key's flow workflow id.
        id_conflict_policy: FAIL (refuse) or USE_EXISTING (the flow workflow).
        flow: the declaration.
        tenant, pipeline: whose starts these are.
    """

    mode: str
    key: str
    workflow_id: str
    id_conflict_policy: WorkflowIDConflictPolicy
    flow: Flow
    tenant: str
    pipeline: str

    @property
    def refuse(self) -> bool:
        return self.mode == "singleton:refuse"


class FlowRefusedError(RuntimeError):
    """A start the pipeline's ``flow`` did not take; nothing was started.

    ``singleton: refuse`` while a run holds the key; or the flow workflow refused
    it (its queue is full, too many bytes held, the mode changed while runs of the
    old one are pending).

    Attributes:
        key: the start's key.
        workflow_id: the run holding the key (refuse), else the flow workflow.
        run_id: its run id, when the server said.
        code: ``flow_refused``.
    """

    code = ErrorCode.FLOW_REFUSED.value

    def __init__(
        self, key: str, workflow_id: str, run_id: str | None, message: str | None = None
    ) -> None:
        self.key = key
        self.workflow_id = workflow_id
        self.run_id = run_id
        super().__init__(
            message or f"refused: run {workflow_id} holds flow key {key!r} (singleton: refuse)"
        )


class FlowHandle(WorkflowHandle[PipelineWorkflow, PipelineResult]):
    """The handle of the run that will do a flow-controlled start's work, with the
    flow workflow's answer (``flow``). Until the answer says ``started`` the run may
    not exist yet: :func:`wait_started` waits for it."""

    def __init__(self, client: Client, answer: FlowAnswer, key: str) -> None:
        super().__init__(
            client, answer.workflow_id, result_run_id=answer.run_id, result_type=PipelineResult
        )
        self.temporal = client
        self.flow = answer
        self.key = key


def plan_flow_start(pipeline: Mapping[str, Any], queue_suffix: str = "") -> FlowStart | None:
    """The flow-controlled start of ``pipeline``, or None when it declares no ``flow``
    (or is a redrive: a rerun of one run, not a new start, goes straight to Temporal).

    Raises:
        PipelineSpecError: ``flow`` is invalid, or its key resolves to nothing or
            to over 200 characters (bad input: nothing was started).
    """
    raw = pipeline.get("flow")
    if raw is None or pipeline.get("resume_from") is not None:
        return None
    try:
        flow = Flow.model_validate(raw)
    except ValidationError as e:
        raise PipelineSpecError([Problem(None, "flow", str(e))]) from e
    inputs = pipeline.get("inputs") or {}
    try:
        key = resolve_key(flow, dict(inputs) if isinstance(inputs, Mapping) else {})
    except FlowKeyError as e:
        raise PipelineSpecError([Problem(None, "flow.key", str(e))]) from e
    mode = mode_of(flow)
    tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
    name = str(pipeline.get("name") or "pipeline")
    refuse = mode == "singleton:refuse"
    return FlowStart(
        mode=mode,
        key=key,
        workflow_id=flow_workflow_id(tenant, name, key, queue_suffix),
        id_conflict_policy=(
            WorkflowIDConflictPolicy.FAIL if refuse else WorkflowIDConflictPolicy.USE_EXISTING
        ),
        flow=flow,
        tenant=tenant,
        pipeline=name,
    )


async def submit(
    temporal: Client,
    pipeline: Mapping[str, Any],
    plan: FlowStart,
    *,
    task_queue: str,
    priority: Priority = Priority.default,
    search_attributes: bool = True,
    update_id: str | None = None,
) -> FlowHandle:
    """Send one start to the key's flow workflow (update-with-start); its answer.

    At most :data:`KEY_STARTS_IN_FLIGHT` starts of this process are sent to one
    key's flow workflow at once; the others wait their turn. A start the server
    did not land is sent again with the same update id, with a
    jittered pause doubling to :data:`START_RETRY_MAX_PAUSE`, for up to
    :data:`START_RETRY_SECONDS` (:func:`lands_if_sent_again`).

    Args:
        temporal: the client.
        pipeline: the start's pipeline JSON.
        plan: :func:`plan_flow_start`'s answer (not ``singleton: refuse``).
        task_queue: the pipelines queue (the flow workflow and its runs run there).
        priority: the runs' Temporal Priority.
        search_attributes: False on a server without aiworker's search attributes
            (the time-skipping test server): none set, and the runs told so.
        update_id: the update's id (a new one by default): the same start sent
            twice to a key's flow workflow is answered once, across continue-as-new
            too, while it is among the latest answers (the front door's
            ``Idempotency-Key``).

    Raises:
        FlowRefusedError: the flow workflow refused the start (``flow_refused``).
        RPCError, WorkflowUpdateFailedError: Temporal's error when the start did not
            land in :data:`START_RETRY_SECONDS`, or one that sending again cannot mend.
    """
    request = FlowRequest(
        pipeline=dict(pipeline),
        key=plan.key,
        priority_key=priority.priority_key,
        fairness_key=priority.fairness_key,
        fairness_weight=priority.fairness_weight,
    )
    state = FlowState(tenant=plan.tenant, pipeline=plan.pipeline, key=plan.key, flow=plan.flow)
    # One id for every attempt: a start answered by a run that continued as new before
    # its answer came back is answered again by the next run, not counted twice.
    update_id = update_id or f"start-{uuid.uuid4()}"
    # counted from here, the wait for a turn included: the starts ahead of this one
    # began earlier, so their deadlines pass first and the wait is bounded too
    deadline = time.monotonic() + START_RETRY_SECONDS
    gates = _gates.setdefault(asyncio.get_running_loop(), {})
    gate = gates.setdefault(plan.workflow_id, _Gate())
    gate.users += 1
    try:
        async with gate.slots:
            return await _send(
                temporal, request, state, plan, task_queue, search_attributes, update_id, deadline
            )
    finally:
        gate.users -= 1
        if gate.users == 0:  # the last of a burst: a key's gate lives while it is used
            gates.pop(plan.workflow_id, None)


@dataclass
class _Gate:
    slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(KEY_STARTS_IN_FLIGHT)
    )
    users: int = 0


async def _send(
    temporal: Client,
    request: FlowRequest,
    state: FlowState,
    plan: FlowStart,
    task_queue: str,
    search_attributes: bool,
    update_id: str,
    deadline: float,
) -> FlowHandle:
    """:func:`submit`'s sends of one start, until it lands or ``deadline`` passes
    (at least one send)."""
    pause = 0.02
    while True:
        start = WithStartWorkflowOperation(
            PipelineFlowWorkflow.run,
            state,
            id=plan.workflow_id,
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"flow {plan.mode} of pipeline {plan.pipeline} "
            f"(tenant {plan.tenant}), key {plan.key}",
            search_attributes=(
                TypedSearchAttributes(
                    [
                        SearchAttributePair(names.TENANT_KEY, plan.tenant),
                        SearchAttributePair(names.PIPELINE_KEY, plan.pipeline),
                    ]
                )
                if search_attributes
                else None
            ),
            memo=None if search_attributes else {"search_attributes": False},
            # long-lived, like the limiter: it follows the current build
            versioning_override=AutoUpgradeVersioningOverride(),
        )
        try:
            # by name: the SDK types an async handler's result as its coroutine
            answer: FlowAnswer = await temporal.execute_update_with_start_workflow(
                names.FLOW_START_UPDATE,
                request,
                start_workflow_operation=start,
                id=update_id,
                result_type=FlowAnswer,
                rpc_timeout=timedelta(seconds=30),
            )
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError) and cause.type == FlowRefusedError.code:
                raise FlowRefusedError(
                    plan.key, plan.workflow_id, None, f"refused: {cause.message}"
                ) from None
            if not lands_if_sent_again(e) or time.monotonic() + pause > deadline:
                raise
        except RPCError as e:
            if not lands_if_sent_again(e) or time.monotonic() + pause > deadline:
                raise
        else:
            return FlowHandle(temporal, answer, plan.key)
        await asyncio.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, START_RETRY_MAX_PAUSE)


def lands_if_sent_again(error: BaseException) -> bool:
    """Whether a start that raised ``error`` is answered when sent again with its
    update id (:func:`submit` sends it again for up to :data:`START_RETRY_SECONDS`).

    Yes for what the server says when the update did not land on a run that goes on:

    - ``RESOURCE_EXHAUSTED``: the key's updates in flight are at the server's limit,
      or a run that continued as new had admitted the update ("workflow is closing");
    - ``UNAVAILABLE`` ("workflow update was aborted"): the server dropped the updates
      it held in memory (its update registry is cleared when a workflow task fails
      or times out, as on a loaded machine) and the SDK's own retries ran out;
    - ``ABORTED``: the update-with-start as a whole was aborted;
    - ``NOT_FOUND`` (not a namespace): the flow workflow completed (idle) with the
      update admitted, "aborted by closing workflow"; sent again, it starts the
      key's next flow workflow;
    - a :class:`WorkflowUpdateFailedError` of type :data:`UPDATE_OUTLIVED_RUN`: the
      run that accepted the start closed before answering it. ``PipelineFlowWorkflow``
      continues as new and completes only once every start handler has finished (so
      a start it accepted is never half counted in what it carries): such a run was
      cancelled, terminated or timed out under the start, its held starts dropped;
      sent again, the start lands on the next run or opens the key's next flow
      workflow.

    No for anything else: a refusal, bad input, a workflow task that fails (a bug
    waits for a fixed build), a timeout or cancellation of the call itself.
    """
    if isinstance(error, WorkflowUpdateFailedError):
        cause = error.cause
        return isinstance(cause, ApplicationError) and cause.type == UPDATE_OUTLIVED_RUN
    if not isinstance(error, RPCError):
        return False
    if error.status == RPCStatusCode.NOT_FOUND:
        return "namespace" not in error.message.lower()
    return error.status in (
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.ABORTED,
    )


async def wait_started(handle: FlowHandle, poll_seconds: float = STARTED_POLL_SECONDS) -> str:
    """Wait until the run a flow answer named exists; its run id.

    Polls ``DescribeWorkflowExecution`` every ``poll_seconds`` (a debounce may
    hold the run for its quiet period, a singleton for the whole run ahead).

    Raises:
        FlowRefusedError: the flow workflow closed without starting the run (it
            was cancelled or terminated with the start still held).
    """
    if handle.flow.run_id is not None:
        return handle.flow.run_id
    temporal = handle.temporal
    flow_id = handle.flow.flow_workflow_id
    while True:
        try:
            desc = await temporal.get_workflow_handle(handle.id).describe()
            return desc.run_id
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
        try:
            holder = await temporal.get_workflow_handle(flow_id).describe()
            alive = holder.status is not None and holder.status.name in (
                "RUNNING",
                "CONTINUED_AS_NEW",
            )
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            alive = False
        if not alive:
            # one more look: the run may have started just before its flow workflow closed
            try:
                return (await temporal.get_workflow_handle(handle.id).describe()).run_id
            except RPCError:
                raise FlowRefusedError(
                    handle.key,
                    flow_id,
                    None,
                    f"flow workflow {flow_id} closed without starting {handle.id}",
                ) from None
        await asyncio.sleep(poll_seconds)


def headline(answer: FlowAnswer) -> str:
    """What became of a start, in a few words: ``started X``, ``collapsed into X``,
    ``queued behind Y as X`` (``aiworker run`` prints it with the reason)."""
    if answer.status == "collapsed":
        return f"collapsed into {answer.workflow_id}"
    if answer.status == "queued":
        behind = f" behind {answer.behind}" if answer.behind else ""
        return f"queued{behind} as {answer.workflow_id}"
    return f"started {answer.workflow_id}"


def flow_doc(answer: FlowAnswer) -> dict[str, Any]:
    """The answer as the front door's ``flow`` object (and ``aiworker run --json``'s)."""
    return answer.model_dump(mode="json", exclude={"workflow_id", "run_id"}, exclude_none=True)
