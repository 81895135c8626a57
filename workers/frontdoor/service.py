"""The front door's operations (:mod:`aiworker.workers.frontdoor.serve` routes to them):
start once per idempotency key, describe, wait for a result, read a for_each
step's items, review, redrive, webhooks.

Each takes the caller's :class:`~aiworker.workers.frontdoor.auth.ApiKey` (the
tenant it acts for) and answers with JSON or raises an
:class:`~aiworker.workers.frontdoor.http.ApiError`; Temporal's own exceptions
escape to the app's handlers (503 when it does not answer).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.client import (
    RPCTimeoutOrCancelledError,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.callbacks import MAX_WAIT_SECONDS, CallbackBody, CallbackRequest
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.messages import type_name
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.client.callbacks import UNKNOWN as UNKNOWN_TOKEN
from aiworker.workers.client.callbacks import CallbackError, run_of, send_callback
from aiworker.workers.client.client import PipelineClient, QuoteNotAcceptedError, RedriveError
from aiworker.workers.client.flow_start import FlowHandle, FlowRefusedError, flow_doc
from aiworker.workers.client.pollers import unserved
from aiworker.workers.client.step_items import ItemsPartError, StepItemsError
from aiworker.workers.frontdoor.auth import (
    ApiKey,
    FrontDoorRateLimiter,
    KeyRing,
    ReadyHook,
    SignatureError,
    verify_github,
    verify_stripe,
)
from aiworker.workers.frontdoor.http import (
    ApiError,
    canonical,
    parse_json,
    pipeline_path,
    read_body,
    validation_error,
)

log = logging.getLogger("aiworker.serve")

# Longest a GET .../result holds a connection; longer waits poll again (202).
MAX_RESULT_WAIT_SECONDS = 60.0
# A pipeline body nests a few levels above the step inputs the caps bound.
SPEC_LEVELS = 8
MAX_IDEMPOTENCY_KEY_CHARS = 255
# Temporal answers a describe or query in milliseconds; a hung one must not hold a request.
RPC_TIMEOUT = timedelta(seconds=10)
ENDED_QUERY_TIMEOUT = timedelta(seconds=3)
# A callback body nests two levels ({"outputs": ...}) above what the caps allow a value.
CALLBACK_LEVELS = 2
# The review Update's reviewer field (schemas.pipeline.ReviewDecision) holds this much.
MAX_REVIEWER_CHARS = 200


@dataclass
class FrontDoor:
    """What the app serves from: Temporal, the keys, the hooks, the rates, the settings."""

    pipelines: PipelineClient
    keys: KeyRing
    hooks: dict[str, ReadyHook]
    settings: Settings
    limiter: FrontDoorRateLimiter


class HeartbeatRequest(BaseModel):
    """The body of ``POST /v1/callbacks/{token}/heartbeat`` (may be empty)."""

    model_config = ConfigDict(extra="forbid")
    extend_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description="the new deadline is now plus this (default: the step's timeout_seconds)",
    )


class ReviewRequest(BaseModel):
    """The body of ``POST /v1/pipelines/{id}/review`` (as ``aiworker review`` takes it)."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject", "retry"]
    outputs: dict[str, Any] | None = Field(default=None, description="corrected outputs (approve)")
    reviewer: str | None = Field(
        default=None,
        max_length=200,
        description="who decides; recorded with the API key's name (default: the key alone)",
    )
    note: str | None = Field(default=None, max_length=10_000)
    step: str | None = Field(default=None, description="the step, when several await review")


class PollerSeen(BaseModel):
    """A worker seen polling a run's task queue."""

    identity: str = Field(description="the worker's identity (pid@host by default)")
    build_id: str | None = Field(description="its build; null for an unversioned worker")
    deployment: str | None = Field(description="its Worker Deployment; null when unversioned")
    seconds_ago: float = Field(description="when it last polled")
    live: bool = Field(description="seen recently enough to be polling still")


class WaitingForWorker(BaseModel):
    """Why a run has not moved: no worker has picked up its workflow task."""

    task_queue: str = Field(description="the run's workflow task queue")
    waited_seconds: float = Field(description="how long its workflow task has waited")
    build_id: str | None = Field(
        description="the build it goes to: the build the run is pinned to, else the "
        "queue's current build; null: unversioned workers take it"
    )
    current_build: str | None = Field(description="the queue's current build")
    deployment: str | None = Field(description="the Worker Deployment of the current build")
    served: bool = Field(description="a live poller of that build is there")
    pollers: list[PollerSeen] = Field(description="every poller the queue lists")
    message: str = Field(description="the same in one line, with what to do")


