"""``PipelineFlowWorkflow``: flow control on the starts of one (tenant, pipeline, key).

A pipeline that declares ``flow`` (debounce, batch, singleton ``wait`` or
``cancel_running``, throttle) is not started directly: every start is a
``start`` update sent with update-with-start to this workflow, whose id is
``flow_workflow_id(tenant, pipeline, key, queue_suffix)`` (conflict policy
``USE_EXISTING``: the first start creates it, later ones reach the running one).
The update answers the caller at once with a
:class:`~aiworker.schemas.flow_state.FlowAnswer`: ``started``, ``collapsed``
into a run or ``queued``, with the run that will do the work and why. What to
answer and when a run starts is decided by :class:`~aiworker.workflows.flow_book.FlowBook`
from the updates, the workflow clock and the closing of runs only (the history).

Why a workflow of aiworker's own: Temporal's start policies cover
``singleton: refuse`` alone (``WorkflowIDConflictPolicy.FAIL``, used for it in
``workers/client/flow_start.py``); waiting for quiet, collecting, queueing
behind a run and counting starts per period need state per key that lives as
long as the starts do, and a workflow keyed by the id is Temporal's way to keep
it (update handlers run one at a time on it, so two starts never both see an
empty key), with no side database. It is the "entity workflow" pattern.

The runs are child workflows of this one, started with
``ParentClosePolicy.ABANDON`` and ``ChildWorkflowCancellationType.ABANDON``: a
pipeline run stays independent of its flow workflow (it outlives the flow
workflow's continue-as-new, its completion when idle, a terminate by an
operator), while the Temporal UI links each run to the flow workflow that
started it (its parent) and names in its summary why it started. Only
``singleton: cancel_running`` ever cancels a run, by an explicit request. An
activity that starts the runs would have cut that link and added an activity
per run for nothing the server does not already do.

History stays bounded: the workflow continues as new, carrying its pending
runs and throttle window (:class:`~aiworker.schemas.flow_state.FlowState`), when
the server suggests it or past
:data:`~aiworker.schemas.flow_state.MAX_HISTORY_EVENTS`; it does not while a
singleton run is running (it awaits that run as its child; the queue behind it
is bounded, :data:`~aiworker.schemas.flow_state.MAX_QUEUED_RUNS`, and a start
past the bound is refused by the validator, which writes no history). With
nothing pending, running or counted, it completes after
:data:`~aiworker.schemas.flow_state.IDLE_SECONDS` without a start.

The Temporal UI shows the mode, what is pending and running and the counts as
the workflow's current details; the ``state`` query answers the same as JSON.
Cancelling or terminating this workflow drops the starts it holds (those not
started yet); runs already started go on.
"""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import flow_state as bounds
    from aiworker.schemas import names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.flow_state import IDLE_SECONDS, FlowAnswer, FlowRequest, FlowState

from aiworker.workflows.flow_book import FlowBook, Launch
from aiworker.workflows.state import MEMO_SEARCH_ATTRIBUTES, search_attributes_on


