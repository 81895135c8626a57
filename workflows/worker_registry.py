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
when the server suggests it or after a counted number of rounds. What it holds
is bounded too: processes, bytes per entry and bytes of all live entries
together (the ``publish`` validator refuses past any of them, writing nothing).

Ownership: an entry may name an owner (the sha256 of a key only its process
holds); while that record lives, a publish under the same identity naming
another owner is refused, and a withdraw is honoured only with the key.
Earlier builds kept such entries without reading the owner, so what a
withdraw does depends on it only behind the patch ``registry-owners``
(:data:`OWNERS_PATCH`); the validator's refusals need none (validators do not
run on replay).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.live_registry import (
        MAX_ENTRY_BYTES,
        MAX_PROCESSES,
        MAX_REGISTRY_BYTES,
        PublishRequest,
        RegistryRecord,
        RegistrySnapshot,
        RegistryState,
        WithdrawRequest,
        entry_bytes,
        owner_named,
        owner_of,
    )

# Rounds (a publish, a withdraw or an expiry each) before continuing as new; a
# process refreshing every 10 s is about 8 history events a round.
_MAX_ROUNDS = 250
_MAX_HISTORY_EVENTS = 2000

# Owners are kept (and withdraws held to them) only in runs that have this marker:
# a run an earlier build began replays its withdraws as it ran them. The registry
# auto-upgrades, so the patch ends as samples-python's ``patching/`` ends one
# (docs/replay.md, "Patches and their plans"):
#   stage 3 -- build 0.3.0, not before 2027-01-04: ``workflow.deprecate_patch``
#     replaces ``workflow.patched`` and the old branch is deleted, once
#     ``aiworker replay --query "WorkflowType = 'WorkerRegistryWorkflow' AND
#     ExecutionStatus = 'Running'"`` passes on it (a registry run continues as new
#     within _MAX_ROUNDS rounds or _MAX_HISTORY_EVENTS events of the deploy, so
#     every run by then recorded the marker);
#   stage 4 -- build 0.4.0, not before 2027-02-01: the deprecate_patch call and the
#     id go, and owners are kept unconditionally.
OWNERS_PATCH = "registry-owners"


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
        self._owners: dict[str, str] = dict(state.owners)
        # each record's entry_bytes, so the validator sums sizes without encoding
        # every entry again (derived from the records: no history of its own)
        self._sizes = {k: entry_bytes(r.entry) for k, r in self._records.items()}
        self._changed = False

    @workflow.update(name=names.REGISTRY_PUBLISH_UPDATE)
    def publish(self, request: PublishRequest) -> int:
        """Keep ``request.entry`` for its process for ``ttl_seconds``; returns how
        many processes the registry lists now."""
        now = workflow.now().timestamp()
        self._records[request.identity] = RegistryRecord(
            entry=request.entry, published_at=now, expires_at=now + request.ttl_seconds
        )
        self._sizes[request.identity] = entry_bytes(request.entry)
        owner = owner_named(request.entry)
        if owner is not None and workflow.patched(OWNERS_PATCH):
            self._owners[request.identity] = owner
        else:
            self._owners.pop(request.identity, None)
        self._changed = True
        return len(self._records)

    @publish.validator
    def _admit(self, request: PublishRequest) -> None:
        """Refuse (no history written) a new process beyond the cap on processes, an
        entry over the size cap or one that would take every live entry's bytes
        over the registry's cap, and a publish under an identity whose live record
        another owner holds."""
        now = workflow.now().timestamp()
        held = self._records.get(request.identity)
        live = held is not None and held.expires_at > now
        if held is None and len(self._records) >= MAX_PROCESSES:
            raise ValueError(f"the registry lists {MAX_PROCESSES} processes already")
        owner = self._owners.get(request.identity)
        if live and owner is not None and owner_named(request.entry) != owner:
            raise ValueError(
                f"identity {request.identity!r} is held by another publisher until its "
                "entry expires or is withdrawn"
            )
        size = entry_bytes(request.entry)
        if size > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {size} bytes is over {MAX_ENTRY_BYTES}")
        others = sum(
            n
            for k, n in self._sizes.items()
            if k != request.identity and self._records[k].expires_at > now
        )
        if others + size > MAX_REGISTRY_BYTES:
            raise ValueError(
                f"entry of {size} bytes would take the registry to {others + size} bytes, "
                f"over its cap of {MAX_REGISTRY_BYTES} (the entries of every live process "
                "together); publish smaller entries or fewer processes"
            )

    @workflow.signal(name=names.REGISTRY_WITHDRAW_SIGNAL)
    def withdraw(self, request: str | WithdrawRequest) -> None:
        """A process that stops gracefully takes its entry back: with the key its
        publish named the owner of, or (a record that names no owner) by identity."""
        if isinstance(request, WithdrawRequest):
            identity, key = request.identity, request.key
        else:
            identity, key = request, None
        owner = self._owners.get(identity)
        if owner is not None and (key is None or owner_of(key) != owner):
            workflow.logger.warning("registry: withdraw of %r without its key ignored", identity)
            return
        if self._records.pop(identity, None) is not None:
            self._sizes.pop(identity, None)
            self._owners.pop(identity, None)
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
            self._sizes = {k: n for k, n in self._sizes.items() if k in self._records}
            self._owners = {k: o for k, o in self._owners.items() if k in self._records}
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
        workflow.continue_as_new(RegistryState(records=self._records, owners=self._owners))
