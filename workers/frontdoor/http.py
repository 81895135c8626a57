"""The front door's HTTP plumbing: refusals as ``{"error": {"code", "message"}}``,
capped body reads, bounded JSON, and the map from what Temporal raises to a status.

Every refusal is an :class:`ApiError` with a stable code of
:mod:`aiworker.schemas.errors`; :func:`install_error_handlers` turns it, and
whatever else a route lets escape, into that body, never a Python repr:
FastAPI's own refusals (a bad query parameter, an unknown route) are
``invalid_input`` / ``not_found``; Temporal not answering (a lazy client's
failed connect, ``UNAVAILABLE``, a timeout) is 503 ``upstream_error`` with
``Retry-After``; anything else is 500 ``internal``, logged with its traceback.

**Workflow ids in paths.** A flow run's id holds ``/`` (``flow/acme/<pipeline>/<key>``),
so a ``{workflow_id}`` is one percent-encoded path segment (``flow%2Facme%2F...``)
and every ``Location`` header is built that way (:func:`pipeline_path`). The ASGI
server decodes ``%2F`` before routing, which would split the id into segments;
:class:`RawWorkflowIds` hands the router the id's segment as it was sent, and
:data:`WorkflowId` decodes it once for the route. Not Starlette's ``{id:path}``
converter: with it ``GET /v1/pipelines/<id>/review`` reads as the status of an id
ending in ``/review`` (a 404 where a 405 belongs), and a flow key named
``result`` or ``events`` would route to another operation.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import quote, unquote

from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas.errors import ErrorCode
from aiworker.schemas.messages import json_path, pydantic_issues
from aiworker.schemas.refs import json_depth
from aiworker.workers.client.temporal_client import TemporalUnreachableError

log = logging.getLogger("aiworker.serve")

RETRY_AFTER_UNAVAILABLE = "5"
PIPELINES_PREFIX = "/v1/pipelines/"


def pipeline_path(workflow_id: str) -> str:
    """The path of a pipeline's status: its id as one percent-encoded segment."""
    return PIPELINES_PREFIX + quote(workflow_id, safe="")


class RawWorkflowIds:
    """ASGI middleware: under ``/v1/pipelines/``, the router sees the id's segment as
    the client sent it (``%2F`` kept), the rest of the path decoded as usual."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and scope["path"].startswith(PIPELINES_PREFIX) and not scope.get("root_path"):
            text = raw.decode("latin-1").split("?", 1)[0]
            if text.startswith(PIPELINES_PREFIX):
                segment, slash, rest = text[len(PIPELINES_PREFIX) :].partition("/")
                scope = {**scope, "path": PIPELINES_PREFIX + segment + slash + unquote(rest)}
        await self.app(scope, receive, send)


def _workflow_id(
    workflow_id: Annotated[
        str,
        Path(description="the workflow id, percent-encoded (a flow run's holds `/`: `%2F`)"),
    ],
) -> str:
    return unquote(workflow_id)


WorkflowId = Annotated[str, Depends(_workflow_id)]
"""A route's ``{workflow_id}``, decoded once (:class:`RawWorkflowIds` kept it encoded)."""


class ApiError(Exception):
    """A refusal: its HTTP status, stable code and message (and extra fields)."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})
        self.extra = extra

    @classmethod
    def rate_limited(cls, message: str, wait_seconds: float) -> ApiError:
        """``429 rate_limited`` with ``Retry-After`` (whole seconds, at least 1),
        the message ending ``retry in Ns``."""
        seconds = max(1, math.ceil(wait_seconds))
        return cls(
            429,
            ErrorCode.RATE_LIMITED,
            f"{message}; retry in {seconds}s",
            headers={"Retry-After": str(seconds)},
        )

    def response(self) -> JSONResponse:
        """The ``{"error": {"code", "message", ...}}`` response."""
        body = {"error": {"code": self.code.value, "message": self.message, **self.extra}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def canonical(doc: Any) -> str:
    """``doc`` as one canonical JSON text (sorted keys, no spaces), for comparing bodies."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