@workflow.defn(name=names.FLOW_WORKFLOW)
class PipelineFlowWorkflow:
    """Debounce, batch, singleton (wait, cancel_running) and throttle for one key."""

    @workflow.init
    def __init__(self, state: FlowState) -> None:
        info = workflow.info()
        self._book = FlowBook(state, info.workflow_id, info.first_execution_run_id[:8])
        self._nudged = False
        self._children: dict[str, workflow.ChildWorkflowHandle[Any, Any]] = {}
        self._shown = ""
        self._watchers: set[asyncio.Task[None]] = set()

    @workflow.update(name=names.FLOW_START_UPDATE)
    async def start(self, request: FlowRequest) -> FlowAnswer:
        """One start of the pipeline: answered with what became of it (a start sent
        again with its update id after a continue-as-new: the answer it had)."""
        update_id = workflow.current_update_info().id  # type: ignore[union-attr]
        known = self._book.answer_of(update_id)
        if known is not None:
            return known
        # The validator refused every start the book cannot take (_admit); an exception
        # here is a bug, and it fails the workflow task: the update waits, and a fixed
        # build answers it from the history.
        decision = self._book.submit(request, workflow.now().timestamp())
        answer = decision.answer
        workflow.logger.info(
            "flow start %s: %s (%s)", self._book.key, answer.status, answer.workflow_id
        )
        if decision.cancel is not None:
            await self._cancel(decision.cancel)
        if decision.launch is not None:
            run_id = await self._launch(decision.launch)
            if decision.launch.run.workflow_id == answer.workflow_id:
                answer = answer.model_copy(update={"run_id": run_id})
        self._book.remember(update_id, answer)
        self._show()
        return answer

    @start.validator
    def _admit(self, request: FlowRequest) -> None:
        """Refuse, writing no history: a full queue, too many bytes held, a changed
        mode while runs are pending (``flow_refused``). A start already answered is
        not refused: it gets its answer again."""
        if self._book.answer_of(workflow.current_update_info().id) is not None:  # type: ignore[union-attr]
            return
        why = self._book.refusal(request, workflow.now().timestamp())
        if why is not None:
            raise ApplicationError(why, type=ErrorCode.FLOW_REFUSED.value, non_retryable=True)

    @workflow.query(name=names.FLOW_STATE_QUERY)
    def state(self) -> dict[str, Any]:
        """The mode, the pending runs (id, starts, when), the running run, the counts."""
        return {
            "flow_workflow_id": self._book.flow_workflow_id,
            **self._book.view(workflow.now().timestamp()),
        }

    @workflow.run
    async def run(self, state: FlowState) -> dict[str, Any]:
        """Start each run when its time comes; continue as new to keep history
        bounded; complete when idle. Returns the last view (``state``).

        The timer it waits on moves only when a start needs an earlier wake-up
        (a new run's deadline before it): a start that pushes a debounce later
        leaves the timer alone, which then fires, finds the run not due and waits
        again; so a start costs its update's events alone, not a timer's cancel
        and restart as well.
        """
        book = self._book
        while True:
            # a run's close during this round wakes the wait below at once
            self._nudged = False
            for launch in book.due(workflow.now().timestamp()):
                await self._launch(launch)
            self._show()
            if book.running is None and self._history_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                if book.running is None:  # a start may have begun a singleton run meanwhile
                    workflow.continue_as_new(book.state())
                continue
            now = workflow.now().timestamp()
            idle = book.idle(now)
            wake = now + IDLE_SECONDS if idle else book.wake_at(now)
            try:
                await workflow.wait_condition(
                    functools.partial(self._wake_early, wake),
                    timeout=None if wake is None else timedelta(seconds=max(wake - now, 0.001)),
                    timeout_summary=f"flow {book.key}: "
                    + ("end when idle" if idle else "next start due"),
                )
            except TimeoutError:
                now = workflow.now().timestamp()
                if idle and book.idle(now) and workflow.all_handlers_finished():
                    return book.view(now)

    def _wake_early(self, armed: float | None) -> bool:
        """Whether to stop waiting before the timer armed for ``armed``: a run
        closed, the history is due to continue as new, or something is due before
        ``armed``."""
        if self._nudged or (self._book.running is None and self._history_full()):
            return True
        due = self._book.wake_at(workflow.now().timestamp())
        return due is not None and (armed is None or due < armed)

    @staticmethod
    def _history_full() -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            # read at each use: a test lowers it to see the carry-over
            or info.get_current_history_length() > bounds.MAX_HISTORY_EVENTS
        )

    async def _launch(self, launch: Launch) -> str | None:
        """Start one run as an abandoned child (see the module docstring); its run id.

        A singleton's run is watched: its close lets the next start."""
        pipeline, run = launch.pipeline, launch.run
        tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
        name = str(pipeline.get("name") or self._book.pipeline)
        on = search_attributes_on()
        try:
            handle = await workflow.start_child_workflow(
                names.PIPELINE_WORKFLOW,
                pipeline,
                id=run.workflow_id,
                task_queue=workflow.info().task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                cancellation_type=workflow.ChildWorkflowCancellationType.ABANDON,
                static_summary=launch.summary,
                search_attributes=(
                    names.pipeline_search_attributes("queued", tenant, name) if on else None
                ),
                memo=None if on else {MEMO_SEARCH_ATTRIBUTES: False},
                priority=Priority(
                    priority_key=run.priority_key,
                    fairness_key=run.fairness_key,
                    fairness_weight=run.fairness_weight,
                ),
            )
        except WorkflowAlreadyStartedError:
            # a run of this id exists already (a reset of this workflow re-ran its start)
            workflow.logger.warning("flow run %s was started already", run.workflow_id)
            self._book.closed(run.workflow_id)
            self._nudged = True
            return None
        if self._book.running == run.workflow_id:
            self._children[run.workflow_id] = handle
            self._watchers.add(asyncio.create_task(self._watch(handle)))
        return handle.first_execution_run_id

    async def _watch(self, handle: workflow.ChildWorkflowHandle[Any, Any]) -> None:
        """A singleton run closed (any way): let the next start."""
        try:
            await handle
        except ChildWorkflowError:
            pass  # failed, cancelled, terminated, timed out: closed all the same
        self._children.pop(handle.id, None)
        self._book.closed(handle.id)
        self._nudged = True
        self._watchers = {t for t in self._watchers if not t.done()}

    async def _cancel(self, workflow_id: str) -> None:
        """singleton ``cancel_running``: ask the running run to cancel (once its
        start is in the history: a start and its cancel may be asked in one task)."""
        await workflow.wait_condition(
            lambda: workflow_id in self._children or self._book.running != workflow_id
        )
        if self._book.running != workflow_id:
            return  # it closed meanwhile
        try:
            await workflow.get_external_workflow_handle(workflow_id).cancel()
        except FailureError as e:  # it closed before the request reached it
            workflow.logger.info("cancel of %s not delivered: %s", workflow_id, e)

    def _show(self) -> None:
        """The UI's current details (no command, no history event)."""
        text = self._book.details(workflow.now().timestamp())
        if text != self._shown:
            workflow.set_current_details(text)
            self._shown = text