class PipelineStatus(BaseModel):
    """The body of ``GET /v1/pipelines/{id}`` (and of a result's 202)."""

    model_config = ConfigDict(extra="allow")
    workflow_id: str
    run_id: str
    pipeline: str | None
    tenant: str | None
    status: str | None = Field(description="the pipeline's status (its search attribute)")
    execution_status: str | None = Field(description="the workflow execution's status")
    start_time: str | None
    close_time: str | None
    progress: dict[str, Any] | None = Field(
        description="the progress query: each step's status, attempts, error code and "
        "usage; null when the run does not answer (no worker has picked it up, or it ended)"
    )
    waiting_for_worker: WaitingForWorker | None = Field(
        description="null unless no worker has picked up the run's workflow task for a "
        "few seconds: then which queue and build it waits for, and the pollers seen"
    )


class RedriveRequest(BaseModel):
    """The body of ``POST /v1/pipelines/{id}/redrive`` (as ``aiworker redrive`` takes
    it; may be empty: a failed run again, reusing what succeeded)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_step: str | None = Field(
        default=None,
        alias="from",
        max_length=100,
        description="rerun this top-level step and everything downstream of it "
        "(also after a success), reusing the rest",
    )
    input: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="{STEP: input}: a corrected input for the `from` step, checked "
        "against its worker's input schema as the run recorded it",
    )
    new_idempotency_keys: bool = Field(
        default=False,
        description="steps that run again take new idempotency keys (their side effects "
        "happen again); default: the first run's",
    )


def reviewer_name(given: str | None, key: ApiKey) -> str:
    """The reviewer a review records: the name the caller gives, with the key that
    sent it (``"ann (api-key:ci)"``), or the key alone; never only a free-text name.

    A long name is cut to fit the Update's 200 characters; the key is never cut.
    """
    who = f"api-key:{key.name}"
    if not given:
        return who
    room = MAX_REVIEWER_CHARS - len(who) - 3
    if len(given) > room:
        given = given[: max(room - 1, 0)] + "…"
    return f"{given} ({who})"


def idempotent_id(prefix: str, tenant: str, key: str) -> str:
    """The workflow id a tenant's idempotency key (or a hook's delivery) maps to.

    Hashed, so that any key is a safe id and two tenants' equal keys never meet.
    """
    digest = hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()[:32]
    return f"{prefix}-{tenant}-{digest}"


def _spec_error(e: PipelineSpecError, checked_against: str) -> ApiError:
    problems = [p.to_json() for p in e.details]
    return ApiError(
        400, ErrorCode.INVALID_INPUT, str(e), problems=problems, checked_against=checked_against
    )


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _summary(desc: WorkflowExecutionDescription) -> dict[str, Any]:
    sa = desc.typed_search_attributes
    execution = desc.status.name.lower() if desc.status else None
    return {
        "workflow_id": desc.id,
        "run_id": desc.run_id,
        "pipeline": sa.get(names.PIPELINE_KEY),
        "tenant": sa.get(names.TENANT_KEY),
        "status": sa.get(names.STATUS_KEY) or execution,
        "execution_status": execution,
        "start_time": _iso(desc.start_time),
        "close_time": _iso(desc.close_time),
    }


class Service:
    """The routes' logic over one :class:`FrontDoor`."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.max_depth = door.settings.caps.max_json_depth + SPEC_LEVELS

    def caller(self, secret: str | None, how: str = "Authorization: Bearer <key>") -> ApiKey:
        """The API key a request presents (401 without a valid one, saying ``how``
        to present it), after its rate (429)."""
        key = self.door.keys.find(secret) if secret else None
        if key is None:
            raise ApiError(
                401,
                ErrorCode.ACCESS_DENIED,
                f"a valid API key is required ({how})",
                headers={"WWW-Authenticate": "Bearer"},
            )
        self.limit(f"key:{key.name}", key.rate_limit)
        return key

    def limit(self, bucket: str, rate: str | None) -> None:
        """Take a token from ``bucket``'s rate; 429 with Retry-After when none is left."""
        wait = self.door.limiter.take(bucket, rate)
        if wait > 0:
            raise ApiError.rate_limited(
                f"rate limit of {rate or self.door.settings.serve_rate_limit} reached", wait
            )

    def hold(self, bucket: str) -> None:
        """429 when ``bucket`` (at the default rate) has no token left, taking none."""
        wait = self.door.limiter.wait(bucket)
        if wait > 0:
            raise ApiError.rate_limited("too many refused requests", wait)

    async def start(self, body: bytes, key: ApiKey, idempotency_key: str | None) -> JSONResponse:
        """``POST /v1/pipelines``: the body's pipeline for the key's tenant."""
        raw = parse_json(body, self.max_depth)
        if not isinstance(raw, dict):
            message = f"the body is {type_name(raw)}, not a pipeline object"
            raise ApiError(400, ErrorCode.INVALID_INPUT, message)
        tenant = raw.get("tenant")
        if tenant is not None and tenant != key.tenant:
            raise ApiError(
                403,
                ErrorCode.ACCESS_DENIED,
                f"this API key acts for tenant {canonical(key.tenant)}; "
                f"the body names {canonical(tenant)}",
            )
        raw["tenant"] = key.tenant
        # not part of the spec: the caller accepts the cost quote (quote_not_accepted)
        accept_quote = raw.pop("accept_quote", False)
        if not isinstance(accept_quote, bool):
            message = f"accept_quote must be true or false, not {type_name(accept_quote)}"
            raise ApiError(400, ErrorCode.INVALID_INPUT, message)
        workflow_id = None
        if idempotency_key is not None:
            if not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
                raise ApiError(
                    400,
                    ErrorCode.INVALID_INPUT,
                    f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters",
                )
            workflow_id = idempotent_id("api", key.tenant, idempotency_key)
        return await self.start_once(
            raw, workflow_id, "this Idempotency-Key", accept_quote=accept_quote
        )

    async def start_once(
        self,
        pipeline: dict[str, Any],
        workflow_id: str | None,
        what: str,
        same_run: bool = False,
        *,
        accept_quote: bool = False,
    ) -> JSONResponse:
        """Check and start ``pipeline``; 201, or 200 for a retry of the same start.

        ``same_run``: the id alone says it is the same start (a webhook's body
        hash), so an existing run is the answer whatever the unsigned inputs say.
        ``accept_quote``: start even when the tenant's ``quote_accept_above_usd``
        holds the quote (else 422 ``quote_not_accepted``, nothing started).
        """
        pipelines = self.door.pipelines
        try:
            await pipelines.worker_view()
            # off the event loop: a check compiles schemas and patterns (bounded by
            # the caps of schemas/caps.py, still CPU work), and /healthz and every
            # other request wait while the loop is held
            await asyncio.to_thread(pipelines.check, pipeline)
        except PipelineSpecError as e:
            # which workers it was checked against: the live registry or local specs
            view = await pipelines.worker_view()
            raise _spec_error(e, view.describe()) from None
        try:
            handle = await pipelines.start(
                pipeline,
                workflow_id=workflow_id,
                check=False,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                accept_quote=accept_quote,
            )
        except PipelineSpecError as e:  # the flow key, resolved at start
            raise _spec_error(e, "the start's inputs") from None
        except FlowRefusedError as e:
            raise ApiError(
                409,
                ErrorCode.FLOW_REFUSED,
                str(e),
                flow="refused",
                workflow_id=e.workflow_id,
                run_id=e.run_id,
            ) from None
        except QuoteNotAcceptedError as e:
            raise ApiError(
                422, e.code, str(e), quote=e.quote.as_dict(), threshold_usd=e.threshold
            ) from None
        except WorkflowAlreadyStartedError as e:
            workflow_id = e.workflow_id
            first = None if same_run else await pipelines.started_input(workflow_id)
            if not same_run and (first is None or canonical(first) != canonical(pipeline)):
                raise ApiError(
                    409,
                    ErrorCode.INVALID_INPUT,
                    f"{what} started workflow {workflow_id} with another body; "
                    "use a new key for a new pipeline",
                    workflow_id=workflow_id,
                ) from None
            desc = await pipelines.get_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
            return _started(_summary(desc), 200)
        log.info(
            "started pipeline %s as %s for tenant %s",
            pipeline.get("name"),
            handle.id,
            pipeline.get("tenant"),
        )
        doc: dict[str, Any] = {
            "workflow_id": handle.id,
            "run_id": handle.result_run_id,
            "pipeline": pipeline.get("name"),
            "tenant": pipeline.get("tenant"),
            "status": "queued",
        }
        if isinstance(handle, FlowHandle):
            # what the pipeline's flow did with this start; a run not started yet
            # (collapsed into it or queued) is 202 and has no run id
            doc["flow"] = flow_doc(handle.flow)
            return _started(doc, 201 if handle.flow.status == "started" else 202)
        return _started(doc, 201)

    async def owned(self, workflow_id: str, key: ApiKey) -> WorkflowExecutionDescription:
        """The pipeline's description, if it is one of the key's tenant; else 404."""
        try:
            desc = await self.door.pipelines.get_handle(workflow_id).describe(
                rpc_timeout=RPC_TIMEOUT
            )
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
            desc = None
        if (
            desc is None
            or desc.workflow_type != names.PIPELINE_WORKFLOW
            or desc.typed_search_attributes.get(names.TENANT_KEY) != key.tenant
        ):
            # Another tenant's pipeline reads as absent: its existence is not ours to tell.
            raise ApiError(404, ErrorCode.NOT_FOUND, f"no pipeline {workflow_id!r} of this tenant")
        return desc

    async def status(self, workflow_id: str, key: ApiKey) -> dict[str, Any]:
        """Describe plus the ``progress`` query (null when the workflow does not answer),
        and ``waiting_for_worker`` (null unless no worker has picked up the run's
        workflow task for a few seconds: then the queue, the build it goes to and
        the pollers seen, :mod:`aiworker.workers.client.pollers`)."""
        desc = await self.owned(workflow_id, key)
        doc = _summary(desc)
        doc["waiting_for_worker"] = None
        try:
            waiting = await unserved(self.door.pipelines.temporal, desc)
        except RPCError as e:  # advice only: the status stands without it
            if e.status == RPCStatusCode.UNAVAILABLE:
                raise
            log.info("task queue of %s not described: %s", workflow_id, e.message)
            waiting = None
        if waiting is not None:
            doc["waiting_for_worker"] = waiting.as_json()
            # a query waits for the workflow task no worker takes: it would hold the
            # caller for its whole timeout and answer nothing
            doc["progress"] = None
            return doc
        # An ended run answers only when a worker replays it: do not hold the caller long.
        running = desc.status == WorkflowExecutionStatus.RUNNING
        try:
            doc["progress"] = await self.door.pipelines.get_handle(workflow_id).query(
                names.PROGRESS_QUERY, rpc_timeout=RPC_TIMEOUT if running else ENDED_QUERY_TIMEOUT
            )
        except (RPCError, RPCTimeoutOrCancelledError) as e:
            if isinstance(e, RPCError) and e.status == RPCStatusCode.UNAVAILABLE:
                raise
            doc["progress"] = None
        except Exception as e:  # a query the workflow refused (WorkflowQueryFailedError...)
            log.info("progress query of %s failed: %s", workflow_id, type(e).__name__)
            doc["progress"] = None
        return doc

    async def result(self, workflow_id: str, key: ApiKey, wait: float) -> JSONResponse:
        """The outcome (200), or the status (202) when it has not ended within ``wait`` s."""
        desc = await self.owned(workflow_id, key)
        outcome = self.door.pipelines.outcome(workflow_id, desc.run_id)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return JSONResponse(await outcome)
        try:
            return JSONResponse(await asyncio.wait_for(outcome, wait))
        except TimeoutError:
            return JSONResponse(await self.status(workflow_id, key), status_code=202)

    async def items(self, workflow_id: str, step: str, key: ApiKey) -> dict[str, Any]:
        """A for_each step's items, inline or by reference, once the pipeline has
        ended (409 before): ``{"workflow_id", "step", "count", "items"}``."""
        desc = await self.owned(workflow_id, key)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            raise ApiError(
                409,
                ErrorCode.INVALID_INPUT,
                f"pipeline {workflow_id!r} is still running; its items come when it ends",
            )
        try:
            # An ended run whose workflow failed answers a query only when a worker
            # replays it: do not hold the caller past a result's longest wait.
            items = await asyncio.wait_for(
                self.door.pipelines.items(workflow_id, step, run_id=desc.run_id, tenant=key.tenant),
                MAX_RESULT_WAIT_SECONDS,
            )
        except ItemsPartError as e:
            # The store's own message names its paths: the log has it, the caller the code.
            log.warning("items of %s step %s: %s", workflow_id, step, e)
            raise ApiError(
                500, e.code, f"step {step!r}: a stored part of its items cannot be read"
            ) from None
        except StepItemsError as e:
            status = 404 if e.code in (ErrorCode.NOT_FOUND, ErrorCode.ACCESS_DENIED) else 400
            raise ApiError(status, e.code, str(e)) from None
        except TimeoutError:
            raise ApiError(
                503, ErrorCode.TIMEOUT, f"pipeline {workflow_id!r} did not answer in time"
            ) from None
        return {"workflow_id": workflow_id, "step": step, "count": len(items), "items": items}

    async def review(self, workflow_id: str, key: ApiKey, body: bytes) -> dict[str, Any]:
        """Send the ``review`` Update; 409 when the pipeline refuses or has ended."""
        raw = parse_json(body, self.max_depth)
        try:
            req = ReviewRequest.model_validate(raw)
        except ValidationError as e:
            raise validation_error(e.errors(), raw, "body") from None
        desc = await self.owned(workflow_id, key)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            raise ApiError(
                409,
                ErrorCode.INVALID_INPUT,
                f"pipeline {workflow_id!r} has ended; nothing to review",
            )
        try:
            return await self.door.pipelines.send_review(
                workflow_id,
                req.decision,
                outputs=req.outputs,
                reviewer=reviewer_name(req.reviewer, key),
                note=req.note,
                step=req.step,
            )
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            message = getattr(cause, "message", None) or str(cause)
            raise ApiError(409, ErrorCode.INVALID_INPUT, f"review refused: {message}") from None

    async def redrive(self, workflow_id: str, key: ApiKey, body: bytes) -> JSONResponse:
        """``POST /v1/pipelines/{id}/redrive``: the run again as ``<first id>-redrive-<n>``
        (:meth:`PipelineClient.redrive_input`), for the key's tenant only; 201 with
        the new run, 400 for a bad ``from`` or ``input`` (nothing started), 409 when
        the run is running or succeeded without ``from``."""
        raw = parse_json(body, self.max_depth) if body.strip() else None
        if raw is None:  # no body, or JSON null: the defaults
            raw = {}
        try:
            req = RedriveRequest.model_validate(raw)
        except ValidationError as e:
            raise validation_error(e.errors(), raw, "body") from None
        desc = await self.owned(workflow_id, key)
        pipelines = self.door.pipelines
        try:
            # a failed workflow's steps come from a query a worker answers by replay:
            # do not hold the caller past a result's longest wait
            pipeline = await asyncio.wait_for(
                pipelines.redrive_input(
                    workflow_id,
                    key.tenant,
                    from_step=req.from_step,
                    inputs=req.input,
                    new_idempotency_keys=req.new_idempotency_keys,
                ),
                MAX_RESULT_WAIT_SECONDS,
            )
            handle = await pipelines.start_redrive(pipeline)
        except RedriveError as e:
            status = 409 if e.conflict else 400
            raise ApiError(status, ErrorCode.INVALID_INPUT, f"cannot redrive: {e}") from None
        except TimeoutError:
            raise ApiError(
                503, ErrorCode.TIMEOUT, f"pipeline {workflow_id!r} did not answer in time"
            ) from None
        log.info("redrove %s as %s for tenant %s", workflow_id, handle.id, key.tenant)
        doc = {
            "workflow_id": handle.id,
            "run_id": handle.result_run_id,
            "redriven_from": workflow_id,
            "redriven_run_id": desc.run_id,
            "pipeline": pipeline.get("name"),
            "tenant": key.tenant,
            "status": "queued",
        }
        return _started(doc, 201)

    async def callback(
        self, token: str, key: ApiKey, body: bytes, heartbeat: bool = False
    ) -> dict[str, Any]:
        """``POST /v1/callbacks/{token}[/heartbeat]``: the run's ``callback`` Update.

        The token leads to its run; a run of another tenant answers exactly as an
        unknown token (404). The body (capped like every body, nested at most the
        caps' JSON depth plus its own two levels) is ``{"outputs": {...}}`` or
        ``{"error": {"message": "..."}}``; a heartbeat's is empty or
        ``{"extend_seconds": N}``. The run checks outputs against the step's
        ``wait.schema`` (422 naming the field)."""
        try:
            workflow_id = run_of(token)
        except CallbackError as e:
            raise ApiError(e.status, e.code, e.message) from None
        raw: Any = {}
        if body.strip() or not heartbeat:
            raw = parse_json(body, self.door.settings.caps.max_json_depth + CALLBACK_LEVELS)
        if heartbeat and raw is None:  # JSON null, as no body: the step's own timeout
            raw = {}
        try:
            if heartbeat:
                beat = HeartbeatRequest.model_validate(raw)
                request = CallbackRequest(
                    token=token, action="heartbeat", extend_seconds=beat.extend_seconds
                )
            else:
                answer = CallbackBody.model_validate(raw)
                if (answer.outputs is None) == (answer.error is None):
                    raise ApiError(
                        422, ErrorCode.INVALID_INPUT, "give either outputs or error, not both"
                    )
                if answer.error is not None:
                    message = answer.error.message
                    request = CallbackRequest(token=token, action="fail", message=message)
                else:
                    outputs = answer.outputs
                    request = CallbackRequest(token=token, action="complete", outputs=outputs)
        except ValidationError as e:
            refused = validation_error(e.errors(), raw, "body")
            raise ApiError(422, refused.code, refused.message) from None
        try:
            try:
                await self.owned(workflow_id, key)
            except ApiError as e:
                if e.status == 404:  # another tenant's run reads as no run at all
                    raise CallbackError(404, UNKNOWN_TOKEN) from None
                raise
            return await send_callback(self.door.pipelines.temporal, request)
        except CallbackError as e:
            if e.field:
                raise ApiError(e.status, e.code, e.message, field=e.field) from None
            raise ApiError(e.status, e.code, e.message) from None

    async def hook(self, name: str, request: Request) -> JSONResponse:
        """Verify a webhook's signature and start its pipeline with the body as input.

        The run is named by the hash of the body, the part the signature covers:
        the delivery id and GitHub's event header are not signed, so a captured
        body sent again under a new ``X-GitHub-Delivery`` (or another
        ``X-GitHub-Event``) is the same delivery and answers 200 with the first
        run. The id is Temporal's (``REJECT_DUPLICATE``), so this holds across
        front door processes and restarts, as long as the namespace keeps the
        first run (its retention).

        A caller whose signatures fail is held to the front door's rate per hook
        and address (``AIWORKER_SERVE_RATE_LIMIT``): past it, 429 before its body
        is read or a digest computed.
        """
        ready = self.door.hooks.get(name)
        if ready is None:
            raise ApiError(404, ErrorCode.NOT_FOUND, f"no webhook named {name!r}")
        client = request.client.host if request.client else "unknown"
        refused = f"hook-refused:{name}:{client}"
        self.hold(refused)
        body = await read_body(request, self.door.settings.serve_max_body_bytes)
        try:
            if ready.hook.signature == "github":
                verify_github(ready.secret, body, request.headers.get("x-hub-signature-256"))
            else:
                header = request.headers.get("stripe-signature")
                verify_stripe(ready.secret, body, header, ready.hook.tolerance_seconds)
        except SignatureError as e:
            self.limit(refused, None)  # 429 once this caller has used up its failures
            raise ApiError(401, ErrorCode.ACCESS_DENIED, f"webhook {name!r}: {e}") from None
        # After the signature: forged deliveries must not use up the sender's rate.
        self.limit(f"hook:{name}", ready.hook.rate_limit)
        payload = parse_json(body, self.max_depth)
        header = ready.delivery_header
        body_hash = hashlib.sha256(body).hexdigest()
        delivery = request.headers.get(header) if header else None
        if delivery is not None and not 0 < len(delivery) <= MAX_IDEMPOTENCY_KEY_CHARS:
            raise ApiError(400, ErrorCode.INVALID_INPUT, f"{header} is empty or too long")
        delivery = delivery or body_hash
        pipeline = copy.deepcopy(ready.pipeline)
        pipeline["tenant"] = ready.hook.tenant
        inputs = dict(pipeline.get("inputs") or {})
        inputs.update(body=payload, delivery=delivery)
        if ready.hook.signature == "github" and (event := request.headers.get("x-github-event")):
            inputs["event"] = event
        pipeline["inputs"] = inputs
        # The signed part names the run, never the unsigned delivery header.
        workflow_id = idempotent_id(f"hook-{name}", ready.hook.tenant, body_hash)
        return await self.start_once(pipeline, workflow_id, f"delivery {delivery!r}", same_run=True)


def _started(doc: dict[str, Any], status: int) -> JSONResponse:
    location = pipeline_path(doc["workflow_id"])
    return JSONResponse(doc, status_code=status, headers={"Location": location})
