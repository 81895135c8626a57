"""``WorkerRegistryWorkflow``: the live worker registry of one namespace and queue family.

Each worker process publishes what it serves (a ``publish`` update, sent with
update-with-start, so the first process creates the workflow) when it starts
and again every third of its time-to-live while it polls; its entry expires
at the workflow's timer when it is not refreshed (a process that was killed),
and is withdrawn at once when the process stops gracefully (``withdraw``
signal). Clients read the entries with the ``entries`` query.

Why a workflow rather than Temporal's own worker listing: the task-queue
pollers the server reports name identities, not what a process serves (specs,
spec hashes, model aliases, build ids); keeping it in a workflow keeps it in
Temporal itself, with no side database. The entries are plain JSON to the
workflow (``schemas/live_registry.py``): only readers interpret them.

History stays bounded: the workflow continues as new, carrying its records,
when the server suggests it or after a counted number of rounds.
"""

from __future__ import annotations

import json
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.live_registry import (
        MAX_ENTRY_BYTES,
        MAX_PROCESSES,
        PublishRequest,
        RegistryRecord,
        RegistrySnapshot,
        RegistryState,
    )

# Rounds (a publish, a withdraw or an expiry each) before continuing as new; a
# process refreshing every 10 s is about 8 history events a round.
_MAX_ROUNDS = 250
_MAX_HISTORY_EVENTS = 2000


# Under Worker Deployment versioning this workflow must auto-upgrade (set where the
# workers get their deployment options; the server refuses a behavior without
# them): the registry outlives every build, and a pinned one would keep a drained
# version from being stopped. It carries only its records across builds.
@workflow.defn(name=names.WORKER_REGISTRY_WORKFLOW)
class WorkerRegistryWorkflow:
    """Keeps every live worker process's entry until it expires or is withdrawn."""

    @workflow.init
    def __init__(self, state: RegistryState) -> None:
        self._records: dict[str, RegistryRecord] = dict(state.records)
        self._changed = False

    @workflow.update(name=names.REGISTRY_PUBLISH_UPDATE)
    def publish(self, request: PublishRequest) -> int:
        """Keep ``request.entry`` for its process for ``ttl_seconds``; returns how
        many processes the registry lists now."""
        now = workflow.now().timestamp()
        self._records[request.identity] = RegistryRecord(
            entry=request.entry, published_at=now, expires_at=now + request.ttl_seconds
        )
        self._changed = True
        return len(self._records)

    @publish.validator
    def _admit(self, request: PublishRequest) -> None:
        """Refuse (no history written) an entry over the size cap, or a new process
        beyond the cap on processes."""
        if request.identity not in self._records and len(self._records) >= MAX_PROCESSES:
            raise ValueError(f"the registry lists {MAX_PROCESSES} processes already")
        size = len(json.dumps(request.entry, separators=(",", ":")))
        if size > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {size} bytes is over {MAX_ENTRY_BYTES}")

    @workflow.signal(name=names.REGISTRY_WITHDRAW_SIGNAL)
    def withdraw(self, identity: str) -> None:
        """A process that stops gracefully takes its entry back."""
        if self._records.pop(identity, None) is not None:
            self._changed = True

    @workflow.query(name=names.REGISTRY_ENTRIES_QUERY)
    def entries(self) -> RegistrySnapshot:
        """Every live record by identity; records past their expiry are left out
        even before the timer removed them."""
        now = workflow.now().timestamp()
        live = {k: r for k, r in self._records.items() if r.expires_at > now}
        return RegistrySnapshot(records=live, now=now)

    @workflow.run
    async def run(self, state: RegistryState) -> None:
        """Expire records on time; continue as new to keep the history bounded."""
        for _ in range(_MAX_ROUNDS):
            now = workflow.now().timestamp()
            self._records = {k: r for k, r in self._records.items() if r.expires_at > now}
            info = workflow.info()
            if (
                info.is_continue_as_new_suggested()
                or info.get_current_history_length() > _MAX_HISTORY_EVENTS
            ):
                break
            self._changed = False
            timeout = None
            if self._records:
                first = min(r.expires_at for r in self._records.values())
                timeout = timedelta(seconds=max(first - now, 0.0) + 0.001)
            try:
                await workflow.wait_condition(
                    lambda: self._changed,
                    timeout=timeout,
                    timeout_summary="registry: drop the next worker entry past its expiry",
                )
            except TimeoutError:
                pass  # an entry expired: the next round drops it
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(RegistryState(records=self._records))
