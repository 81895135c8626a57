"""The payloads of an eval run (``aiworker eval run``; workflows/evals.py).

An :class:`EvalInput` carries the items to call (their resolved inputs and
tenants, by dataset item id), how to reach the candidate (:class:`EvalCandidate`)
and the run's bounds (budget, concurrency); the workflow returns an
:class:`EvalResult`, one :class:`EvalItemResult` per item in the input's order.
Scoring happens in the client from the result and the dataset
(workers/evals/report.py): the workflow only calls, so a run replays from its
calls alone.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from aiworker.schemas.base import Model
from aiworker.schemas.names import TENANT_PATTERN
from aiworker.schemas.protocol import Usage
from aiworker.schemas.spec import RecordedSpec

MAX_EVAL_ITEMS = 1000
"""The most items one eval run takes (a dataset file may hold no more)."""
MAX_EVAL_CONCURRENCY = 32


class EvalItem(Model):
    """One item to call: its dataset id, the resolved input and the tenant it was for."""

    id: str = Field(min_length=1, max_length=200)
    input: dict[str, Any]
    tenant: str = Field(default="default", pattern=TENANT_PATTERN)


class EvalCandidate(Model):
    """How to call the candidate.

    ``mode`` ``spec``: the ``eval-call`` activity runs ``spec`` (a prompt worker:
    a new version of its spec file, or the recorded worker with another model
    alias) on ``spec.task_queue``. ``mode`` ``queue``: the activity named
    ``spec.worker_id`` on ``task_queue`` (a worker version other processes
    serve), under ``spec``'s timeouts and retries. ``input_overrides`` are merged
    into every item's input (``--model`` for ``llm-call``: its ``model``).
    """

    mode: Literal["spec", "queue"]
    spec: RecordedSpec
    task_queue: str | None = None
    input_overrides: dict[str, Any] = Field(default_factory=dict)


class EvalJudge(Model):
    """An ``llm-call`` that grades each candidate output: ``rubric`` as its system
    text, ``response_schema`` the shape of its answer, ``pass_field`` the boolean
    field of the answer that says whether the item passes."""

    model: str = Field(default="default", min_length=1)
    rubric: str = Field(min_length=1, max_length=20_000)
    response_schema: dict[str, Any]
    pass_field: str = Field(default="pass", min_length=1)
    max_tokens: int = Field(default=200, ge=1, le=4096)


class EvalInput(Model):
    """The input of ``EvalWorkflow``."""

    dataset_sha256: str = Field(description="the dataset's content hash (names the run)")
    items: list[EvalItem] = Field(max_length=MAX_EVAL_ITEMS)
    candidate: EvalCandidate
    judge: EvalJudge | None = None
    judge_spec: RecordedSpec | None = Field(
        default=None, description="llm-call's spec as the client's catalog had it (judge only)"
    )
    max_cost_usd: float | None = Field(
        default=None, ge=0, description="the eval's budget: no item starts once it is spent"
    )
    concurrency: int = Field(default=4, ge=1, le=MAX_EVAL_CONCURRENCY)
    queue_suffix: str = ""


class EvalItemResult(Model):
    """How one item's call ended (and its judge's, when there was one)."""

    id: str
    status: Literal["succeeded", "partial", "failed", "skipped"]
    outputs: dict[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_field: str | None = None
    usage: Usage = Field(default_factory=Usage)
    duration_ms: float = 0.0
    attempts: int = 0
    judge: dict[str, Any] | None = Field(
        default=None, description="the judge's answer, or {error_code, error_message}"
    )


class EvalResult(Model):
    """The result of ``EvalWorkflow``: one entry per item, in the input's order."""

    items: list[EvalItemResult]
    spent_usd: float = 0.0


class EvalCall(Model):
    """The input of the ``eval-call`` activity: a prompt worker's spec and one request."""

    spec: RecordedSpec
    request: dict[str, Any]
