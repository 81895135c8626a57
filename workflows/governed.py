"""One governed call: the single road every worker call of a workflow takes.

A pipeline step's call (and its fallback, and each call of a review retry,
which runs the step again), a for_each item, an agent's model turn and tool
call, and a step's validator all go through :func:`governed_call`, in this
order::

    1. permits      the worker's per-tenant rate limit, then the step's
                    concurrency key (``Governance.asks``, rate first), each
                    waited for until the pipeline's deadline
                    -> Refused("rate_limited") when it passes first
    2. admission    the budget ledger reserves the call's share and caps its
                    timeout by the deadline (``Governance.ledger``)
                    -> Refused("budget"); the permits are given back
    3. the call     ``call_worker`` (or the caller's ``invoke``: an agent
                    step's child workflow), cut at the deadline when
                    ``Governance.cut`` (an agent's turns and tool calls)
    4. release      the concurrency leases go back, also when the call
                    raised (a cancelled run)
    5. settlement   the reservation is released and the real usage booked
                    (nothing booked for a call cut at the deadline, whose
                    usage is unknown: Refused("deadline"))

Why permits before budget: a call that waits for a permit holds nothing of
the budget while it waits, so its siblings' shares are not cut by calls that
are not running, and its timeout is capped by the deadline as it stands when
it is scheduled, not when it began to wait. For_each items take the same
order.

What a call may not do is a :class:`Refused` value, never an exception; each
caller words it as its results do (a step's ``Ended``, an item's
``ItemResult``, an agent's bound). The protocol is written here rather than
as a Temporal feature because Temporal has no budget or cross-workflow
permit primitive: the permits are aiworker's limiter workflows
(:mod:`workflows.limits`), the budget its ledger (:mod:`workflows.budget`).
Deterministic code only.

An agent's turns and tool calls ask for the rate permit of their worker as a
step's call does (the agent's workflow receives the ``permit`` signals itself),
waited for until the agent's deadline (an agent with no rate-limited worker
asks none).
Not through permits: a step's validator (no permits, no budget).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.limits import AcquireCall
    from aiworker.schemas.pipeline import StepResult
    from aiworker.schemas.protocol import Usage

from aiworker.workflows.budget import Admission, BudgetRefused, Deadline, Ledger
from aiworker.workflows.calls import CallContext, WorkerCall, call_worker
from aiworker.workflows.limits import Lease, PermitBook, WaitExpired

NO_DEADLINE = Deadline()

Invoke = Callable[[Admission | None], Awaitable[StepResult]]


@dataclass(frozen=True)
class Refused:
    """Why a governed call did not run (or was cut): ``kind`` is ``rate_limited``
    (a permit wait reached the deadline), ``budget`` (the ledger refused;
    ``resource`` names the limit) or ``deadline`` (cut in flight, ``cut``)."""

    kind: Literal["rate_limited", "budget", "deadline"]
    resource: str
    message: str


@dataclass(frozen=True)
class Governance:
    """What governs one call: the permits to wait for, the budget to be admitted by.

    ``permits`` is the book of the workflow the permits are signalled to and
    ``asks`` what to ask it for (None or empty: no permit; ``CallLimits.calls``),
    each waited for until ``deadline``. ``asks`` is called when the call comes
    to its permits, so a ticket it draws (``workflow.uuid4``) is drawn at the
    same point of the history on every replay. ``ledger`` None: no budget (a
    step's validator). ``cut``: the call is cut when the ledger's deadline passes
    in flight.
    """

    ledger: Ledger | None = None
    permits: PermitBook | None = None
    asks: Callable[[], Sequence[AcquireCall]] | None = None
    deadline: Deadline = NO_DEADLINE
    who: str = ""
    cut: bool = False


async def governed_call(
    call: WorkerCall, gov: Governance, invoke: Invoke | None = None
) -> StepResult | Refused:
    """Run ``call`` under ``gov`` in the documented order (module docstring):
    permits, admission, the call, release, settlement.

    ``invoke`` runs the call given its admission (default
    :func:`~aiworker.workflows.calls.call_worker`); a step uses it to start an
    agent's child workflow instead and to show an external worker's wait.
    Never raises on a worker's failure (it is the ``StepResult``); a refusal is
    a :class:`Refused`.
    """
    run: Invoke = invoke or (lambda admission: call_worker(call, admission))
    leases = await _wait_for_permits(gov)
    if isinstance(leases, Refused):
        return leases
    admission = await _admit_holding(call, gov, leases)
    if isinstance(admission, Refused):
        return admission
    try:
        result = await (_cut(run, admission, gov, call) if gov.cut else run(admission))
    finally:
        await _release(gov, leases)
    if isinstance(result, Refused):
        _settle(gov, admission, Usage())  # what the cut call used is unknown
        return result
    _settle(gov, admission, result.usage)
    return result


BatchInvoke = Callable[[list[tuple[WorkerCall, Admission | None]]], Awaitable[list[StepResult]]]


async def governed_batch(
    calls: Sequence[WorkerCall],
    govs: Sequence[Governance],
    invoke: BatchInvoke,
    slot: contextlib.AbstractAsyncContextManager[Any] | None = None,
) -> list[StepResult | Refused]:
    """Run several calls (a for_each's items of one items task) under their own
    governance, in the documented order for each (module docstring), with ONE
    ``invoke`` for all the admitted ones.

    Each call waits for its permits (all together: the chunk's permit book asks
    the limiters for them in one go), then the budget admits it or not, in call
    order; ``invoke`` gets the admitted calls with their admissions and returns
    one result each, in that order; then every lease is released and every
    admission settled with its own call's usage. A call refused on the way is
    its :class:`Refused`, the others run. ``slot``, when given, is entered
    after the admissions and held around ``invoke`` (the caller's bound on tasks
    running at once), so a group waiting for it already holds its permits.
    """
    waited = await asyncio.gather(*(_wait_for_permits(g) for g in govs))
    out: list[StepResult | Refused | None] = [None] * len(calls)
    admitted: list[tuple[int, list[Lease], Admission | None]] = []
    for i, (call, gov, leases) in enumerate(zip(calls, govs, waited, strict=True)):
        if isinstance(leases, Refused):
            out[i] = leases
            continue
        admission = await _admit_holding(call, gov, leases)
        if isinstance(admission, Refused):
            out[i] = admission
            continue
        admitted.append((i, leases, admission))
    results: list[StepResult] = []
    try:
        if admitted:
            async with slot or contextlib.nullcontext():
                results = await invoke([(calls[i], a) for i, _, a in admitted])
    finally:
        for i, leases, _ in admitted:
            await _release(govs[i], leases)
    for (i, _, admission), result in zip(admitted, results, strict=True):
        _settle(govs[i], admission, result.usage)
        out[i] = result
    return [r for r in out if r is not None]


async def _wait_for_permits(gov: Governance) -> list[Lease] | Refused:
    asks = gov.asks() if gov.asks is not None else ()
    if gov.permits is None or not asks:
        return []
    leases = await gov.permits.acquire_all(asks, gov.deadline.wait, who=gov.who)
    if isinstance(leases, WaitExpired):
        return Refused("rate_limited", leases.call.kind, leases.message)
    return leases


def _admit(call: WorkerCall, gov: Governance) -> Admission | Refused | None:
    if gov.ledger is None:
        return None
    try:
        return gov.ledger.admit(call.worker, workflow.now().timestamp(), call.timeout_seconds)
    except BudgetRefused as e:
        return Refused("budget", e.resource, e.message)


async def _admit_holding(
    call: WorkerCall, gov: Governance, leases: list[Lease]
) -> Admission | Refused | None:
    """The budget's admission of a call that already holds its permits; a refusal
    releases them."""
    admission = _admit(call, gov)
    if isinstance(admission, Refused):
        await _release(gov, leases)
    return admission


async def _release(gov: Governance, leases: list[Lease]) -> None:
    if gov.permits is not None and leases:
        await gov.permits.release_all(leases)


def _settle(gov: Governance, admission: Admission | None, usage: Usage) -> None:
    if gov.ledger is not None and admission is not None:
        gov.ledger.settle(admission, usage)


async def _cut(
    run: Invoke, admission: Admission | None, gov: Governance, call: WorkerCall
) -> StepResult | Refused:
    """The call, cancelled when the ledger's deadline passes before it ends."""
    left = gov.ledger.ends.left(workflow.now().timestamp()) if gov.ledger else None
    if left is None:
        return await run(admission)
    task = asyncio.ensure_future(run(admission))
    # wait_condition rather than workflow.wait: the same timer command at the same
    # point (created as the wait begins, cancelled when the call ends), with a summary
    try:
        await workflow.wait_condition(
            task.done,
            timeout=max(0.001, left),
            timeout_summary=f"deadline of {call.summary} ({call.worker.worker_id})",
        )
    except TimeoutError:
        pass
    if not task.done():
        # call_worker turns the cancellation into a result; that is not the call's
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Refused("deadline", "deadline", "the deadline passed during the call")
    return task.result()


__all__ = [
    "CallContext",
    "Governance",
    "Refused",
    "WorkerCall",
    "governed_batch",
    "governed_call",
]
