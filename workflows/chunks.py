"""How a for_each's items split into chunk workflows: a tree of bounded width.

A leaf chunk runs at most ``chunk_size`` items. A workflow (the pipeline, or a
chunk with more than ``chunk_size`` items) starts at most :data:`FANOUT`
children: ``ceil(items / chunk_size)`` leaf chunks when that is at most
:data:`FANOUT`, otherwise :data:`FANOUT` (or fewer) group chunks of whole
leaves, each of which splits again. So every history holds a bounded number of
children (100,000 items in chunks of 100: the pipeline starts 32 groups, each
group 32 leaves), never one event per item or per leaf chunk, and the items'
inputs and results travel between the levels by reference
(``SPILL_METADATA``).

The step's concurrency holds across the tree: ``slots`` leaf chunks run at
once under a workflow; its running children share them. Pure and
deterministic: used by workflow code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from aiworker.schemas.pipeline import ChunkAllowance

FANOUT = 32
"""Children one workflow starts for a for_each (the width of the tree)."""


@dataclass(frozen=True)
class Split:
    """How one workflow's items split into children.

    Attributes:
        size: items per child (the last child may have fewer).
        at_once: children running at the same time.
        child_slots: leaf chunks each child may run at once.
    """

    size: int
    at_once: int
    child_slots: int

    def ranges(self, items: int) -> list[range]:
        """The children's item positions (``0 <= i < items``), in order."""
        return [range(i, min(items, i + self.size)) for i in range(0, items, self.size)]


def leaves(items: int, chunk_size: int) -> int:
    """Leaf chunks of ``items`` items."""
    return math.ceil(items / chunk_size)


def split(items: int, chunk_size: int, slots: int) -> Split:
    """The split of ``items`` items with ``slots`` leaf chunks at once.

    Args:
        items: the items under this workflow.
        chunk_size: items per leaf chunk.
        slots: leaf chunks that may run at once under this workflow.
    """
    n = leaves(items, chunk_size)
    per = math.ceil(n / FANOUT) if n > FANOUT else 1
    children = math.ceil(n / per)
    at_once = max(1, min(children, slots))
    return Split(size=per * chunk_size, at_once=at_once, child_slots=max(1, slots // at_once))


def share(whole: ChunkAllowance, items: int, of: int) -> ChunkAllowance:
    """A child's share of ``whole``: ``items`` of its ``of`` items (the deadline as it is)."""

    def part(cap: int | None) -> int | None:
        return None if cap is None else (cap * items) // max(1, of)

    cost = whole.max_cost_usd
    return ChunkAllowance(
        max_tokens=part(whole.max_tokens),
        max_external_calls=part(whole.max_external_calls),
        deadline=whole.deadline,
        max_cost_usd=None if cost is None else cost * items / max(1, of),
    )


__all__ = ["FANOUT", "Split", "leaves", "share", "split"]
