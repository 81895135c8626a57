"""A large for_each's item outputs by reference, from workflow code.

A for_each over more than the plan's ``inline_items`` items stores its
outputs instead of holding them (``ChunkInput.store_outputs``): each leaf
chunk stores its succeeded items' outputs through the ``foreach-store-items``
local activity and returns the part's reference; the step's
``outputs.items`` is an :class:`ItemsRef` over every part (a group chunk
stores its leaves' references as one index part). So the pipeline's memory
and history hold counts, the failed items up to the cap and at most one
reference per child, never an item's outputs.

Where a ``${{ }}`` reference needs the list (a later step's input, ``when``,
``for_each`` or concurrency key, the pipeline's ``output``),
``PipelineRun.materialize`` loads it once through ``foreach-load-items`` and the
run's scope shows the list in its place; the step result keeps the reference.
Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeout

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas import names
    from aiworker.schemas.errors import ErrorCode
    from aiworker.schemas.pipeline import ItemsRef, LoadedItems, LoadItems, StoreItems
    from aiworker.schemas.protocol import ArtifactRef
    from aiworker.schemas.refs import ReferenceError_, find_refs

from aiworker.workflows.calls import error_code_of

_TIMEOUT_SECONDS = 60
_MAX_ATTEMPTS = 5
_CODES = frozenset(c.value for c in ErrorCode)
_T = TypeVar("_T")


# A local activity's failure arrives as it was raised (an application failure or a
# timeout), not always wrapped in an ActivityError. Nothing else is caught: any
# other exception is a bug here and fails the workflow task.
_FAILED = (ActivityError, ApplicationError, TemporalTimeout)


class ItemsUnavailable(Exception):
    """Items could not be stored or loaded: their stable code and why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _unavailable(what: str, err: BaseException) -> ItemsUnavailable:
    cause = err.cause if isinstance(err, ActivityError) and err.cause is not None else err
    code = error_code_of(err)
    # the store's own codes (not_found, access_denied, invalid_input) pass through;
    # anything else (a full disk, an unreachable bucket) is the engine's failure
    return ItemsUnavailable(
        code if code in _CODES else ErrorCode.INTERNAL.value, f"{what}: {cause}"
    )


async def _run(name: str, arg: Any, result_type: type[_T], what: str, summary: str) -> _T:
    """One of the items activities, run locally with the module's timeout and retries.

    Raises:
        ItemsUnavailable: it failed on every attempt (``what`` failed).
    """
    try:
        result: _T = await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=timedelta(seconds=_TIMEOUT_SECONDS),
            retry_policy=RetryPolicy(
                maximum_attempts=_MAX_ATTEMPTS, maximum_interval=timedelta(seconds=10)
            ),
            summary=summary,
        )
    except _FAILED as e:
        raise _unavailable(what, e) from None
    return result


async def store_items(tenant: str, items: list[tuple[int, Any]]) -> ArtifactRef:
    """Store a leaf chunk's ``(index, outputs)`` pairs; the part's reference.

    Raises:
        ItemsUnavailable: the store failed on every attempt.
    """
    return await _run(
        names.STORE_ITEMS,
        StoreItems(tenant=tenant, items=items),
        ArtifactRef,
        "the items' outputs could not be stored",
        f"store {len(items)} items' outputs",
    )


async def store_index(tenant: str, parts: list[ArtifactRef]) -> ArtifactRef | None:
    """A group chunk's children's parts stored as one index part; None if the
    store failed (the parts then travel up as they are: nothing is lost)."""
    try:
        return await _run(
            names.STORE_ITEMS,
            StoreItems(tenant=tenant, parts=parts),
            ArtifactRef,
            "the index could not be stored",
            f"store the index of {len(parts)} parts",
        )
    except ItemsUnavailable:
        return None


async def load_items(tenant: str, ref: ItemsRef) -> list[Any]:
    """The list ``ref`` stands for (``None`` where an item failed).

    Raises:
        ItemsUnavailable: a part could not be read on any attempt.
    """
    loaded = await _run(
        names.LOAD_ITEMS,
        LoadItems(tenant=tenant, ref=ref),
        LoadedItems,
        "the items' outputs could not be loaded",
        f"load {ref.count} items' outputs",
    )
    return loaded.items


def needs_items(values: list[Any], steps: dict[str, Any]) -> list[tuple[str, ItemsRef]]:
    """The steps whose ``outputs.items`` the references in ``values`` read and which
    hold them by reference: ``steps.<id>.outputs`` whole, or ``.items`` and below.

    ``steps`` maps step ids to their results so far (their ``outputs``).
    """
    held: dict[str, ItemsRef] = {}
    for sid, result in steps.items():
        outputs = getattr(result, "outputs", None)
        if getattr(result, "items", None) is None or not isinstance(outputs, dict):
            continue  # only a for_each step (its counts in `items`) holds a list by reference
        ref = ItemsRef.of(outputs.get("items"))
        if ref is not None:
            held[sid] = ref
    if not held:  # the common case: no list held by reference, nothing to scan
        return []
    out: dict[str, ItemsRef] = {}
    for value in values:
        if value is None:
            continue
        try:
            refs = find_refs(value)
        except ReferenceError_:  # the step says so when it resolves the value
            continue
        for r in refs:
            target = r.step_id
            if target is None or target not in held or r.path[1] != "outputs":
                continue
            if len(r.path) == 2 or r.path[2] == "items":
                out[target] = held[target]
    return sorted(out.items())


__all__ = [
    "ItemsUnavailable",
    "load_items",
    "needs_items",
    "store_index",
    "store_items",
]