__all__ = ["PipelineFlowWorkflow"]


SUBMIT_TIMEOUT = timedelta(seconds=180)
"""One ``flow-submit`` attempt: its start is sent again for up to 120 s while the
server does not land it (``workers/client/flow_start.py``), with room to spare."""
SUBMIT_ATTEMPTS = 5


@workflow.defn(name=names.FLOW_SCHEDULED_WORKFLOW)
class ScheduledFlowStartWorkflow:
    """A schedule's run of a pipeline that declares ``flow``.

    A Temporal Schedule starts its action on the server, where no client can send
    the start through the key's :class:`PipelineFlowWorkflow`; so the schedule of
    such a pipeline starts this workflow instead, whose one activity
    (``flow-submit``) makes the start exactly as ``aiworker run`` makes it: the
    ``start`` update of the key's flow workflow, or for ``singleton: refuse`` the
    keyed id with ``WorkflowIDConflictPolicy.FAIL``. Its result is the flow's
    answer (the run that will do the work, and why); a refused start fails it
    with ``flow_refused``, so the schedule's recent actions show it. Each attempt
    sends the same update id (this workflow run's): a retried activity is
    answered once.
    """

    @workflow.run
    async def run(self, pipeline: dict[str, Any]) -> FlowAnswer:
        try:
            answer: FlowAnswer = await workflow.execute_activity(
                names.FLOW_SUBMIT_ACTIVITY,
                pipeline,
                result_type=FlowAnswer,
                start_to_close_timeout=SUBMIT_TIMEOUT,
                retry_policy=RetryPolicy(
                    maximum_attempts=SUBMIT_ATTEMPTS,
                    non_retryable_error_types=[
                        ErrorCode.FLOW_REFUSED.value,
                        ErrorCode.INVALID_INPUT.value,
                    ],
                ),
            )
        except ActivityError as e:
            cause = e.cause
            if isinstance(cause, ApplicationError):
                raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from None
            raise
        workflow.set_current_details(f"{answer.status}: {answer.workflow_id} ({answer.reason})")
        return answer
