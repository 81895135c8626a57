"""``SharedBreakerWorkflow``: one circuit breaker's state, seen by every process.

A worker process whose breaker for a target opens signal-with-starts this
workflow with the time until which the target is open; other processes query
it (at most about once a second per target) and fail fast with
``circuit_open`` until then. The time is also kept in the workflow's memo
(``open_until``), which the server itself answers in ``DescribeWorkflow``:
a process reads it without a worker replaying anything, even when the
worker that ran the workflow last is gone.

Half-open across processes: when the open period ends, the target is
half-open for every process until a probe succeeds. The one probe is a lease
this workflow grants (update ``probe``) to the first process that asks, for at
most ``lease_seconds``; everyone else is told "a probe is in flight" and
fails fast until the lease ends. The lease ends with the probe's outcome: a
success (signal ``closed``) closes the breaker everywhere, a failure re-opens
it (signal ``opened``); or with its expiry, so a prober killed mid-call frees
the probe after one lease. Whether a probe closed it and until when the lease
runs are kept in the memo too (``probe``): processes read from it that the
target is half-open, and operators see the lease; whether a call may probe is
always the update's answer, since a view up to a second old may miss the
close. Temporal has no cross-process lease primitive; a workflow's update
handlers run one at a time, which makes "the first asker wins" exact.

The state is carried across continue-as-new; an idle breaker completes and the
next opening starts it again.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.breakers import ProbeAnswer, ProbeRequest, SharedBreakerState

_IDLE_SECONDS = 300.0
_MAX_ROUNDS = 200
_MAX_HISTORY_EVENTS = 1000
# SharedBreakerWorkflow auto-upgrades (a run moves to the current build at its next
# task), so its changes are patched; each patch ends as samples-python's
# ``patching/`` ends one (docs/replay.md, "Patches and their plans"):
#   stage 3 -- build 0.3.0, not before 2027-01-04: ``workflow.deprecate_patch``
#     replaces ``workflow.patched``, the old branch and ``breaker-20261127.json``
#     (the replay gate's run from before the probe lease) are deleted, once
#     ``aiworker replay --query "WorkflowType = 'SharedBreakerWorkflow' AND
#     ExecutionStatus = 'Running'"`` passes on it (a breaker run lives at most
#     _MAX_ROUNDS rounds or _MAX_HISTORY_EVENTS events before it continues as new
#     on the current build, so every run by then recorded the marker);
#   stage 4 -- build 0.4.0, not before 2027-02-01: the deprecate_patch call and the
#     id go, once no breaker run started on a build before 0.3.0 is running.
# Replay: runs recorded before the memo existed did not upsert it.
_MEMO_PATCH = "breaker-memo"
# Replay: runs recorded before the probe lease kept no ``probe`` memo.
PROBE_LEASE_PATCH = "breaker-probe-lease"


@workflow.defn(name=names.SHARED_BREAKER_WORKFLOW)
class SharedBreakerWorkflow:
    """Holds one target's open-until time and its half-open probe lease for every
    worker process."""

    def __init__(self) -> None:
        self._until = 0.0
        self._closed = False
        self._lease_until = 0.0
        self._changed = False

    @workflow.signal(name=names.BREAKER_OPENED_SIGNAL)
    def opened(self, open_until: float) -> None:
        """A process opened its breaker for this target until ``open_until`` (a failed
        probe re-opens it): any probe lease ends."""
        if open_until > self._until:
            self._until = open_until
        self._closed = False
        self._lease_until = 0.0
        self._changed = True

    @workflow.signal(name=names.BREAKER_CLOSED_SIGNAL)
    def closed(self) -> None:
        """The probe succeeded: calls pass everywhere, the lease ends."""
        if self._until <= workflow.now().timestamp():
            self._closed = True
            self._lease_until = 0.0
            self._changed = True

    @workflow.update(name=names.BREAKER_PROBE_UPDATE)
    def probe(self, ask: ProbeRequest) -> ProbeAnswer:
        """Grant the one half-open probe to the first process that asks."""
        now = workflow.now().timestamp()
        if self._closed or self._until <= 0:
            return ProbeAnswer(closed=True)
        if self._until > now or self._lease_until > now:
            return ProbeAnswer(open_until=self._until, lease_until=self._lease_until)
        self._lease_until = now + max(0.0, ask.lease_seconds)
        self._changed = True
        workflow.logger.info("probe lease for %s until %.3f", ask.holder, self._lease_until)
        return ProbeAnswer(granted=True, open_until=self._until, lease_until=self._lease_until)

    @workflow.query(name=names.BREAKER_STATE_QUERY)
    def state(self) -> float:
        """Epoch seconds until which the target is open (0: never opened)."""
        return self._until

    @workflow.run
    async def run(self, state: SharedBreakerState) -> SharedBreakerState:
        """Keep the state until idle; continue-as-new to keep history bounded."""
        self._until = max(self._until, state.open_until)
        if not self._changed:  # a start signal's opening comes after the carried state
            self._closed, self._lease_until = state.closed, state.lease_until
        published = -1.0
        probe_published: tuple[bool, float] | None = None
        for _ in range(_MAX_ROUNDS):
            memo: dict[str, object] = {}
            if self._until != published and workflow.patched(_MEMO_PATCH):
                memo[names.BREAKER_MEMO_KEY] = self._until
                published = self._until
            probe = (self._closed, self._lease_until)
            if probe != probe_published and workflow.patched(PROBE_LEASE_PATCH):
                memo[names.BREAKER_PROBE_MEMO_KEY] = {
                    "closed": self._closed,
                    "lease_until": self._lease_until,
                }
                probe_published = probe
            if memo:
                workflow.upsert_memo(memo)
            idle = max(self._until, self._lease_until) + _IDLE_SECONDS - workflow.now().timestamp()
            if idle <= 0:
                return self._state(state.key)
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
        workflow.continue_as_new(self._state(state.key))

    def _state(self, key: str) -> SharedBreakerState:
        return SharedBreakerState(
            key=key, open_until=self._until, closed=self._closed, lease_until=self._lease_until
        )
