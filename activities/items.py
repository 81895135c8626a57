"""A large for_each's item outputs by reference: stored by the leaf chunks,
loaded where a ``${{ }}`` reference needs the list.

Two local activities beside the pipeline workflows (the pipelines queue):

- ``foreach-store-items``: a leaf chunk's succeeded items' outputs, as one
  part (a JSON object ``{"kind": "aiworker.items.part", "items": [[index,
  outputs], ...]}``) in the tenant's artifact store. Content-addressed, so a
  retried attempt or a replayed task stores nothing new.
  A group chunk (one that split its items into child chunks) stores its
  children's part references as one index part (``{"kind":
  "aiworker.items.index", "parts": [ArtifactRef, ...]}``), so the pipeline
  holds one reference per group, at most 32, whatever the item count.
- ``foreach-load-items``: every part of an :class:`ItemsRef` (index parts
  expanded in place), applied in order, as the step's list (``null`` where an
  item failed).

The workflow cannot do I/O, and the SDK's external payload storage hides its
references from workflow code (a child's result arrives decoded), so the
parent could not keep a chunk's outputs out of its memory through it; these
two activities put the data in the store the project already has and give the
workflow a reference it can hold, pass on and return.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from temporalio import activity

from aiworker.activities.artifacts import ArtifactStore
from aiworker.activities.errors import InvalidInputError, WorkerError
from aiworker.schemas import names
from aiworker.schemas.pipeline import ItemsRef, LoadedItems, LoadItems, StoreItems
from aiworker.schemas.protocol import ArtifactRef

PART_KIND = "aiworker.items.part"
INDEX_KIND = "aiworker.items.index"
# Index parts inside index parts: the chunk tree's depth (4 at the hard cap of
# 1,000,000 items), with room; deeper is not something the engine wrote.
MAX_INDEX_DEPTH = 8
PART_MEDIA_TYPE = "application/json"


def encode_part(items: list[tuple[int, Any]]) -> bytes:
    """One stored part: ``(index, outputs)`` pairs as compact JSON."""
    doc = {"kind": PART_KIND, "items": [[i, out] for i, out in items]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def encode_index(parts: list[ArtifactRef]) -> bytes:
    """One stored index part: the references of other parts, in order."""
    doc = {"kind": INDEX_KIND, "parts": [p.model_dump(mode="json") for p in parts]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _decode(data: bytes, uri: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise InvalidInputError(f"items part {uri} is not JSON: {e}", field="items") from None
    if not isinstance(doc, dict) or doc.get("kind") not in (PART_KIND, INDEX_KIND):
        raise InvalidInputError(f"{uri} is not a for_each items part", field="items")
    return doc


def _apply_part(doc: dict[str, Any], into: list[Any], uri: str) -> None:
    """Write a decoded part's outputs into ``into`` by index.

    Raises:
        InvalidInputError: the part is not one of a list this long.
    """
    pairs = doc.get("items")
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
    """The list ``ref`` stands for, read from ``store`` as ``tenant``: its parts in
    order, an index part's parts in its place."""
    out: list[Any] = [None] * ref.count
    # (part, depth) in the order to apply them: a stack, the next part on top
    todo = [(p, 0) for p in reversed(ref.parts)]
    while todo:
        part, depth = todo.pop()
        try:
            inner = _read_part(await store.get(tenant, part), part.uri, depth, out)
        except WorkerError as e:
            # the part being read, also one inside an index part (the client names it)
            e.context.setdefault("uri", part.uri)
            raise
        todo.extend((p, depth + 1) for p in reversed(inner))
    return out


def _read_part(data: bytes, uri: str, depth: int, into: list[Any]) -> list[ArtifactRef]:
    """Apply one stored part to ``into``; an index part's parts, to read next."""
    doc = _decode(data, uri)
    if doc["kind"] == PART_KIND:
        _apply_part(doc, into, uri)
        return []
    if depth >= MAX_INDEX_DEPTH:
        raise InvalidInputError(
            f"items index {uri} nests over {MAX_INDEX_DEPTH} levels", field="items"
        )
    try:
        return [ArtifactRef.model_validate(p) for p in doc.get("parts") or []]
    except ValidationError:
        raise InvalidInputError(f"items index {uri} is malformed", field="items") from None


class ItemsActivities:
    """The store and load activities over one artifact store (the ``artifact_store`` tool)."""

    def __init__(self, store: ArtifactStore) -> None:
        self._store = store

    @activity.defn(name=names.STORE_ITEMS)
    async def store(self, call: StoreItems) -> ArtifactRef:
        """Store a leaf chunk's item outputs (or a group's part references) as
        one part; its reference."""
        data = encode_index(call.parts) if call.parts else encode_part(call.items)
        try:
            return await self._store.put(call.tenant, data, PART_MEDIA_TYPE)
        except WorkerError as e:
            raise e.to_application_error(names.STORE_ITEMS) from None

    @activity.defn(name=names.LOAD_ITEMS)
    async def load(self, call: LoadItems) -> LoadedItems:
        """Every item's outputs of a for_each held by reference (null where one failed)."""
        try:
            return LoadedItems(items=await load_items(self._store, call.tenant, call.ref))
        except WorkerError as e:
            raise e.to_application_error(names.LOAD_ITEMS) from None


__all__ = [
    "INDEX_KIND",
    "PART_KIND",
    "ItemsActivities",
    "encode_index",
    "encode_part",
    "load_items",
]
