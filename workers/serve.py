"""The HTTP front door (``aiworker serve``): start, watch and review pipelines over HTTP.

An ASGI app on FastAPI, served by uvicorn::

    POST /v1/pipelines                 start a pipeline (body: the spec; Idempotency-Key)
    GET  /v1/pipelines/{id}            status and progress (describe + the progress query)
    GET  /v1/pipelines/{id}/result     the outcome, waiting at most ?timeout= seconds
    POST /v1/pipelines/{id}/review     the review Update (approve | reject | retry)
    POST /v1/hooks/{name}              a configured pipeline from a signed webhook
    GET  /healthz, /readyz, /openapi.json, /docs

Every call but the probes and the documents carries ``Authorization: Bearer
<key>``; the key decides the tenant (:mod:`aiworker.workers.serve_auth`), so a
body naming another tenant is refused and another tenant's pipelines read as
not found. Webhooks are authenticated by their HMAC signature instead.

A request is checked on the same path as ``aiworker run``
(:meth:`PipelineClient.check <aiworker.workers.client.PipelineClient.check>`):
nothing starts unless the spec is valid. ``Idempotency-Key`` (and a webhook's
delivery id) names the workflow: the id is derived from the tenant and the key,
the start refuses a duplicate id, and a retry with the same body answers 200
with the first run's id instead of 201; another body under the same key is 409.

Every refusal is ``{"error": {"code", "message"}}`` with a stable code of
:mod:`aiworker.schemas.errors`: 400 ``invalid_input``, 401/403
``access_denied``, 404 ``not_found``, 409 ``invalid_input``, 413
``payload_too_large``, 429 ``rate_limited`` (with ``Retry-After``), 503
``upstream_error`` (Temporal did not answer), 500 ``internal``.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import math
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
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

from aiworker.schemas import names
from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.messages import type_name
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.schemas.settings import Settings
from aiworker.workers.client import PipelineClient
from aiworker.workers.serve_auth import (
    ApiKey,
    KeyRing,
    RateLimiter,
    ReadyHook,
    SignatureError,
    load_hooks,
    verify_github,
    verify_stripe,
)
from aiworker.workers.serve_http import (
    ApiError,
    canonical,
    install_error_handlers,
    parse_json,
    read_body,
    unavailable,
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


@dataclass
class FrontDoor:
    """What the app serves from: Temporal, the keys, the hooks, the rates, the settings."""

    pipelines: PipelineClient
    keys: KeyRing
    hooks: dict[str, ReadyHook]
    settings: Settings
    limiter: RateLimiter


class ReviewRequest(BaseModel):
    """The body of ``POST /v1/pipelines/{id}/review`` (as ``aiworker review`` takes it)."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject", "retry"]
    outputs: dict[str, Any] | None = Field(default=None, description="corrected outputs (approve)")
    reviewer: str | None = Field(default=None, max_length=200, description="default: the key")
    note: str | None = Field(default=None, max_length=10_000)
    step: str | None = Field(default=None, description="the step, when several await review")


def idempotent_id(prefix: str, tenant: str, key: str) -> str:
    """The workflow id a tenant's idempotency key (or a hook's delivery) maps to.

    Hashed, so that any key is a safe id and two tenants' equal keys never meet.
    """
    digest = hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()[:32]
    return f"{prefix}-{tenant}-{digest}"


