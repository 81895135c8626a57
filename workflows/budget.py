"""The budget ledger of a pipeline: tokens, external calls, money and a deadline.

Before a step is scheduled it asks the ledger for an admission. The ledger
refuses (``BudgetRefused``) when a limit is already spent or the deadline
passed, and otherwise reserves the step's share: the worker spec's own cap,
or everything left when the worker has none. The reservation becomes the
request's ``max_tokens`` / ``max_external_calls`` constraint, so parallel
steps together never overspend, and the worker itself stops at its share.
When the step ends, the reservation is released and the real usage
booked. Usage comes from activity results recorded in history, so a replay
rebuilds the same ledger and never counts twice. Pure and deterministic.

Money (``max_cost_usd``) is priced in the worker process, from model prices
the workflow never sees, so it cannot be cut into shares as tokens are: a
step that may use tokens is refused once the cost budget is spent, and the
step that crosses the limit finishes (its money is already spent).

The pipeline's deadline is one :class:`Deadline` (the only place its arithmetic
lives): the ledger refuses steps past it and caps their timeouts by it, an
admission carries the time left, which bounds how long a call of an external
worker may wait for a poller (``schedule_to_start``), permit waits end at it,
and a for_each chunk inherits it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from temporalio import workflow

# The models must be the very classes the workflow passes through the sandbox.
with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.pipeline import Budget
    from aiworker.schemas.protocol import Usage, usd_text
    from aiworker.schemas.spec import WorkerSpec
    from aiworker.schemas.tenants import tighten_budget


class BudgetRefused(Exception):
    """A step would exceed the budget; ``resource`` names the limit."""

    def __init__(self, resource: str, message: str) -> None:
        super().__init__(message)
        self.resource = resource
        self.message = message


@dataclass(frozen=True)
class Deadline:
    """A point in workflow time (POSIX seconds) after which nothing new starts;
    ``at`` None: no deadline."""

    at: float | None = None

    @classmethod
    def after(cls, started_at: float, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else started_at + seconds)

    def left(self, now: float) -> float | None:
        """Seconds left at ``now`` (zero or less: passed); None without a deadline."""
        return None if self.at is None else self.at - now

    def wait(self) -> timedelta | None:
        """How long a workflow may still wait (``workflow.wait_condition``'s timeout)."""
        left = self.left(workflow.now().timestamp())
        return None if left is None else timedelta(seconds=max(0.0, left))


@dataclass(frozen=True)
class Admission:
    """What one admitted step may spend (``None``: no limit from the budget)."""

    max_tokens: int | None
    max_external_calls: int | None
    timeout_seconds: float | None
    # What was left of the pipeline deadline when the step was admitted: bounds how
    # long a call may wait for a worker to poll its queue (external workers).
    deadline_seconds: float | None = None
    # What was left of max_cost_usd: shared out to for_each chunks, never reserved.
    cost_usd: Decimal | None = None


def _share(left: int, cap: int | None) -> int:
    return left if cap is None else min(left, cap)


@dataclass
class Ledger:
    """Usage and reservations against one pipeline's budget."""

    budget: Budget
    started_at: float
    used: Usage = field(default_factory=Usage)
    reserved_tokens: int = 0
    reserved_calls: int = 0
    # From the budget's deadline_seconds, or inherited whole (a for_each chunk).
    ends: Deadline = field(default_factory=Deadline)

    def __post_init__(self) -> None:
        if self.ends.at is None:
            self.ends = Deadline.after(self.started_at, self.budget.deadline_seconds)

    @property
    def deadline(self) -> float | None:
        return self.ends.at

    def hold_to(self, ceiling: Budget) -> None:
        """Hold the budget under ``ceiling`` (the tenant's), each limit the tighter;
        before any step, while nothing is reserved."""
        self.budget = tighten_budget(self.budget, ceiling)
        self.ends = Deadline.after(self.started_at, self.budget.deadline_seconds)

    def tokens_left(self) -> int | None:
        if self.budget.max_tokens is None:
            return None
        spent = self.used.input_tokens + self.used.output_tokens
        return max(0, self.budget.max_tokens - spent - self.reserved_tokens)

    def calls_left(self) -> int | None:
        if self.budget.max_external_calls is None:
            return None
        return max(
            0, self.budget.max_external_calls - self.used.external_calls - self.reserved_calls
        )

    def cost_left(self) -> Decimal | None:
        """US dollars left of ``max_cost_usd`` (None: no cost limit)."""
        if self.budget.max_cost_usd is None:
            return None
        return max(Decimal(0), self.budget.max_cost_usd - self.used.cost_usd)

    def admit(
        self, worker: WorkerSpec, now: float, timeout: float | None = None, calls: int = 1
    ) -> Admission:
        """Reserve a step's share or raise ``BudgetRefused`` before it is scheduled.

        ``calls`` is how many worker calls the step makes (a ``for_each`` step
        makes one per item), so its share is the spec's cap for each of them.
        """
        remaining_time = self.ends.left(now)
        if remaining_time is not None and remaining_time <= 0:
            seconds = self.budget.deadline_seconds
            of = "" if seconds is None else f" of {seconds:g}s"
            raise BudgetRefused("deadline", f"pipeline deadline{of} has passed")
        c = worker.constraints
        tokens: int | None = None
        left = self.tokens_left()
        # A worker whose spec allows no tokens cannot overspend them.
        if left is not None and c.max_tokens != 0:
            if left <= 0:
                raise BudgetRefused("tokens", f"token budget of {self.budget.max_tokens} is spent")
            tokens = _share(left, None if c.max_tokens is None else c.max_tokens * calls)
        left = self.calls_left()
        if left is not None and c.max_external_calls != 0:
            if left <= 0:
                raise BudgetRefused(
                    "external_calls",
                    f"external call budget of {self.budget.max_external_calls} is spent",
                )
            n_calls = _share(
                left, None if c.max_external_calls is None else c.max_external_calls * calls
            )
        else:
            n_calls = None
        cost_left = self.cost_left()
        # Only tokens cost money: a worker whose spec allows none runs on a spent budget.
        if cost_left is not None and cost_left <= 0 and c.max_tokens != 0:
            raise BudgetRefused(
                "cost_usd",
                f"cost budget of {usd_text(self.budget.max_cost_usd or Decimal(0))} USD is "
                f"spent ({usd_text(self.used.cost_usd)} USD used)",
            )
        self.reserved_tokens += tokens or 0
        self.reserved_calls += n_calls or 0
        limit = timeout
        if remaining_time is not None:
            limit = remaining_time if limit is None else min(limit, remaining_time)
        if limit is not None:
            limit = min(limit, c.timeout_seconds)
        return Admission(
            max_tokens=tokens,
            max_external_calls=n_calls,
            timeout_seconds=limit,
            deadline_seconds=remaining_time,
            cost_usd=cost_left,
        )

    def settle(self, admission: Admission, usage: Usage) -> None:
        """Release a reservation and book what the step really used."""
        self.reserved_tokens -= admission.max_tokens or 0
        self.reserved_calls -= admission.max_external_calls or 0
        self.used = self.used + usage

    def view(self) -> dict[str, object]:
        """Limits, usage and what is left, for the ``progress`` query."""
        return {
            "limits": self.budget.model_dump(mode="json"),
            "used": self.used.model_dump(mode="json"),
            "tokens_left": self.tokens_left(),
            "external_calls_left": self.calls_left(),
            "cost_usd_left": None if (left := self.cost_left()) is None else usd_text(left),
            "deadline": self.deadline,
        }
