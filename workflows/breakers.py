"""``SharedBreakerWorkflow``: one circuit breaker's openings, seen by every process.

A worker process whose breaker for a target opens signal-with-starts this
workflow with the time until which the target is open; other processes query
it (at most about once a second per target) and fail fast with
``circuit_open`` until then. The time is also kept in the workflow's memo
(``open_until``), which the server itself answers in ``DescribeWorkflow``:
a process reads it without a worker replaying anything, even when the
worker that ran the workflow last is gone. The state is a single timestamp, carried across
continue-as-new; an idle breaker completes and the next opening starts it
again.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.breakers import SharedBreakerState

_IDLE_SECONDS = 300.0
_MAX_ROUNDS = 200
_MAX_HISTORY_EVENTS = 1000
# Replay: runs recorded before the memo existed did not upsert it.
_MEMO_PATCH = "breaker-memo"


@workflow.defn(name=names.SHARED_BREAKER_WORKFLOW)
class SharedBreakerWorkflow:
    """Holds one target's open-until time for every worker process."""

    def __init__(self) -> None:
        self._until = 0.0
        self._changed = False

    @workflow.signal(name=names.BREAKER_OPENED_SIGNAL)
    def opened(self, open_until: float) -> None:
        """A process opened its breaker for this target until ``open_until``."""
        if open_until > self._until:
            self._until = open_until
        self._changed = True

    @workflow.query(name=names.BREAKER_STATE_QUERY)
    def state(self) -> float:
        """Epoch seconds until which the target is open (0: never opened)."""
        return self._until

    @workflow.run
    async def run(self, state: SharedBreakerState) -> SharedBreakerState:
        """Keep the state until idle; continue-as-new to keep history bounded."""
        self._until = max(self._until, state.open_until)
        published = -1.0
        for _ in range(_MAX_ROUNDS):
            if self._until != published and workflow.patched(_MEMO_PATCH):
                workflow.upsert_memo({names.BREAKER_MEMO_KEY: self._until})
                published = self._until
            idle = self._until + _IDLE_SECONDS - workflow.now().timestamp()
            if idle <= 0:
                return SharedBreakerState(key=state.key, open_until=self._until)
            if workflow.info().get_current_history_length() > _MAX_HISTORY_EVENTS:
                break
            self._changed = False
            try:
                await workflow.wait_condition(
                    lambda: self._changed,
                    timeout=timedelta(seconds=idle),
                    timeout_summary=f"breaker {state.key}: end when idle (open period over)",
                )
            except TimeoutError:
                pass
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(SharedBreakerState(key=state.key, open_until=self._until))
