"""Answering a wait step's token from outside: complete, fail, heartbeat.

The token names its run (:func:`~aiworker.schemas.callbacks.parse_token`); the
answer is the run's ``callback`` Workflow Update, so the caller hears at once
whether it was taken. What the run refused comes back as a
:class:`CallbackError` with the HTTP status the front door answers and a stable
error code:

    404 not_found       not a token, no such run, or (front door) another tenant's
    410 not_found       the wait timed out or ended without an answer
    409 invalid_input   answered before with another answer
    422 invalid_input   the body fails the step's wait.schema (the message names the field)
    429 rate_limited    the run's heartbeats are spent

The same answer twice returns the first reply (``repeat: true``), also after
the run ended: an ended run takes no Update, so its ``callback`` query says what
became of the token.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from aiworker.schemas import names
from aiworker.schemas.callbacks import CallbackRequest, Refusal, parse_token
from aiworker.schemas.errors import ErrorCode

# A callback is one Update the run answers in its next workflow task.
RPC_TIMEOUT = timedelta(seconds=30)
QUERY_TIMEOUT = timedelta(seconds=5)
UNKNOWN = "unknown callback token"

_CODES = {
    404: ErrorCode.NOT_FOUND,
    410: ErrorCode.NOT_FOUND,
    409: ErrorCode.INVALID_INPUT,
    422: ErrorCode.INVALID_INPUT,
    429: ErrorCode.RATE_LIMITED,
}


class CallbackError(Exception):
    """A callback the run (or the token) refused.

    Attributes:
        status: the HTTP status the front door answers (404, 409, 410, 422, 429).
        code: the stable error code.
        field: the body's field a schema refusal names, if any.
    """

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
        self.code = _CODES.get(status, ErrorCode.INVALID_INPUT)


def run_of(token: str) -> str:
    """The workflow id a token leads to; :class:`CallbackError` 404 if it is not a token."""
    try:
        return parse_token(token)[0]
    except ValueError:
        raise CallbackError(404, UNKNOWN) from None


async def send_callback(client: Client, request: CallbackRequest) -> dict[str, Any]:
    """Send ``request`` to the run its token names; the run's reply.

    Returns:
        ``{"step", "item"?, "status"}`` (``completed``, ``failed``, or ``waiting``
        with ``timeout_at`` after a heartbeat), with ``"repeat": true`` when this
        was the same answer again.

    Raises:
        CallbackError: refused (see the module).
    """
    handle = client.get_workflow_handle(run_of(request.token))
    arg = request.model_dump(mode="json", exclude_none=True)
    try:
        reply: dict[str, Any] = await handle.execute_update(
            names.CALLBACK_UPDATE, arg, result_type=dict, rpc_timeout=RPC_TIMEOUT
        )
    except WorkflowUpdateFailedError as e:
        return _refused(e.cause)
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return await _after_the_run(client, request)
    return reply


def _refused(cause: BaseException | None) -> dict[str, Any]:
    if not isinstance(cause, ApplicationError):
        raise CallbackError(404, UNKNOWN) from None
    try:
        kind = Refusal(cause.type or "")
    except ValueError:  # not a pipeline's refusal (another workflow type): no such token
        raise CallbackError(404, UNKNOWN) from None
    if kind is Refusal.REPEAT:
        first = cause.details[0] if cause.details else {}
        return {**(first if isinstance(first, dict) else {}), "repeat": True}
    detail = cause.details[0] if cause.details else None
    field = detail.get("field") if isinstance(detail, dict) else None
    raise CallbackError(kind.http_status, cause.message, field)


async def _after_the_run(client: Client, request: CallbackRequest) -> dict[str, Any]:
    """The run has ended (or never was): what its ``callback`` query says of the token."""
    handle = client.get_workflow_handle(run_of(request.token))
    try:
        state: dict[str, Any] = await handle.query(
            names.CALLBACK_QUERY, request.token, result_type=dict, rpc_timeout=QUERY_TIMEOUT
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise CallbackError(404, UNKNOWN) from None
        raise CallbackError(410, "the run has ended; the token takes no answer") from None
    except Exception:  # a run that does not answer the query (another type, no worker)
        raise CallbackError(410, "the run has ended; the token takes no answer") from None
    if not state.get("known"):
        raise CallbackError(404, UNKNOWN)
    answer = state.get("answer")
    if answer is not None and request.action != "heartbeat" and answer == request.answer():
        return {**(state.get("reply") or {}), "repeat": True}
    if answer is not None:
        other = "nothing to extend" if request.action == "heartbeat" else "with another answer"
        raise CallbackError(409, f"the token was already {state.get('state')}, {other}")
    raise CallbackError(410, "the run has ended; the wait ended without an answer")


__all__ = ["CallbackError", "run_of", "send_callback"]
