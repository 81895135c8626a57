"""Usage booking: what one worker call consumed, across all its attempts.

A pipeline's budget counts tokens and external calls even when an attempt
fails and Temporal retries it, so each attempt's usage must reach the next:

- a worker books tokens as soon as a provider bills them (``ctx.spend``, or
  ``ctx.spend_usage`` with a priced reply's whole usage: cached tokens and
  ``cost_usd`` too), before anything else can fail; the toolbox counts
  external calls;
- a failure carries the call's usage so far (every attempt) in its
  ``ErrorInfo``, and in the heartbeat details, which Temporal keeps for the
  next attempt (:meth:`UsageBook.book`);
- the next attempt starts from those details (:meth:`UsageBook.of`), and
  heartbeats that a spec asks for carry them on, since a detail-less
  heartbeat would erase them (:meth:`UsageBook.heartbeats`);
- a success reports the earlier attempts' usage plus its own
  (:meth:`UsageBook.total`).

An attempt whose outcome is unknown is booked at its maximum. A worker
process killed mid-call (``kill -9``, a lost node), or an attempt the server
timed out before the worker's own deadline, never reports what it consumed;
only its heartbeats, if any, reached Temporal. So every heartbeat says which
attempt sent it and whether that attempt had ended (``final``: its usage is
complete) or was still running (its usage so far, and what was settled
``before`` it), and a failing attempt always heartbeats its final usage. The
next attempt (:meth:`UsageBook.cover_lost`) sees which earlier attempts ended
without a final word and books each at what the call may consume
(``Worker.usage_if_lost``: an ``llm-call``'s prompt estimate plus its
``max_tokens`` as admitted, and its one external call), or what it had
heartbeated if that is more; its response then carries the warning
``usage_estimated`` ("usage estimated: attempt outcome unknown"). The ledger
may overcount such an attempt, never undercount it.

A local activity (a worker whose spec says ``"execution": "local"``) cannot
heartbeat; its retries run in the process that runs the workflow (backoffs
up to ``LOCAL_RETRY_THRESHOLD``), so a failed attempt leaves its usage in this
process instead, keyed by run and activity id, for the next attempt to take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from aiworker.activities.errors import replaced
from aiworker.activities.toolbox import Toolbox
from aiworker.schemas.lost_usage import NOTHING_HEARD, USAGE_ESTIMATED, LastBeat, cover
from aiworker.schemas.protocol import Usage

__all__ = ["USAGE_ESTIMATED", "UsageBook", "heartbeating"]


class UsageBook:
    """The usage of one activity: earlier attempts' (``prior``) and the running one's.

    Args:
        prior: what earlier attempts consumed (see :meth:`of`).
    """

    def __init__(self, prior: Usage | None = None, last: LastBeat | None = None) -> None:
        self.prior = prior if prior is not None else Usage()
        # What the last heartbeat said of the attempt that sent it (None: nothing known,
        # or details from a worker before attempts were marked: trusted as they are).
        self._last = last
        # Earlier attempts whose outcome was unknown, booked at their maximum.
        self.lost: list[int] = []
        self.attempt = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_input_tokens = 0
        self.cache_write_tokens = 0
        self.cost_usd = Decimal(0)
        self.toolbox: Toolbox | None = None
        # Told each priced spend as it is booked: (model, US dollars); the call's metric.
        self.on_cost: Callable[[str, Decimal], None] | None = None

    @classmethod
    def of(cls, info: activity.Info | None) -> UsageBook:
        """A book that starts from the usage earlier attempts left in the heartbeat details
        (a local activity's: in this process)."""
        if info is not None and info.is_local:
            return cls(_LOCAL_PRIOR.pop(_local_key(info), None))
        book: UsageBook | None = None
        for d in info.heartbeat_details if info else ():
            if isinstance(d, dict) and isinstance(d.get("usage"), dict):
                try:
                    book = cls(Usage.model_validate(d["usage"]), LastBeat.of(d))
                except ValidationError:
                    pass
                break
        if book is None:
            book = cls(last=NOTHING_HEARD if info is not None else None)
        book.attempt = info.attempt if info is not None else 0
        return book

    def cover_lost(self, estimate: Usage) -> None:
        """Book each earlier attempt that ended without reporting its usage (its
        worker killed, or timed out by the server) at ``estimate``, the most one
        attempt may consume, or at what it heartbeated if that is more."""
        if self._last is None or self.attempt <= 1:
            return
        self.prior, self.lost = cover(self.prior, self._last, self.attempt - 1, estimate)

    def spend(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Book tokens a provider billed in this attempt."""
        self.input_tokens += max(0, input_tokens)
        self.output_tokens += max(0, output_tokens)

    def spend_usage(self, usage: Usage, model: str = "") -> None:
        """Book a model reply's whole usage (tokens, cached tokens, ``cost_usd``)
        billed in this attempt; ``model`` labels its cost metric."""
        self.spend(usage.input_tokens, usage.output_tokens)
        self.cached_input_tokens += usage.cached_input_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.cost_usd += usage.cost_usd
        if usage.cost_usd and self.on_cost is not None:
            self.on_cost(model, usage.cost_usd)

    def _extras(self) -> dict[str, Any]:
        return {
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cost_usd": self.cost_usd,
            "external_calls": self.toolbox.external_calls if self.toolbox else 0,
        }

    def this_attempt(self) -> Usage:
        """What the running attempt has consumed so far."""
        return Usage(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens, **self._extras()
        )

    def total(self, input_tokens: int = 0, output_tokens: int = 0) -> Usage:
        """What the call cost, earlier attempts included, for its response.

        ``input_tokens`` and ``output_tokens`` are what the worker's result
        reports; the larger of those and what it booked counts.
        """
        return self.prior + Usage(
            input_tokens=max(input_tokens, self.input_tokens),
            output_tokens=max(output_tokens, self.output_tokens),
            **self._extras(),
        )

    def book(self, failure: ApplicationError) -> ApplicationError:
        """``failure`` with what the call consumed so far, every attempt included.

        The usage goes into the failure's ``ErrorInfo`` (the workflow books it
        against the budget) and into the heartbeat details, which Temporal
        keeps for the next attempt, so retries add up instead of starting at 0.
        """
        usage = self.prior + self.this_attempt()
        if activity.in_activity():
            running = activity.info()
            if running.is_local:
                if usage != Usage():
                    _keep_local(running, usage)
            else:
                # always, even with nothing consumed: the next attempt then knows this
                # one ended and reported, and books no estimate for it
                activity.heartbeat(*_details(usage, running.attempt, final=True))
        if usage == Usage():
            return failure
        if not failure.details or not isinstance(failure.details[0], dict):
            return failure
        info = {**failure.details[0], "usage": usage.model_dump(mode="json")}
        return replaced(failure, failure.message, [info, *failure.details[1:]])

    def heartbeats(self, heartbeat_seconds: float | None) -> AbstractAsyncContextManager[None]:
        """Heartbeat in the background every third of ``heartbeat_seconds`` (if set,
        inside an activity), carrying the earlier attempts' usage."""
        return heartbeating(heartbeat_seconds, *self.running_details(self.prior))

    def running_details(self, so_far: Usage) -> list[dict[str, Any]]:
        """Heartbeat details of the running attempt: ``so_far`` is what the call has
        consumed, this attempt's known part included; what was settled before the
        attempt goes with it, so that a next attempt can book this one's maximum if
        it never ends (:meth:`cover_lost`)."""
        if self.attempt < 1:
            return _details(so_far)
        return _details(so_far, self.attempt, final=False, before=self.prior)


@contextlib.asynccontextmanager
async def heartbeating(heartbeat_seconds: float | None, *details: Any) -> AsyncIterator[None]:
    """Heartbeat the running activity in the background every third of
    ``heartbeat_seconds`` (if set, inside an activity), with ``details``."""
    if not heartbeat_seconds or not activity.in_activity():
        yield
        return
    interval = max(0.5, heartbeat_seconds / 3)

    async def beat() -> None:
        while True:
            activity.heartbeat(*details)
            await asyncio.sleep(interval)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# Failed local attempts' usage by (workflow id, run id, activity id), taken by the next
# attempt; a call whose last attempt failed leaves its entry, so the oldest go first.
_LOCAL_PRIOR: OrderedDict[tuple[str, str, str], Usage] = OrderedDict()
_LOCAL_PRIOR_MAX = 10_000


def _local_key(info: activity.Info) -> tuple[str, str, str]:
    return (info.workflow_id or "", info.workflow_run_id or "", info.activity_id)


def _keep_local(info: activity.Info, usage: Usage) -> None:
    _LOCAL_PRIOR[_local_key(info)] = usage
    while len(_LOCAL_PRIOR) > _LOCAL_PRIOR_MAX:
        _LOCAL_PRIOR.popitem(last=False)


def _details(
    usage: Usage, attempt: int = 0, final: bool = False, before: Usage | None = None
) -> list[dict[str, Any]]:
    """Heartbeat details that hand ``usage`` to the next attempt, and say which
    ``attempt`` sent them and whether it had ended (``final``)."""
    if attempt < 1:
        return [{"usage": usage.model_dump(mode="json")}] if usage != Usage() else []
    doc: dict[str, Any] = {"usage": usage.model_dump(mode="json"), "attempt": attempt}
    doc["final"] = final
    if before is not None:
        doc["before"] = before.model_dump(mode="json")
    return [doc]
