"""The HTTP front door (``aiworker serve``): start, watch and review pipelines over HTTP.

An ASGI app on FastAPI, served by uvicorn::

    POST /v1/pipelines                 start a pipeline (body: the spec; Idempotency-Key)
    GET  /v1/pipelines/{id}            status and progress (describe + the progress query)
    GET  /v1/pipelines/{id}/result     the outcome, waiting at most ?timeout= seconds
    GET  /v1/pipelines/{id}/steps/{step}/items  a for_each step's items (inline or by reference)
    POST /v1/pipelines/{id}/review     the review Update (approve | reject | retry)
    POST /v1/pipelines/{id}/redrive    run it again ({"from", "input", "new_idempotency_keys"})
    GET  /v1/pipelines/{id}/events     live events (server-sent events; frontdoor/events.py)
    GET  /v1/pipelines/{id}/live       a page that shows them
    POST /v1/callbacks/{token}         complete or fail a wait step's token (the callback Update)
    POST /v1/callbacks/{token}/heartbeat  extend a wait step's timeout
    POST /v1/hooks/{name}              a configured pipeline from a signed webhook
    GET  /healthz, /readyz, /openapi.json

No ``/docs`` or ``/redoc`` page: FastAPI's load Swagger UI and ReDoc from a CDN
without an integrity check, so the door serves no page that runs outside code;
``/openapi.json`` feeds any OpenAPI viewer the operator trusts.
Slow clients are cut off by :mod:`aiworker.workers.frontdoor.conn` (header and body
read deadlines, a connection ceiling).

Every call but the probes and the documents carries ``Authorization: Bearer
<key>``; the key decides the tenant (:mod:`aiworker.workers.frontdoor.auth`), so a
body naming another tenant is refused and another tenant's pipelines read as
not found. Webhooks are authenticated by their HMAC signature instead.

A request is checked on the same path as ``aiworker run``
(:meth:`PipelineClient.check_live <aiworker.workers.client.client.PipelineClient.check_live>`):
against the workers the live registry lists (so a plugin worker served by a
worker process passes, with its input checked, though the front door lacks
it), or this process's when the registry cannot be read; nothing starts
unless the spec is valid. ``Idempotency-Key`` (and a webhook's
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

import logging
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from temporalio.service import RPCError

from aiworker.activities.llm import ModelsFileError
from aiworker.config.settings import Settings
from aiworker.schemas.callbacks import CallbackBody
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.frontdoor.auth import (
    ApiKey,
    FrontDoorRateLimiter,
    KeyRing,
    ServeConfigError,
    load_hooks,
)
from aiworker.workers.frontdoor.events import StreamLimits, install_event_routes
from aiworker.workers.frontdoor.http import (
    RawWorkflowIds,
    WorkflowId,
    install_error_handlers,
    read_body,
    unavailable,
)
from aiworker.workers.frontdoor.openapi import conforming
from aiworker.workers.frontdoor.service import (
    MAX_RESULT_WAIT_SECONDS,
    FrontDoor,
    HeartbeatRequest,
    PipelineStatus,
    RedriveRequest,
    ReviewRequest,
    Service,
)
from aiworker.workers.process.pipeline_settings import model_aliases
from aiworker.workers.process.telemetry import Telemetry

log = logging.getLogger("aiworker.serve")

_bearer = HTTPBearer(auto_error=False, description="an API key (aiworker keys add)")


async def _caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    """The API key of a request (401 without a valid one), after its rate (429)."""
    service: Service = request.app.state.service
    return service.caller(credentials.credentials if credentials else None)


Caller = Annotated[ApiKey, Depends(_caller)]


SERVICE_NAME = "aiworker-serve"

# Probes answer every few seconds; a span each would drown the requests that matter.
_UNTRACED = "healthz,readyz,metrics"


def instrument_requests(app: FastAPI, telemetry: Telemetry) -> None:
    """A server span per request (``POST /v1/pipelines``, with the route, method and
    status code), by OpenTelemetry's own FastAPI instrumentation; the probes are
    left out."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=telemetry.tracer_provider,
        excluded_urls=_UNTRACED,
        exclude_spans=["receive", "send"],  # the request's span, not one per ASGI message
    )


