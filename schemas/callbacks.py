"""The ``wait`` step's contract: its spec field, its tokens and the callback Update.

A step ``{"id": "sign", "wait": {"schema": {...}, "timeout_seconds": N}}``
creates a token (one per item in a ``for_each``) and waits until someone
completes it (``{"outputs": {...}}``, checked against ``schema``), fails it
(``{"error": {"message": "..."}}``) or its timeout ends it. While it waits,
``${{ steps.sign.token }}`` and ``${{ steps.sign.callback_url }}`` resolve.

A token is ``awt1.<workflow id, base64url>.<secret>``: the workflow id leads
the front door (or the SDK) to the run without any side database, and the
secret (32 random bytes from :mod:`secrets`, drawn by the ``callback-tokens``
local activity and so recorded in the history) is what the run checks. The run
answers the ``callback`` Workflow Update; its validator refuses (nothing
written to history) an unknown secret, an ended wait, a repeat and a body off
the schema, each with an :class:`~temporalio.exceptions.ApplicationError` whose
``type`` is one of :class:`Refusal`. Pure data and functions: no I/O on import.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field

from aiworker.schemas.base import Model
from aiworker.schemas.errors import ErrorCode

TOKEN_PREFIX: Final = "awt1"
# 32 random bytes as base64url: 43 characters.
SECRET_CHARS: Final = 43
# A workflow id is at most 1000 bytes (Temporal's default), 1336 in base64url.
MAX_TOKEN_CHARS: Final = 1400
# The longest a wait may be set to wait (and a heartbeat extend it by): 365 days.
MAX_WAIT_SECONDS: Final = 365 * 86400
# Items of a for_each wait step: each token waits in the pipeline's own workflow.
MAX_WAIT_ITEMS: Final = 1000
# Heartbeats one run accepts in all (each is an Update in its history).
MAX_HEARTBEATS_PER_RUN: Final = 2000
# A failure's message is kept in the step's result.
MAX_FAIL_MESSAGE_CHARS: Final = 4000
# The code of a step whose callback reported a failure.
CALLBACK_FAILED: Final = ErrorCode.CALLBACK_FAILED.value
# The token fields a reference may read while the step waits.
TOKEN_FIELDS: Final = ("token", "callback_url")


class Refusal(StrEnum):
    """Why the ``callback`` Update refused (the ``ApplicationError`` type), with the
    HTTP status the front door answers."""

    UNKNOWN = "callback_unknown"  # 404: no such token in this run (or another tenant's)
    ENDED = "callback_ended"  # 410: the wait timed out or ended without an answer
    CONFLICT = "callback_conflict"  # 409: answered before, with another body
    REPEAT = "callback_repeat"  # 200: the same answer again; details[0] is the first reply
    INVALID = "callback_invalid"  # 422: a body off the schema or the request shape
    TOO_MANY = "callback_too_many"  # 429: the run's heartbeats are spent

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS = {
    Refusal.UNKNOWN: 404,
    Refusal.ENDED: 410,
    Refusal.CONFLICT: 409,
    Refusal.REPEAT: 200,
    Refusal.INVALID: 422,
    Refusal.TOO_MANY: 429,
}


class Wait(Model):
    """A wait step: a token handed out, a callback awaited."""

    schema_: dict[str, Any] | bool = Field(
        alias="schema",
        description="the JSON Schema a completion's outputs must match (they become the "
        "step's outputs)",
    )
    timeout_seconds: float = Field(
        gt=0,
        le=MAX_WAIT_SECONDS,
        allow_inf_nan=False,
        description="how long the step waits for its callback; then it fails with `timeout` "
        "(a heartbeat starts this span again from the heartbeat, or extends by its own "
        "`extend_seconds`)",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CallbackError_(Model):
    """``{"message": ...}``: why the other system failed the wait."""

    message: str = Field(min_length=1, max_length=MAX_FAIL_MESSAGE_CHARS)

    model_config = ConfigDict(extra="forbid", frozen=True)


class CallbackBody(Model):
    """The body of ``POST /v1/callbacks/{token}``: outputs or an error, not both."""

    outputs: dict[str, Any] | None = Field(
        default=None, description="the step's outputs, checked against its wait.schema"
    )
    error: CallbackError_ | None = Field(default=None, description="fail the step instead")

    model_config = ConfigDict(extra="forbid", frozen=True)


class CallbackRequest(Model):
    """The argument of the ``callback`` Workflow Update."""

    token: str = Field(min_length=1, max_length=MAX_TOKEN_CHARS)
    action: Literal["complete", "fail", "heartbeat"]
    outputs: dict[str, Any] | None = None
    message: str | None = Field(default=None, max_length=MAX_FAIL_MESSAGE_CHARS)
    extend_seconds: float | None = Field(
        default=None, gt=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False
    )

    model_config = ConfigDict(extra="forbid", frozen=True)

    def answer(self) -> str:
        """The completion as one canonical text: two equal answers compare equal."""
        body = {"action": self.action, "outputs": self.outputs, "message": self.message}
        return hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()


class TokenCall(Model):
    """Input of the ``callback-tokens`` local activity."""

    count: int = Field(ge=1, le=MAX_WAIT_ITEMS)


class TokenGrant(Model):
    """Its answer: fresh secrets and the public base URL of ``aiworker serve``
    (``AIWORKER_SERVE_PUBLIC_URL`` of the process that ran it; None: unset)."""

    secrets: list[str]
    base_url: str | None = None


def make_token(workflow_id: str, secret: str) -> str:
    """The token of ``secret`` in the run ``workflow_id``."""
    wid = base64.urlsafe_b64encode(workflow_id.encode()).decode().rstrip("=")
    return f"{TOKEN_PREFIX}.{wid}.{secret}"


def parse_token(token: str) -> tuple[str, str]:
    """``(workflow id, secret)`` of a token; ``ValueError`` if it is not one."""
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError("not a callback token")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or len(parts[2]) != SECRET_CHARS:
        raise ValueError("not a callback token")
    try:
        wid = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a callback token") from None
    if not wid:
        raise ValueError("not a callback token")
    return wid, parts[2]


def callback_url(base_url: str | None, token: str) -> str:
    """The URL that completes ``token``: on ``base_url`` when set, else the path alone
    (relative to wherever ``aiworker serve`` listens)."""
    path = f"/v1/callbacks/{token}"
    return base_url.rstrip("/") + path if base_url else path


__all__ = [
    "CALLBACK_FAILED",
    "MAX_HEARTBEATS_PER_RUN",
    "MAX_WAIT_ITEMS",
    "MAX_WAIT_SECONDS",
    "TOKEN_FIELDS",
    "CallbackBody",
    "CallbackRequest",
    "Refusal",
    "TokenCall",
    "TokenGrant",
    "Wait",
    "callback_url",
    "make_token",
    "parse_token",
]
