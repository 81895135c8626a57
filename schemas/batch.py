"""The items activity: several for_each items of one worker in one activity task.

A for_each step with ``items_per_task`` above 1 calls ``<worker_id>.items``
(:func:`items_activity`) once per group of items instead of ``<worker_id>``
once per item. Its input is an :class:`ItemsTask` (one request envelope per
item, the attempt each item is at, how many run at once); its result an
:class:`ItemsResult` with one :class:`ItemOutcome` per item, in order: the
item's ``WorkerResponse`` or its failure as ``ErrorInfo`` (stable code,
retryable or not, usage so far). An item's failure is its outcome, never the
activity's: the activity fails only as a whole (worker gone, timeout).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from aiworker.schemas.base import Model
from aiworker.schemas.protocol import ErrorInfo, WorkerResponse

ITEMS_SUFFIX = ".items"


def items_activity(worker_id: str) -> str:
    """The name of ``worker_id``'s items activity (served beside its own activity)."""
    return worker_id + ITEMS_SUFFIX


class ItemsTask(Model):
    """The input of ``<worker_id>.items``.

    ``requests`` are ``WorkerRequest`` envelopes as JSON, checked per item by the
    runtime (a malformed one is that item's ``invalid_input``, not the task's).
    """

    requests: list[dict[str, Any]] = Field(min_length=1, max_length=100)
    attempts: list[int] = Field(description="the attempt each item is at (1 = first)")
    max_parallel: int = Field(default=1, ge=1, description="items running at once in the task")

    @model_validator(mode="after")
    def _same_length(self) -> ItemsTask:
        if len(self.attempts) != len(self.requests):
            raise ValueError("attempts needs one entry per request")
        return self


class ItemOutcome(Model):
    """How one item of an items task ended: exactly one of ``response`` and ``error``."""

    response: WorkerResponse | None = None
    error: ErrorInfo | None = None


class ItemsResult(Model):
    """The result of ``<worker_id>.items``: one outcome per request, in order."""

    outcomes: list[ItemOutcome]


__all__ = ["ITEMS_SUFFIX", "ItemOutcome", "ItemsResult", "ItemsTask", "items_activity"]