def create_app(door: FrontDoor, stream_limits: StreamLimits | None = None) -> FastAPI:
    """The front door's ASGI app over ``door`` (served by :func:`serve`); its event
    streams bounded by ``stream_limits`` (:mod:`~aiworker.workers.frontdoor.events`;
    default: the door's settings)."""
    from importlib.metadata import version

    app = FastAPI(
        title="aiworker front door",
        version=version("aiworker"),
        description="Start, watch and review aiworker pipelines; start them from webhooks.",
        # FastAPI's pages pull Swagger UI / ReDoc from a CDN with no integrity check.
        docs_url=None,
        redoc_url=None,
    )
    service = Service(door)
    app.state.service = service
    app.state.temporal_target = door.pipelines.temporal.service_client.config.target_host
    install_error_handlers(app)
    app.add_middleware(RawWorkflowIds)
    errors: dict[int | str, dict[str, Any]] = {
        s: {"description": d}
        for s, d in (
            (400, "invalid_input"),
            (401, "access_denied"),
            (429, "rate_limited (Retry-After)"),
            (503, "upstream_error: Temporal did not answer (Retry-After)"),
        )
    }
    # every route that names a pipeline, a token or a hook: unknown (or another tenant's)
    errors_of_one = {**errors, 404: {"description": "not_found"}}
    too_large: dict[int | str, dict[str, Any]] = {
        413: {"description": "payload_too_large: the body is over the cap"}
    }

    json_body = {"requestBody": {"required": True, "content": {"application/json": {}}}}
    # a pipeline (docs/pipelines.md), checked whole by the pipeline check (400)
    pipeline_body = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    }

    @app.post(
        "/v1/pipelines",
        status_code=201,
        responses={
            200: {"description": "a retry of a start: the first run"},
            422: {
                "description": "quote_not_accepted: the cost quote is above the tenant's "
                "quote_accept_above_usd (send accept_quote: true)"
            },
            403: {"description": "access_denied: the body names another tenant"},
            409: {
                "description": "invalid_input: another body under this Idempotency-Key; "
                "flow_refused: a singleton flow's key is held"
            },
            **errors,
            **too_large,
        },
        openapi_extra=pipeline_body,
        summary="Start a pipeline (the body is the pipeline spec, plus accept_quote)",
    )
    async def start_pipeline(request: Request, key: Caller) -> JSONResponse:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.start(body, key, request.headers.get("idempotency-key"))

    status_doc = {"description": "the status", "model": PipelineStatus}

    @app.get(
        "/v1/pipelines/{workflow_id}",
        response_model=None,
        responses={200: status_doc, **errors_of_one},
        summary="Status and progress (and which worker a run that has not moved waits for)",
    )
    async def get_pipeline(workflow_id: WorkflowId, key: Caller) -> dict[str, Any]:
        return await service.status(workflow_id, key)

    @app.get(
        "/v1/pipelines/{workflow_id}/result",
        responses={
            202: {"description": "still running: the status", "model": PipelineStatus},
            **errors_of_one,
        },
        summary="The outcome, waiting at most `timeout` seconds",
    )
    async def get_result(
        workflow_id: WorkflowId,
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

    @app.get(
        "/v1/pipelines/{workflow_id}/steps/{step}/items",
        responses={
            409: {"description": "still running"},
            500: {"description": "a stored part is missing or damaged"},
            **errors_of_one,
        },
        summary="A for_each step's items (inline or by reference), once the pipeline ended",
    )
    async def get_items(workflow_id: WorkflowId, step: str, key: Caller) -> dict[str, Any]:
        return await service.items(workflow_id, step, key)

    @app.post(
        "/v1/pipelines/{workflow_id}/review",
        responses={
            409: {"description": "refused, or nothing awaits review"},
            **errors_of_one,
            **too_large,
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ReviewRequest.model_json_schema()}},
            }
        },
        summary="Decide on a step awaiting review",
    )
    async def review(workflow_id: WorkflowId, request: Request, key: Caller) -> dict[str, Any]:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.review(workflow_id, key, body)

    @app.post(
        "/v1/pipelines/{workflow_id}/redrive",
        status_code=201,
        responses={
            409: {"description": "still running, or succeeded and no `from` given"},
            **errors_of_one,
            **too_large,
        },
        openapi_extra={
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {"schema": RedriveRequest.model_json_schema(by_alias=True)}
                },
            }
        },
        summary="Run a pipeline again, from a chosen step (with a corrected input) or "
        "its failed steps",
    )
    async def redrive(workflow_id: WorkflowId, request: Request, key: Caller) -> JSONResponse:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.redrive(workflow_id, key, body)

    callback_errors = {
        404: {"description": "unknown token (or another tenant's)"},
        409: {"description": "answered before with another answer"},
        410: {"description": "the wait timed out or ended"},
        413: {"description": "payload_too_large"},
        422: {"description": "the body fails the step's wait.schema (names the field)"},
        **errors_of_one,
    }

    @app.post(
        "/v1/callbacks/{token}",
        responses=callback_errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": CallbackBody.model_json_schema()}},
            }
        },
        summary="Complete or fail a wait step's token",
    )
    async def callback(token: str, request: Request, key: Caller) -> dict[str, Any]:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.callback(token, key, body)

    @app.post(
        "/v1/callbacks/{token}/heartbeat",
        responses=callback_errors,
        openapi_extra={
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": HeartbeatRequest.model_json_schema()}},
            }
        },
        summary="Extend a wait step's timeout (body empty or {extend_seconds})",
    )
    async def callback_heartbeat(token: str, request: Request, key: Caller) -> dict[str, Any]:
        body = await read_body(request, door.settings.serve_max_body_bytes)
        return await service.callback(token, key, body, heartbeat=True)

    @app.post(
        "/v1/hooks/{name}",
        status_code=201,
        responses={
            200: {"description": "a redelivery: the first run"},
            409: {"description": "flow_refused: a singleton flow's key is held"},
            **errors_of_one,
            **too_large,
        },
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
            # Anyone may ask: the answer names no internal address (the log has it).
            log.warning("readyz: Temporal at %s did not answer", app.state.temporal_target)
            raise unavailable()
        return {"status": "ready"}

    install_event_routes(app, service, stream_limits or StreamLimits.of(door.settings))
    document = app.openapi

    def openapi() -> dict[str, Any]:
        # FastAPI's document, once, as the server answers (frontdoor/openapi.py)
        if not getattr(app.state, "openapi_ready", False):
            app.openapi_schema = conforming(document())
            app.state.openapi_ready = True
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def serve(
    settings: Settings,
    *,
    address: str | None = None,
    profile: str | None = None,
    env: Mapping[str, str],
    on_listening: Callable[[str, int], None] | None = None,
    without_api_keys: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> None:
    """Run the front door until SIGTERM or SIGINT (uvicorn's graceful shutdown).

    The keys and hooks files are read first, so a typo stops the process
    before it listens. The Temporal client connects lazily: the door starts
    (and ``/readyz`` says 503) while Temporal is not there yet.

    A door without a single API key would answer every pipeline request 401
    (a valid-looking key included), which reads like a wrong key rather than a
    missing file: it does not start unless ``without_api_keys`` says that is
    the plan (a door for webhooks and callbacks only), and then it says so
    through ``on_warning`` and the log before it listens.

    Raises:
        ServeConfigError: the keys or hooks file is unusable, or there is no
            API key and ``without_api_keys`` is not set.
    """
    import uvicorn

    from aiworker.workers.frontdoor.conn import deadline_protocol

    keys = KeyRing.load(settings.api_keys_file)
    hooks = load_hooks(settings.hooks_file, env)
    if not keys.keys:
        missing = (
            "AIWORKER_API_KEYS_FILE is not set"
            if settings.api_keys_file is None
            else f"the API keys file {settings.api_keys_file} (AIWORKER_API_KEYS_FILE) holds no key"
        )
        if not without_api_keys:
            raise ServeConfigError(
                f"no API keys: {missing}, so every /v1/pipelines request would be refused "
                "(401). Create one with `aiworker keys add NAME --tenant TENANT --file "
                "keys.json` and set AIWORKER_API_KEYS_FILE=keys.json; a front door for "
                "webhooks and callbacks only starts with --without-api-keys"
            )
        warning = (
            f"no API keys ({missing}; --without-api-keys): every /v1/pipelines request "
            "is refused with 401; only webhooks (/v1/hooks) and callbacks (/v1/callbacks) "
            "are served"
        )
        log.warning("%s", warning)
        if on_warning is not None:
            on_warning(warning)
    try:
        # every start checks model aliases against this file: a broken one would
        # answer each request 500, so it stops the door before it listens
        model_aliases(settings)
    except ModelsFileError as e:
        raise ServeConfigError(str(e)) from None
    if settings.tenants is not None:
        # A key or hook for a tenant the registry lacks could never start anything.
        named = {k.tenant for k in keys.keys} | {h.hook.tenant for h in hooks.values()}
        unknown = sorted(named - set(settings.tenants.tenants))
        if unknown:
            raise ServeConfigError(
                f"API keys or hooks name tenants that AIWORKER_TENANTS_FILE lacks: "
                f"{', '.join(unknown)}"
            )
    # Traces, metrics and log records over OTLP by the standard OTEL_* variables,
    # as the worker's: a span per request (service.name aiworker-serve) whose
    # trace the SDK's tracing interceptor carries into the pipelines it starts.
    telemetry = Telemetry(environ=env, sdk_metrics=False, service_name=SERVICE_NAME)
    pipelines = await PipelineClient.connect(
        profile, target_host=address, settings=settings, lazy=True, telemetry=telemetry
    )
    door = FrontDoor(
        pipelines, keys, hooks, settings, FrontDoorRateLimiter(settings.serve_rate_limit)
    )
    app = create_app(door)
    instrument_requests(app, telemetry)
    host = settings.serve_host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Bound here, not by uvicorn, so that port 0 works and the real port is known.
    sock = socket.create_server((host, settings.serve_port), family=family)
    config = uvicorn.Config(
        app,
        log_config=None,  # the process's JSON logs
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
        lifespan="off",
        http=deadline_protocol(
            settings.serve_header_timeout_seconds,
            settings.serve_body_timeout_seconds,
            settings.serve_max_connections,
        ),
        # Requests in flight, counting those whose client has left (a task may
        # outlive its connection): beyond, uvicorn answers 503. The connections
        # themselves never pass the ceiling (frontdoor/conn.py), so +1.
        limit_concurrency=settings.serve_max_connections + 1,
    )
    if on_listening is not None:
        on_listening(host, sock.getsockname()[1])
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        telemetry.shutdown()  # spans and log records still waiting go out
