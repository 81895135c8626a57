"""The pipeline client: start, watch, review, list and redrive pipelines from Python.

Long on purpose (close to 1,000 lines): the one public class users drive
pipelines with, each operation with its full docstring, and the handle it returns.

One typed layer over ``temporalio.client.Client`` that the ``aiworker`` CLI,
the dev stack and users' code share::

    import aiworker

    pipelines = await aiworker.PipelineClient.connect()  # envconfig, or the dev stack beside it
    handle = await pipelines.start({"name": "hello", "steps": [...]})
    result = await pipelines.result(handle.id)  # a PipelineResult, however the run ended
    print(result.status, result.output)

Handles are the SDK's own, typed ``WorkflowHandle[PipelineWorkflow,
PipelineResult]`` (:data:`PipelineHandle`), as ``client.start_workflow(
PipelineWorkflow.run, ...)`` gives them, and behave as every Temporal handle:
``await handle.result()`` is the :class:`~aiworker.schemas.pipeline.PipelineResult`
of a run that ended ``succeeded`` or ``partial``, and raises
``WorkflowFailureError`` for any other (its cause an ``ApplicationError``
whose ``type`` is the error code and whose details carry the result:
:func:`~aiworker.schemas.outcomes.result_from_failure`).
:meth:`PipelineClient.result` returns the result of any ended run.
``handle.describe()``, ``handle.cancel()`` and the rest work as the SDK
documents. The workflow module is imported for its types only; importing it
starts nothing and loads no activity code.

A pipeline is checked with :func:`~aiworker.workers.process.pipeline_settings.check_spec`
before it starts (the spec, its steps' inputs against the workers' contracts,
model aliases and tenants), so a bad spec raises
:class:`~aiworker.schemas.pipeline_check.PipelineSpecError` here instead of
failing a workflow. Every client uses the pydantic data converter of
:mod:`aiworker.workers.client.temporal_client` (with external payload storage when
given settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from aiworker.config import catalog
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.callbacks import CallbackRequest
from aiworker.schemas.causes import PipelineError
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.flow_state import FlowAnswer
from aiworker.schemas.limits import RunConfig
from aiworker.schemas.outcomes import carried_result, result_from_failure
from aiworker.schemas.pipeline import PipelineResult, PipelineSpec
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.schemas.priority import start_priority
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.client import visibility as visibility
from aiworker.workers.client.callbacks import CallbackError, send_callback
from aiworker.workers.client.exit_guard import guard_exit
from aiworker.workers.client.flow_start import (
    FlowHandle,
    FlowRefusedError,
    FlowStart,
    plan_flow_start,
)
from aiworker.workers.client.flow_start import submit as submit_flow
from aiworker.workers.client.step_items import StepItemsError, read_items, spec_step
from aiworker.workers.client.temporal_client import TemporalUnreachableError, connect
from aiworker.workers.client.visibility import PipelineSummary, list_query
from aiworker.workers.process.live_registry import WorkerView, resolve_view
from aiworker.workers.process.pipeline_settings import check_spec
from aiworker.workers.quote import (
    START_HISTORY_LIMIT,
    Quote,
    over_threshold,
    quote,
    step_history,
)
from aiworker.workflows.pipeline import PipelineWorkflow

if TYPE_CHECKING:
    from aiworker.workers.client.events import Event as LiveEvent

__all__ = [
    "CallbackError",
    "PipelineClient",
    "PipelineHandle",
    "PipelineSummary",
    "RedriveError",
    "StepItemsError",
    "TemporalUnreachableError",
    "list_pipelines",
    "list_query",
    "redrive",
    "send_review",
    "start_pipeline",
]

log = logging.getLogger("aiworker.client")

# How long a client keeps what it read of the live registry before reading it again
# (a front door starting many pipelines asks once, not once a start).
VIEW_MAX_AGE_SECONDS = 5.0

# Ids a redrive tries past the highest one visibility lists before it gives up.
MAX_REDRIVE_ID_TRIES = 100

# How many of a run's first history events are read for its run config (it is
# recorded in the first workflow task: started, task events, then the marker).
RUN_CONFIG_EVENTS = 50

PipelineHandle: TypeAlias = WorkflowHandle[PipelineWorkflow, PipelineResult]
"""The handle of one pipeline run; ``await handle.result()`` is a ``PipelineResult``
when the run completed (``succeeded``, ``partial``) and raises
``WorkflowFailureError`` otherwise (:meth:`PipelineClient.result` reads either)."""


def _failure_doc(workflow_id: str, result: PipelineResult) -> dict[str, Any]:
    """The JSON of a run whose failure carried no result: its status, its error and
    its code, and an invalid pipeline's problems (the shape these always had)."""
    error = result.error or PipelineError(code=ErrorCode.INTERNAL.value, message="")
    doc: dict[str, Any] = {
        "workflow_id": workflow_id,
        "status": result.status,
        "error_code": error.code,
        "error": error.model_dump(mode="json"),
    }
    if problems := [c.message for c in error.cause]:
        doc["problems"] = problems
    return doc


