"""A large for_each's item outputs by reference: stored by the leaf chunks,
loaded where a ``${{ }}`` reference needs the list.

Two local activities beside the pipeline workflows (the pipelines queue):

- ``foreach-store-items``: a leaf chunk's succeeded items' outputs, as one
  part (a JSON object ``{"kind": "aiworker.items.part", "items": [[index,
  outputs], ...]}``) in the tenant's artifact store. Content-addressed, so a
  retried attempt or a replayed task stores nothing new.
- ``foreach-load-items``: every part of an :class:`ItemsRef`, applied in
  order, as the step's list (``null`` where an item failed).

The workflow cannot do I/O, and the SDK's external payload storage hides its
references from workflow code (a child's result arrives decoded), so the
parent could not keep a chunk's outputs out of its memory through it; these
two activities put the data in the store the project already has and give the
workflow a reference it can hold, pass on and return.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio import activity

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import InvalidInputError, WorkerError
from aiworker.schemas import names
from aiworker.schemas.pipeline import ItemsRef, LoadedItems, LoadItems, StoreItems
from aiworker.schemas.protocol import ArtifactRef

PART_KIND = "aiworker.items.part"
PART_MEDIA_TYPE = "application/json"


def encode_part(items: list[tuple[int, Any]]) -> bytes:
    """One stored part: ``(index, outputs)`` pairs as compact JSON."""
    doc = {"kind": PART_KIND, "items": [[i, out] for i, out in items]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def apply_part(data: bytes, into: list[Any], uri: str) -> None:
    """Write a stored part's outputs into ``into`` by index.

    Raises:
        InvalidInputError: the bytes are not a part of a list this long.
    """
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise InvalidInputError(f"items part {uri} is not JSON: {e}", field="items") from None
    pairs = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == PART_KIND else None
    if not isinstance(pairs, list):
        raise InvalidInputError(f"{uri} is not a for_each items part", field="items")
    for pair in pairs:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], int)
            or not 0 <= pair[0] < len(into)
        ):
            raise InvalidInputError(
                f"items part {uri}: an entry is not [index, outputs] within {len(into)} items",
                field="items",
            )
        into[pair[0]] = pair[1]


async def load_items(store: ArtifactStore, tenant: str, ref: ItemsRef) -> list[Any]:
    """The list ``ref`` stands for, read from ``store`` as ``tenant``."""
    out: list[Any] = [None] * ref.count
    for part in ref.parts:
        apply_part(await store.get(tenant, part), out, part.uri)
    return out


class ItemsActivities:
    """The store and load activities over one artifact store (the ``artifact_store`` tool)."""

    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    @activity.defn(name=names.STORE_ITEMS)
    async def store(self, call: StoreItems) -> ArtifactRef:
        """Store a leaf chunk's item outputs as one part; its reference."""
        try:
            return await self._store.put(call.tenant, encode_part(call.items), PART_MEDIA_TYPE)
        except WorkerError as e:
            raise e.to_application_error(names.STORE_ITEMS) from None

    @activity.defn(name=names.LOAD_ITEMS)
    async def load(self, call: LoadItems) -> LoadedItems:
        """Every item's outputs of a for_each held by reference (null where one failed)."""
        try:
            return LoadedItems(items=await load_items(self._store, call.tenant, call.ref))
        except WorkerError as e:
            raise e.to_application_error(names.LOAD_ITEMS) from None


__all__ = ["PART_KIND", "ItemsActivities", "apply_part", "encode_part", "load_items"]