async def read_body(request: Request, cap: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``cap`` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > cap:
        raise _too_large(cap)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise _too_large(cap)
            chunks.append(chunk)
    except ClientDisconnect:
        # The client left, or its body missed the read deadline (frontdoor/conn.py closed
        # the connection): nobody hears this answer, but the route ends cleanly.
        raise ApiError(408, ErrorCode.TIMEOUT, "the body did not arrive") from None
    return b"".join(chunks)


def _too_large(cap: int) -> ApiError:
    return ApiError(
        413, ErrorCode.PAYLOAD_TOO_LARGE, f"the body is larger than {cap} bytes (the cap)"
    )


def parse_json(body: bytes, max_depth: int) -> Any:
    """The body as JSON, nested at most ``max_depth`` levels; 400 otherwise."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, ErrorCode.INVALID_INPUT, f"the body is not valid JSON: {e}") from None
    except RecursionError:  # the decoder recurses once per level
        raise _too_deep(max_depth) from None
    try:
        json_depth(value, max_depth)
    except ValueError:
        raise _too_deep(max_depth) from None
    return value


def _too_deep(limit: int) -> ApiError:
    return ApiError(400, ErrorCode.INVALID_INPUT, f"the body nests deeper than {limit} levels")


def validation_error(errors: Sequence[Mapping[str, Any]], raw: Any, root: str) -> ApiError:
    """pydantic's (or FastAPI's) refusal of ``raw`` as one message in JSON terms,
    each problem as ``<root> <JSON path>: <what>``."""
    lines = [f"{root} {json_path(i.path)}: {i.text}" for i in pydantic_issues(errors, raw)]
    return ApiError(400, ErrorCode.INVALID_INPUT, "; ".join(lines) or f"invalid {root}")


def unavailable() -> ApiError:
    """503: Temporal did not answer. Its address and the SDK's detail go to the log
    only: a caller (``/readyz`` is open to anyone) learns nothing of the inside."""
    return ApiError(
        503,
        ErrorCode.UPSTREAM_ERROR,
        "Temporal did not answer; retry later",
        headers={"Retry-After": RETRY_AFTER_UNAVAILABLE},
    )


def _target(request: Request) -> str:
    target: str = request.app.state.temporal_target
    return target


def install_error_handlers(app: FastAPI) -> None:
    """Answer every refusal and failure of ``app`` as ``{"error": {"code", "message"}}``."""

    async def api_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, ApiError)
        return e.response()

    async def http_error(request: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, StarletteHTTPException)
        if e.status_code == 404:
            return ApiError(404, ErrorCode.NOT_FOUND, f"no route {request.url.path}").response()
        if e.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            # the router names the methods the path has (RFC 9110 §15.5.6 asks for Allow)
            allow = {k: v for k, v in (e.headers or {}).items() if k.lower() == "allow"}
            return ApiError(405, ErrorCode.INVALID_INPUT, message, headers=allow).response()
        return ApiError(e.status_code, ErrorCode.INVALID_INPUT, str(e.detail)).response()

    async def request_error(request: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RequestValidationError)
        # FastAPI's refusals of path and query parameters: loc is ("query", name).
        errors = [{**err, "loc": tuple(err["loc"])[1:]} for err in e.errors()]
        return validation_error(errors, dict(request.query_params), "query").response()

    async def rpc_error(request: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RPCError)
        if e.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            log.warning("Temporal at %s did not answer: %s", _target(request), e.message)
            return unavailable().response()
        if e.status == RPCStatusCode.NOT_FOUND:
            return ApiError(404, ErrorCode.NOT_FOUND, e.message).response()
        log.warning("Temporal refused a request: %s %s", e.status.name, e.message)
        return ApiError(
            502, ErrorCode.UPSTREAM_ERROR, f"Temporal answered {e.status.name}"
        ).response()

    async def unreachable(request: Request, e: Exception) -> JSONResponse:
        # The SDK reports a lazy client's failed connect as a bare RuntimeError.
        if isinstance(e, TemporalUnreachableError | RPCTimeoutOrCancelledError) or (
            "client connect" in str(e)
        ):
            first_line = str(e).splitlines()[0][:500]
            log.warning("Temporal at %s did not answer: %s", _target(request), first_line)
            return unavailable().response()
        log.exception("unexpected error")
        return ApiError(500, ErrorCode.INTERNAL, "unexpected error; see the server log").response()

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, request_error)
    app.add_exception_handler(RPCError, rpc_error)
    app.add_exception_handler(RuntimeError, unreachable)
    app.add_exception_handler(ConnectionError, unreachable)
    app.add_exception_handler(RPCTimeoutOrCancelledError, unreachable)