def _spec_error(e: PipelineSpecError) -> ApiError:
    problems = [p.to_json() for p in e.details]
    return ApiError(400, ErrorCode.INVALID_INPUT, str(e), problems=problems)


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

    def limit(self, bucket: str, rate: str | None) -> None:
        """Take a token from ``bucket``'s rate; 429 with Retry-After when none is left."""
        wait = self.door.limiter.take(bucket, rate)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise ApiError(
                429,
                ErrorCode.RATE_LIMITED,
                f"rate limit of {rate or self.door.settings.serve_rate_limit} reached; "
                f"retry in {seconds}s",
                headers={"Retry-After": str(seconds)},
            )

    async def start_once(
        self, pipeline: dict[str, Any], workflow_id: str | None, what: str
    ) -> JSONResponse:
        """Check and start ``pipeline``; 201, or 200 for a retry of the same start."""
        pipelines = self.door.pipelines
        try:
            pipelines.check(pipeline)
        except PipelineSpecError as e:
            raise _spec_error(e) from None
        try:
            handle = await pipelines.start(
                pipeline,
                workflow_id=workflow_id,
                check=False,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError as e:
            workflow_id = e.workflow_id
            first = await pipelines.started_input(workflow_id)
            if first is None or canonical(first) != canonical(pipeline):
                raise ApiError(
                    409,
                    ErrorCode.INVALID_INPUT,
                    f"{what} started workflow {workflow_id} with another body; "
                    "use a new key for a new pipeline",
                    workflow_id=workflow_id,
                ) from None
            desc = await pipelines.get_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
            return _started(_summary(desc), 200)
        doc = {
            "workflow_id": handle.id,
            "run_id": handle.result_run_id,
            "pipeline": pipeline.get("name"),
            "tenant": pipeline.get("tenant"),
            "status": "queued",
        }
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
        """Describe plus the ``progress`` query (null when the workflow does not answer)."""
        desc = await self.owned(workflow_id, key)
        doc = _summary(desc)
        try:
            doc["progress"] = await self.door.pipelines.get_handle(workflow_id).query(
                names.PROGRESS_QUERY, rpc_timeout=RPC_TIMEOUT
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
                reviewer=req.reviewer or f"api-key:{key.name}",
                note=req.note,
                step=req.step,
            )
        except WorkflowUpdateFailedError as e:
            cause = e.cause
            message = getattr(cause, "message", None) or str(cause)
            raise ApiError(409, ErrorCode.INVALID_INPUT, f"review refused: {message}") from None

    async def hook(self, name: str, request: Request) -> JSONResponse:
        """Verify a webhook's signature and start its pipeline with the body as input."""
        ready = self.door.hooks.get(name)
        if ready is None:
            raise ApiError(404, ErrorCode.NOT_FOUND, f"no webhook named {name!r}")
        self.limit(f"hook:{name}", ready.hook.rate_limit)
        body = await read_body(request, self.door.settings.serve_max_body_bytes)
        try:
            if ready.hook.signature == "github":
                verify_github(ready.secret, body, request.headers.get("x-hub-signature-256"))
            else:
                header = request.headers.get("stripe-signature")
                verify_stripe(ready.secret, body, header, ready.hook.tolerance_seconds)
        except SignatureError as e:
            raise ApiError(401, ErrorCode.ACCESS_DENIED, f"webhook {name!r}: {e}") from None
        payload = parse_json(body, self.max_depth)
        header = ready.delivery_header
        delivery = request.headers.get(header) if header else None
        if delivery is not None and not 0 < len(delivery) <= MAX_IDEMPOTENCY_KEY_CHARS:
            raise ApiError(400, ErrorCode.INVALID_INPUT, f"{header} is empty or too long")
        delivery = delivery or hashlib.sha256(body).hexdigest()
        pipeline = copy.deepcopy(ready.pipeline)
        pipeline["tenant"] = ready.hook.tenant
        inputs = dict(pipeline.get("inputs") or {})
        inputs.update(body=payload, delivery=delivery)
        if ready.hook.signature == "github" and (event := request.headers.get("x-github-event")):
            inputs["event"] = event
        pipeline["inputs"] = inputs
        workflow_id = idempotent_id(f"hook-{name}", ready.hook.tenant, delivery)
        return await self.start_once(pipeline, workflow_id, f"delivery {delivery!r}")


def _started(doc: dict[str, Any], status: int) -> JSONResponse:
    location = f"/v1/pipelines/{doc['workflow_id']}"
    return JSONResponse(doc, status_code=status, headers={"Location": location})


_bearer = HTTPBearer(auto_error=False, description="an API key (aiworker keys add)")


def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    """The API key of a request (401 without a valid one), after its rate (429)."""
    service: Service = request.app.state.service
    key = service.door.keys.find(credentials.credentials) if credentials else None
    if key is None:
        raise ApiError(
            401,
            ErrorCode.ACCESS_DENIED,
            "a valid API key is required (Authorization: Bearer <key>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    service.limit(f"key:{key.name}", key.rate_limit)
    return key


Caller = Annotated[ApiKey, Depends(_caller)]


def create_app(door: FrontDoor) -> FastAPI:
    """The front door's ASGI app over ``door`` (served by :func:`serve`)."""
    from importlib.metadata import version

    app = FastAPI(
        title="aiworker front door",
        version=version("aiworker"),
        description="Start, watch and review aiworker pipelines; start them from webhooks.",
    )
    service = Service(door)
    app.state.service = service
    app.state.temporal_target = door.pipelines.temporal.service_client.config.target_host
    install_error_handlers(app)
    errors: dict[int | str, dict[str, Any]] = {
        s: {"description": d}
        for s, d in ((400, "invalid_input"), (401, "access_denied"), (429, "rate_limited"))
    }

    json_body = {"requestBody": {"required": True, "content": {"application/json": {}}}}

    @app.post(
        "/v1/pipelines",
        status_code=201,
        responses={200: {"description": "a retry of a start: the first run"}, **errors},
        openapi_extra=json_body,
        summary="Start a pipeline (the body is the pipeline spec)",
    )
    async def start_pipeline(request: Request, key: Caller) -> JSONResponse:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        raw = parse_json(body, service.max_depth)
        if not isinstance(raw, dict):
            raise ApiError(
                400, ErrorCode.INVALID_INPUT, f"the body is {type_name(raw)}, not a pipeline object"
            )
        tenant = raw.get("tenant")
        if tenant is not None and tenant != key.tenant:
            raise ApiError(
                403,
                ErrorCode.ACCESS_DENIED,
                f"this API key acts for tenant {canonical(key.tenant)}; "
                f"the body names {canonical(tenant)}",
            )
        raw["tenant"] = key.tenant
        idem = request.headers.get("idempotency-key")
        workflow_id = None
        if idem is not None:
            if not 0 < len(idem) <= MAX_IDEMPOTENCY_KEY_CHARS:
                raise ApiError(
                    400,
                    ErrorCode.INVALID_INPUT,
                    f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters",
                )
            workflow_id = idempotent_id("api", key.tenant, idem)
        return await service.start_once(raw, workflow_id, "this Idempotency-Key")

    @app.get("/v1/pipelines/{workflow_id}", responses=errors, summary="Status and progress")
    async def get_pipeline(workflow_id: str, key: Caller) -> dict[str, Any]:
        return await service.status(workflow_id, key)

    @app.get(
        "/v1/pipelines/{workflow_id}/result",
        responses={202: {"description": "still running: the status"}, **errors},
        summary="The outcome, waiting at most `timeout` seconds",
    )
    async def get_result(
        workflow_id: str,
        key: Caller,
        wait: Annotated[
            float,
            Query(
                alias="timeout",
                ge=0,
                le=MAX_RESULT_WAIT_SECONDS,
                description="seconds to wait for the end (202 with the status after it)",
            ),
        ] = 30.0,
    ) -> JSONResponse:
        return await service.result(workflow_id, key, wait)

    @app.post(
        "/v1/pipelines/{workflow_id}/review",
        responses={409: {"description": "refused, or nothing awaits review"}, **errors},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ReviewRequest.model_json_schema()}},
            }
        },
        summary="Decide on a step awaiting review",
    )
    async def review(workflow_id: str, request: Request, key: Caller) -> dict[str, Any]:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.review(workflow_id, key, body)

    @app.post(
        "/v1/hooks/{name}",
        status_code=201,
        responses={200: {"description": "a redelivery: the first run"}, **errors},
        openapi_extra=json_body,
        summary="Start a hook's pipeline from a signed webhook",
    )
    async def webhook(name: str, request: Request) -> JSONResponse:
        return await service.hook(name, request)

    @app.get("/healthz", summary="Alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Temporal does not answer"}})
    async def readyz() -> dict[str, str]:
        service_client = door.pipelines.temporal.service_client
        try:
            ok = await service_client.check_health(timeout=timedelta(seconds=3))
        except (RPCError, RuntimeError):
            ok = False
        if not ok:
            raise unavailable(app.state.temporal_target)
        return {"status": "ready"}

    return app