class RedriveError(RuntimeError):
    """The pipeline cannot be redriven (still running, it succeeded, or it is another
    tenant's), or the redrive asked is invalid (``--from``, ``--input``); the message
    says why. ``conflict``: the run's state refuses it (running, nothing to redrive,
    no free id), not the request (the front door's 409 rather than 400)."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


class QuoteNotAcceptedError(RuntimeError):
    """A start refused with ``quote_not_accepted``: its cost quote (p95) is above
    the tenant's ``quote_accept_above_usd`` and the start did not accept it.

    Attributes:
        code: ``quote_not_accepted``.
        quote: the quote the start was held to (:class:`aiworker.workers.quote.Quote`).
        threshold: the tenant's threshold in US dollars.
    """

    code = ErrorCode.QUOTE_NOT_ACCEPTED

    def __init__(self, tenant: str, quote: Quote, threshold: float) -> None:
        self.quote = quote
        self.threshold = threshold
        super().__init__(
            f"the cost quote of pipeline {quote.pipeline!r} is {quote.cost_usd.p95:.6g} USD "
            f"(p95), above tenant {tenant!r}'s quote_accept_above_usd of {threshold:.6g} USD; "
            "accept it to start (--accept-quote, accept_quote) (quote_not_accepted)"
        )


class PipelineClient:
    """Pipelines on one Temporal namespace: the public client of aiworker.

    Args:
        client: a connected Temporal client; it should use aiworker's data
            converter (:meth:`connect` makes one that does).
        settings: the deployment's settings; the task queue suffix, the
            external payload storage and the caps (``AIWORKER_MAX_*``, checked
            before a pipeline starts) matter here. Defaults to ``Settings()``.
        known_workers: the worker ids a pipeline's steps may name, instead of
            the live registry's (their input is checked only where this
            process knows their spec). By default a pipeline is checked
            against the workers the live registry lists (every live worker
            process publishes what it serves, :mod:`aiworker.workers.process.live_registry`),
            and against the workers this process knows (the built-ins, or the
            catalog a worker process installed) when the registry cannot be
            read or lists no process.

    Attributes:
        temporal: the underlying Temporal client, for anything this class
            does not wrap (schedules, batch operations, raw handles).
        settings: the settings the client runs with.
    """

    def __init__(
        self,
        client: Client,
        settings: Settings | None = None,
        *,
        known_workers: Collection[str] | None = None,
    ) -> None:
        # a script's exit must not race Core's threads (a client made elsewhere too)
        guard_exit()
        self.temporal = client
        self.settings = settings if settings is not None else Settings()
        self._known = set(known_workers) if known_workers is not None else None
        self._view: WorkerView | None = None
        self._view_read_at = 0.0
        self._view_lock = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        profile: str | None = None,
        *,
        settings: Settings | None = None,
        known_workers: Collection[str] | None = None,
        **overrides: Any,
    ) -> PipelineClient:
        """Connect as ``temporalio.envconfig`` says; told no server, to the
        ``aiworker dev`` stack of the data directory (saying so on stderr), else
        ``localhost:7233`` (:func:`~aiworker.workers.client.temporal_client.resolve_target`).

        Args:
            profile: the envconfig profile; the default profile when omitted.
            settings: see the class; with settings the client also reads and
                writes large payloads in the configured external storage.
            known_workers: see the class.
            **overrides: connection options that win over envconfig
                (``target_host``, ``namespace``, ``api_key``, ``telemetry``, ...).

        Returns:
            A client of the pipelines on that namespace.

        Raises:
            TemporalUnreachableError: the frontend did not answer.
        """
        client = await connect(profile, settings=settings, **overrides)
        return cls(client, settings, known_workers=known_workers)

    async def worker_view(self, *, refresh: bool = False) -> WorkerView:
        """The workers pipelines are checked against: the live registry's when it
        answers and lists a process, else this process's (``view.source`` and
        ``view.describe()`` say which, and why). Read at most every
        :data:`VIEW_MAX_AGE_SECONDS` unless ``refresh``."""
        if self._known is not None:
            return WorkerView(catalog.current_specs(), "local", "known_workers given")
        # one read at a time: concurrent starts (the front door) share its answer
        async with self._view_lock:
            age = time.monotonic() - self._view_read_at
            if self._view is None or refresh or age > VIEW_MAX_AGE_SECONDS:
                view = await resolve_view(self.temporal, self.settings, catalog.current_specs)
                for warning in view.warnings:
                    log.warning(warning)
                self._view, self._view_read_at = view, time.monotonic()
            return self._view

    async def check_live(self, pipeline: Mapping[str, Any]) -> PipelineSpec:
        """:meth:`check` against the live registry's workers (:meth:`worker_view`):
        a pipeline that names a worker no live process serves is refused, naming
        the worker and the registry's list; a worker the registry knows passes
        with the same input checks as a local one, though this process lacks it.

        Raises:
            PipelineSpecError: every problem found, each naming the step and field.
            ModelsFileError: the settings name a models file that is unusable.
        """
        await self.worker_view()
        return self.check(pipeline)

    def check(self, pipeline: Mapping[str, Any]) -> PipelineSpec:
        """Check a pipeline spec without starting it: the spec, each step's input
        against its worker's contract, and this client's settings (model aliases,
        the tenant registry), as ``aiworker check`` does; against the workers the
        live registry listed when :meth:`worker_view` last read it, else this
        process's.

        Raises:
            PipelineSpecError: every problem found, each naming the step and field.
            ModelsFileError: the settings name a models file that is unusable.
        """
        if self._view is not None and self._known is None:
            return self._view.check(dict(pipeline), self.settings)
        specs = catalog.current_specs()
        if self._known is None:
            workers: dict[str, WorkerSpec | None] = dict(specs)
        else:
            workers = {w: specs.get(w) for w in self._known}
        return check_spec(dict(pipeline), workers, self.settings)

    async def start(
        self,
        pipeline: Mapping[str, Any],
        *,
        workflow_id: str | None = None,
        check: bool = True,
        id_reuse_policy: WorkflowIDReusePolicy = WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        accept_quote: bool = False,
    ) -> PipelineHandle:
        """Check a pipeline and start it; returns at once with its handle.

        Args:
            pipeline: the pipeline spec as JSON (the ``aiworker run`` file's content).
            workflow_id: the workflow id; ``<name>-<random>`` when omitted.
            check: check the spec here first (:meth:`check_live`). ``False`` leaves the check to the
                workflow, which fails the run with a non-retryable
                ``invalid_input`` (for a client that cannot know the workers).
            id_reuse_policy: whether a workflow id that ended may start again
                (Temporal's default: it may).
            accept_quote: start even when the cost quote is above the tenant's
                ``quote_accept_above_usd`` (:meth:`quote_start`).

        Returns:
            The run's typed handle.

        Raises:
            PipelineSpecError: the spec is invalid; nothing was started.
            QuoteNotAcceptedError: the quote is above the tenant's threshold and
                ``accept_quote`` is not set; nothing was started.
        """
        if check:
            await self.check_live(pipeline)
        if not accept_quote:
            await self.quote_start(pipeline)
        flow = plan_flow_start(pipeline, self.settings.task_queue_suffix)
        if flow is not None:
            return await self._start_with_flow(pipeline, flow, workflow_id)
        name = str(pipeline.get("name") or "pipeline")
        return await self.temporal.start_workflow(
            PipelineWorkflow.run,
            dict(pipeline),
            id=workflow_id or f"{name}-{uuid.uuid4().hex[:12]}",
            id_reuse_policy=id_reuse_policy,
            **self.start_options(pipeline),
        )

    async def _start_with_flow(
        self, pipeline: Mapping[str, Any], flow: FlowStart, workflow_id: str | None = None
    ) -> FlowHandle:
        """Start under the pipeline's ``flow`` (:mod:`.flow_start`): ``singleton:
        refuse`` as the keyed id with ``WorkflowIDConflictPolicy.FAIL``; any other
        mode as the ``start`` update of the key's flow workflow. A caller's
        ``workflow_id`` becomes the update's id (the same start sent twice is
        answered once); the runs' ids are the flow's.

        Returns:
            The handle of the run that will do the work, with the answer as ``flow``
            (the run may not exist yet: :func:`~.flow_start.wait_started`).

        Raises:
            FlowRefusedError: ``singleton: refuse`` and a run holds the key, or the
                flow workflow refused the start.
        """
        options = self.start_options(pipeline)
        if not flow.refuse:
            return await submit_flow(
                self.temporal,
                pipeline,
                flow,
                task_queue=options["task_queue"],
                priority=options["priority"],
                update_id=workflow_id,
            )
        try:
            handle = await self.temporal.start_workflow(
                PipelineWorkflow.run,
                dict(pipeline),
                id=flow.workflow_id,
                id_conflict_policy=flow.id_conflict_policy,
                **options,
            )
        except WorkflowAlreadyStartedError as e:
            raise FlowRefusedError(flow.key, flow.workflow_id, e.run_id) from e
        answer = FlowAnswer(
            status="started",
            workflow_id=handle.id,
            run_id=handle.result_run_id,
            reason=f"singleton: refuse: at most one run of key {flow.key!r} at a time",
            flow_workflow_id=handle.id,
        )
        return FlowHandle(self.temporal, answer, flow.key)

    async def quote_start(
        self, pipeline: Mapping[str, Any], *, accept_quote: bool = False
    ) -> Quote | None:
        """The cost quote a start of ``pipeline`` is held to, when its tenant sets
        ``quote_accept_above_usd`` in the tenants file (else None: nothing is read).

        The quote is made here, in the starting process, from the recorded calls
        of the same workers (at most :data:`~aiworker.workers.quote.START_HISTORY_LIMIT`
        per worker, bounded in time). A quote that estimated no step (no
        history) does not block; the caller may say so (``quote.unknown``).

        Raises:
            QuoteNotAcceptedError: its p95 cost is above the threshold and
                ``accept_quote`` is not set.
        """
        registry = self.settings.tenants
        tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
        policy = registry.policy(tenant) if registry is not None else None
        threshold = policy.quote_accept_above_usd if policy is not None else None
        if threshold is None:
            return None
        try:
            spec = PipelineSpec.model_validate(dict(pipeline))
        except ValueError:
            return None  # the workflow refuses an invalid spec (invalid_input)
        q = quote(spec, await step_history(self.temporal, spec, limit=START_HISTORY_LIMIT))
        if over_threshold(q, threshold) and not accept_quote:
            raise QuoteNotAcceptedError(tenant, q, threshold)
        return q

    def start_options(self, pipeline: Mapping[str, Any]) -> dict[str, Any]:
        """How every run of ``pipeline`` starts, by :meth:`start` or by a schedule's
        action (:mod:`aiworker.workers.schedules.schedules`): its task queue, search
        attributes, summary and priority (the spec's, with the tenant as fairness
        key), as keyword arguments of ``Client.start_workflow``."""
        name = str(pipeline.get("name") or "pipeline")
        tenant = str(pipeline.get("tenant") or names.DEFAULT_TENANT)
        return {
            "task_queue": self.settings.queue(names.PIPELINES_QUEUE),
            "search_attributes": names.pipeline_search_attributes("queued", tenant, name),
            "static_summary": f"pipeline {name} (tenant {tenant})",
            # for the pipeline's tasks too: its activities and children inherit it
            "priority": start_priority(pipeline, self.settings.tenants),
        }

    def get_handle(self, workflow_id: str, run_id: str | None = None) -> PipelineHandle:
        """The typed handle of a pipeline started earlier (the latest run unless ``run_id``)."""
        return self.temporal.get_workflow_handle_for(
            PipelineWorkflow.run, workflow_id, run_id=run_id
        )

    async def result(self, workflow_id: str, run_id: str | None = None) -> PipelineResult:
        """Wait for a pipeline to end and return its result, however it ended.

        The one way to the :class:`~aiworker.schemas.pipeline.PipelineResult` of
        any ended run: a run that ended ``succeeded`` or ``partial`` completed with
        it; any other failed its workflow execution carrying it in the failure's
        details (:func:`~aiworker.schemas.outcomes.result_from_failure` takes it
        from there). A run that failed without one (an invalid pipeline, a cancel,
        a terminate) gives a result built from the failure: status ``failed``
        (``cancelled`` for a cancel), its ``error`` the failure's code and message.
        ``handle.result()`` is Temporal's own: it raises
        ``WorkflowFailureError`` for every run that did not complete.
        """
        try:
            return await self.get_handle(workflow_id, run_id).result()
        except WorkflowFailureError as e:
            return result_from_failure(e)

    async def events(
        self,
        workflow_id: str,
        last_event_id: str | None = None,
        *,
        run_id: str | None = None,
        poll_seconds: float | None = None,
    ) -> AsyncIterator[LiveEvent]:
        """The pipeline's live events as they happen, ending with ``run_ended``
        (``async for event in client.events(id, last_event_id=...)``): the same
        events, with the same ids, as ``GET /v1/pipelines/{id}/events``
        (:mod:`aiworker.workers.client.events`). Resume after an event with its id.

        Raises:
            ValueError: ``last_event_id`` is not an id of this stream.
            temporalio.service.RPCError: no such workflow (``NOT_FOUND``).
        """
        from aiworker.workers.client import events as live

        live.Cursor.parse(last_event_id)  # a bad id fails before any call
        if run_id is None:
            run_id = (await self.temporal.get_workflow_handle(workflow_id).describe()).run_id
        poll = live.POLL_SECONDS if poll_seconds is None else poll_seconds
        async for event in live.follow(
            self.temporal, workflow_id, run_id, last_event_id=last_event_id, poll_seconds=poll
        ):
            yield event

    async def outcome(self, workflow_id: str, run_id: str | None = None) -> dict[str, Any]:
        """Wait for a pipeline and describe how it ended as one JSON document.

        The result (:meth:`result`) with its ``workflow_id``; when the workflow
        failed without a result (an invalid pipeline, a cancel, a terminate),
        ``{"workflow_id", "status", "error_code", "error"}`` with ``error`` shaped
        as a result's (``step`` null, each problem of an invalid spec a cause,
        also listed as ``problems``). ``aiworker run`` and the front door print this.
        """
        try:
            result = await self.get_handle(workflow_id, run_id).result()
        except WorkflowFailureError as e:
            result = result_from_failure(e)
            if carried_result(e) is None:
                return _failure_doc(workflow_id, result)
        return {"workflow_id": workflow_id, **result.model_dump(mode="json")}

    async def progress(self, workflow_id: str, *, include_outputs: bool = False) -> dict[str, Any]:
        """The ``progress`` query: each step's status, attempts, error code and usage."""
        return await self.get_handle(workflow_id).query(PipelineWorkflow.progress, include_outputs)

    async def send_review(
        self,
        workflow_id: str,
        decision: str,
        *,
        outputs: dict[str, Any] | None = None,
        reviewer: str | None = None,
        note: str | None = None,
        step: str | None = None,
    ) -> dict[str, Any]:
        """Decide on a step awaiting review (the ``review`` Workflow Update).

        Args:
            workflow_id: the pipeline.
            decision: ``approve``, ``reject`` or ``retry``.
            outputs: corrected outputs (approve); checked against the step's schema.
            reviewer: who decides; by default this process's user
                (:func:`getpass.getuser`), else the workflow names the Update.
            note: a note kept in the step's result.
            step: the step, when several await review.

        Returns:
            The workflow's answer: ``{"step", "decision", "reviewer", "update_id"}``
            (the Update's id, also kept in the step's ``review``).

        Raises:
            temporalio.client.WorkflowUpdateFailedError: the workflow refused
                the decision (no step awaits review, outputs off schema, ...).
        """
        arg: dict[str, Any] = {"decision": decision}
        with contextlib.suppress(OSError, KeyError):  # no login name, a uid without a user
            reviewer = reviewer or getpass.getuser()
        if reviewer:
            arg["reviewer"] = reviewer
        if outputs is not None:
            arg["outputs"] = outputs
        if note:
            arg["note"] = note
        if step:
            arg["step"] = step
        # By name: the SDK's `@workflow.update(name=...)` overload types an async
        # handler's result as its coroutine, so the method would not type-check.
        answer: dict[str, Any] = await self.get_handle(workflow_id).execute_update(
            names.REVIEW_UPDATE, arg, result_type=dict
        )
        return answer

    async def complete_callback(self, token: str, outputs: dict[str, Any]) -> dict[str, Any]:
        """Complete a wait step's token with ``outputs`` (checked against its
        ``wait.schema``; they become the step's outputs).

        Returns:
            The run's reply, ``{"step", "item"?, "status": "completed"}``; the same
            completion again returns the first reply with ``"repeat": true``.

        Raises:
            CallbackError: refused: ``status`` 404 (unknown token), 409 (answered
                before with another answer), 410 (the wait ended), 422 (outputs off
                the schema; the message names the field).
        """
        return await send_callback(
            self.temporal, CallbackRequest(token=token, action="complete", outputs=outputs)
        )

    async def fail_callback(self, token: str, message: str) -> dict[str, Any]:
        """Fail a wait step's token with ``message``: the step fails ``callback_failed``
        (then ``on_failure`` as for any failed step). Replies and refusals as
        :meth:`complete_callback`."""
        return await send_callback(
            self.temporal, CallbackRequest(token=token, action="fail", message=message)
        )

    async def heartbeat_callback(
        self, token: str, extend_seconds: float | None = None
    ) -> dict[str, Any]:
        """Keep a wait step's token alive: its deadline becomes now plus ``extend_seconds``
        (default: the step's ``timeout_seconds``), never earlier than it was.

        Returns:
            ``{"step", "item"?, "status": "waiting", "timeout_at"}``.

        Raises:
            CallbackError: as :meth:`complete_callback`; 429 once the run took its
                heartbeats (2000 per run).
        """
        request = CallbackRequest(token=token, action="heartbeat", extend_seconds=extend_seconds)
        return await send_callback(self.temporal, request)

    async def list_pipelines(
        self,
        *,
        status: str | None = None,
        tenant: str | None = None,
        pipeline: str | None = None,
        limit: int = 100,
    ) -> list[PipelineSummary]:
        """Pipelines matching every filter given, newest first (at most ``limit``).

        Visibility is eventually consistent: a status change shows up here
        shortly after it happens.
        """
        out: list[PipelineSummary] = []
        query = list_query(status, tenant, pipeline)
        async for wf in self.temporal.list_workflows(query, limit=limit):
            sa = wf.typed_search_attributes
            out.append(
                PipelineSummary(
                    workflow_id=wf.id,
                    run_id=wf.run_id,
                    status=sa.get(names.STATUS_KEY),
                    tenant=sa.get(names.TENANT_KEY),
                    pipeline=sa.get(names.PIPELINE_KEY),
                    execution_status=wf.status.name if wf.status else None,
                    start_time=wf.start_time,
                )
            )
        return out

    async def started_input(
        self, workflow_id: str, run_id: str | None = None
    ) -> dict[str, Any] | None:
        """The pipeline a run was started with (its first history event's input),
        or None when the run has no history.

        Only the first event is read: one page of one event, not the whole
        history (a for_each parent's can run to megabytes).
        """
        handle = self.get_handle(workflow_id, run_id)
        async for event in handle.fetch_history_events(page_size=1):
            first = event.workflow_execution_started_event_attributes
            decoded = await self.temporal.data_converter.decode(first.input.payloads)
            return dict(decoded[0]) if decoded and isinstance(decoded[0], dict) else None
        return None

    async def step_results(
        self, workflow_id: str, run_id: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """How a run ended and its steps' results as JSON, once it has ended.

        From its result (:meth:`result`: the completion's, or the one its failure
        carries); when the workflow failed without one (cancelled, terminated, an
        invalid spec), ``"failed"`` and the steps its ``progress`` query reports (a
        worker replays the run to answer).
        """
        handle = self.get_handle(workflow_id, run_id)
        try:
            result = await handle.result()
        except WorkflowFailureError as e:
            carried = carried_result(e)
            if carried is None:
                progress = await handle.query(PipelineWorkflow.progress, True)
                return "failed", dict(progress.get("steps") or {})
            result = carried
        return result.status, {k: v.model_dump(mode="json") for k, v in result.steps.items()}

    async def items(
        self,
        workflow_id: str,
        step_id: str,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
    ) -> list[Any]:
        """A for_each step's items (each item's outputs, ``None`` where one failed),
        once the pipeline has ended, whether its result holds them inline or by
        reference (an :class:`~aiworker.schemas.pipeline.ItemsRef`, above
        ``AIWORKER_FOREACH_INLINE_ITEMS`` items), read from this client's
        artifact store (``settings``) as the run's tenant.

        Args:
            workflow_id: the pipeline.
            step_id: the for_each step.
            run_id: the run (default: the latest).
            tenant: when given (a front door acting for a tenant), the run must
                be this tenant's.

        Returns:
            The list ``${{ steps.<step_id>.outputs.items }}`` gave inside the pipeline.

        Raises:
            StepItemsError: not a pipeline or not ``tenant``'s, no such step, not
                a for_each step, no items, or a part the store could not give;
                its ``code`` is the stable error code.
            temporalio.service.RPCError: no such workflow (``NOT_FOUND``).
        """
        desc = await self.get_handle(workflow_id, run_id).describe()
        started = await self.started_input(workflow_id, desc.run_id)
        owner = str((started or {}).get("tenant") or names.DEFAULT_TENANT)
        if desc.workflow_type != names.PIPELINE_WORKFLOW or started is None:
            raise StepItemsError(
                f"{workflow_id} is a {desc.workflow_type} workflow, not a pipeline",
                ErrorCode.INVALID_INPUT,
                step=step_id,
            )
        if tenant is not None and owner != tenant:
            raise StepItemsError(
                f"{workflow_id} is not a pipeline of tenant {tenant!r}",
                ErrorCode.ACCESS_DENIED,
                step=step_id,
            )
        spec_step(started, step_id)
        _, steps = await self.step_results(workflow_id, desc.run_id)
        return await read_items(self.settings, owner, step_id, steps.get(step_id))

    async def redrive_input(
        self,
        workflow_id: str,
        tenant: str | None = None,
        from_step: str | None = None,
        *,
        inputs: Mapping[str, Any] | None = None,
        new_idempotency_keys: bool = False,
    ) -> dict[str, Any]:
        """The input of a new run that reuses the steps a failed run finished.

        The original pipeline comes from the first event of the failed run's
        history; the finished steps from its result, or (when the run failed,
        was cancelled or terminated) from its ``progress`` query.
        ``resume_from`` names the first run, so the new run keeps its
        idempotency keys. ``tenant``, when given (a front door acting for a
        tenant), must be the failed run's: its outputs are read here. The new
        run checks the same again at its start, however it was started.

        ``from_step`` (``aiworker redrive ID --from STEP``): rerun that top-level
        step and everything downstream of it even after a success; its recorded
        result is left out of ``resume_from``, so
        :func:`~aiworker.workflows.redrive.plan_redrive` reruns it and its
        dependents and reuses the rest (same mechanism, no second one).

        ``inputs`` (``--input STEP=JSON``): a corrected input for ``from_step``
        (the only step it may name), checked before anything starts against the
        worker specs the run recorded at its start (its run config), and for a
        worker it did not record, the live registry's (:meth:`recorded_specs`).

        ``new_idempotency_keys``: the steps that run again use keys under the
        new run's id instead of the first run's, so a side-effect step (publish)
        does its effect again; by default they keep the first run's keys and an
        effect already done is recognised as done.

        Raises:
            RedriveError: the pipeline is still running, it succeeded (without
                ``from_step``), it is not ``tenant``'s, ``from_step`` is not
                one of its top-level steps, or ``inputs`` names another step or
                fails its worker's input schema.
        """
        handle = self.get_handle(workflow_id)
        desc = await handle.describe()
        if desc.workflow_type != names.PIPELINE_WORKFLOW:
            raise RedriveError(f"{workflow_id} is a {desc.workflow_type} workflow, not a pipeline")
        if desc.status == WorkflowExecutionStatus.RUNNING:
            raise RedriveError(f"{workflow_id} is still running; cancel it or wait", conflict=True)
        started = await self.started_input(workflow_id, desc.run_id)
        if started is None:
            raise RedriveError(f"{workflow_id} has no history to redrive from")
        pipeline = started
        if tenant is not None and pipeline.get("tenant", names.DEFAULT_TENANT) != tenant:
            raise RedriveError(f"{workflow_id} is not a pipeline of tenant {tenant!r}")
        if from_step is not None:
            top = [s.get("id") for s in pipeline.get("steps", []) if isinstance(s, dict)]
            if from_step not in top:
                raise RedriveError(
                    f"--from {from_step!r}: {workflow_id} has no top-level step of that id "
                    f"(steps: {', '.join(str(t) for t in top)}; a for_each child or item "
                    "cannot be rerun on its own)"
                )
        if inputs:
            await self._corrected_input(pipeline, workflow_id, desc.run_id, from_step, inputs)
        status, steps = await self.step_results(workflow_id, desc.run_id)
        if status == "succeeded" and from_step is None:
            raise RedriveError(f"{workflow_id} succeeded; nothing to redrive", conflict=True)
        # a for_each stopped by its tolerated_failures keeps its succeeded items too
        reuse = {
            sid: r
            for sid, r in steps.items()
            if isinstance(r, dict)
            and sid != from_step
            and (
                r.get("status") in names.OK_STATUSES
                or r.get("error_code") == ErrorCode.TOO_MANY_FAILURES.value
            )
        }
        previous = pipeline.get("resume_from") or {}
        root = previous.get("workflow_id") or workflow_id
        pipeline["resume_from"] = {"workflow_id": root, "run_id": desc.run_id, "steps": reuse}
        if new_idempotency_keys:
            pipeline["resume_from"]["new_keys"] = True
        return pipeline

    async def _corrected_input(
        self,
        pipeline: dict[str, Any],
        workflow_id: str,
        run_id: str | None,
        from_step: str | None,
        inputs: Mapping[str, Any],
    ) -> None:
        """Put ``inputs[from_step]`` in as that step's input, checked first."""
        others = sorted(set(inputs) - {from_step}) if from_step else sorted(inputs)
        if from_step is None or others:
            named = ", ".join(repr(str(k)) for k in others)
            raise RedriveError(
                f"--input {named}: only the --from step can take a corrected input"
                + (f" (--from {from_step!r})" if from_step else " (no --from given)")
            )
        value = inputs[from_step]
        if not isinstance(value, dict):
            raise RedriveError(
                f"--input {from_step}: the input must be a JSON object, not {type(value).__name__}"
            )
        step = next(s for s in pipeline["steps"] if s.get("id") == from_step)
        step["input"] = value
        # the run's record wins; the live registry's for a worker it did not record
        live = (await self.worker_view()).specs
        workers = {**live, **await self.recorded_specs(workflow_id, run_id)}
        try:
            # off the event loop (a front door serves other requests meanwhile): the
            # check compiles schemas and patterns, bounded by the caps but CPU work
            await asyncio.to_thread(parse_pipeline, pipeline, workers)
        except PipelineSpecError as e:
            raise RedriveError(f"--input {from_step}: " + "; ".join(e.problems)) from None

    async def recorded_specs(
        self, workflow_id: str, run_id: str | None = None
    ) -> dict[str, WorkerSpec]:
        """The worker specs a run decides from, as its run config recorded them at
        its start (the ``run-config`` local activity's result in its history,
        :mod:`aiworker.schemas.recorded`); empty for a run started before specs
        were recorded. Only the first events are read: the run config is the
        first thing a run waits for."""
        handle = self.get_handle(workflow_id, run_id)
        recorded: dict[str, WorkerSpec] = {}
        seen = 0
        async for event in handle.fetch_history_events(page_size=RUN_CONFIG_EVENTS):
            seen += 1
            if seen > RUN_CONFIG_EVENTS:
                break
            if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
                continue
            attrs = event.marker_recorded_event_attributes
            data = attrs.details.get("data")
            result = attrs.details.get("result")
            if data is None or result is None or not data.payloads:
                continue
            try:
                kind = json.loads(data.payloads[0].data).get("activity_type")
            except ValueError:
                continue
            if kind != names.RUN_CONFIG:
                continue
            decoded = await self.temporal.data_converter.decode(result.payloads)
            if decoded and isinstance(decoded[0], dict):
                config = RunConfig.model_validate(decoded[0])
                recorded = dict(config.specs)
            break
        return recorded

    async def redrive(
        self,
        workflow_id: str,
        tenant: str | None = None,
        from_step: str | None = None,
        *,
        inputs: Mapping[str, Any] | None = None,
        new_idempotency_keys: bool = False,
    ) -> PipelineHandle:
        """Start the failed pipeline ``workflow_id`` again: its succeeded steps are
        reused, the rest runs again, a for_each only its failed items
        (:func:`~aiworker.workflows.redrive.plan_redrive`; ``tenant``: see
        :meth:`redrive_input`).

        Returns:
            The new run's handle (see :meth:`start_redrive` for its id).

        Raises:
            RedriveError: the pipeline is still running, it succeeded, or it
                is not ``tenant``'s.
        """
        return await self.start_redrive(
            await self.redrive_input(
                workflow_id,
                tenant,
                from_step=from_step,
                inputs=inputs,
                new_idempotency_keys=new_idempotency_keys,
            )
        )

    async def start_redrive(self, pipeline: Mapping[str, Any]) -> PipelineHandle:
        """Start a redrive input (:meth:`redrive_input`) as ``<first id>-redrive-<n>``.

        ``n`` counts the redrives of the first run: one more than the highest
        the visibility store lists, and the next one again while an id is
        taken (by a run visibility does not show yet, or one started by hand).

        Raises:
            RedriveError: no free id within :data:`MAX_REDRIVE_ID_TRIES` tries.
        """
        root = pipeline["resume_from"]["workflow_id"]
        first = await visibility.last_redrive(self.temporal, root) + 1
        for n in range(first, first + MAX_REDRIVE_ID_TRIES):
            try:
                # The spec is the one the first run started with; the new run checks
                # it against the workers that serve it (this process may not know them all).
                return await self.start(
                    pipeline,
                    workflow_id=f"{root}-redrive-{n}",
                    check=False,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    accept_quote=True,  # the first run was started (and quoted)
                )
            except WorkflowAlreadyStartedError:
                continue
        raise RedriveError(
            f"{root}-redrive-{first}..{first + MAX_REDRIVE_ID_TRIES - 1} are all taken",
            conflict=True,
        )


# The same operations for code that holds a plain ``temporalio.client.Client``.


async def start_pipeline(
    client: Client,
    settings: Settings,
    pipeline: Mapping[str, Any],
    workflow_id: str | None = None,
) -> PipelineHandle:
    """:meth:`PipelineClient.start` on ``client``, leaving the spec check to the workflow."""
    return await PipelineClient(client, settings).start(
        pipeline, workflow_id=workflow_id, check=False
    )


async def send_review(
    client: Client, workflow_id: str, decision: str, **options: Any
) -> dict[str, Any]:
    """:meth:`PipelineClient.send_review` on ``client``."""
    return await PipelineClient(client).send_review(workflow_id, decision, **options)


async def list_pipelines(client: Client, **filters: Any) -> list[dict[str, Any]]:
    """:meth:`PipelineClient.list_pipelines` on ``client``, as JSON rows."""
    rows = await PipelineClient(client).list_pipelines(**filters)
    return [row.to_json() for row in rows]


async def redrive(
    client: Client,
    settings: Settings,
    workflow_id: str,
    from_step: str | None = None,
    *,
    inputs: Mapping[str, Any] | None = None,
    new_idempotency_keys: bool = False,
) -> PipelineHandle:
    """:meth:`PipelineClient.redrive` on ``client``."""
    return await PipelineClient(client, settings).redrive(
        workflow_id, from_step=from_step, inputs=inputs, new_idempotency_keys=new_idempotency_keys
    )