async def serve(
    settings: Settings,
    *,
    address: str | None = None,
    profile: str | None = None,
    env: Mapping[str, str],
    on_listening: Callable[[str, int], None] | None = None,
) -> None:
    """Run the front door until SIGTERM or SIGINT (uvicorn's graceful shutdown).

    The keys and hooks files are read first, so a typo stops the process
    before it listens. The Temporal client connects lazily: the door starts
    (and ``/readyz`` says 503) while Temporal is not there yet.

    Raises:
        ServeConfigError: the keys or hooks file is unusable.
    """
    import uvicorn

    keys = KeyRing.load(settings.api_keys_file)
    hooks = load_hooks(settings.hooks_file, env)
    pipelines = await PipelineClient.connect(
        profile, target_host=address, settings=settings, lazy=True
    )
    door = FrontDoor(pipelines, keys, hooks, settings, RateLimiter(settings.serve_rate_limit))
    host = settings.serve_host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Bound here, not by uvicorn, so that port 0 works and the real port is known.
    sock = socket.create_server((host, settings.serve_port), family=family)
    config = uvicorn.Config(
        create_app(door),
        log_config=None,  # the process's JSON logs
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
        lifespan="off",
    )
    if on_listening is not None:
        on_listening(host, sock.getsockname()[1])
    await uvicorn.Server(config).serve(sockets=[sock])
