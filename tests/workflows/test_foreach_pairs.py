"""A for_each whose parallelism one chunk would hold runs two chunks with half of
it each: as many items in flight, and one chunk's start and end
overlap the other's work."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import running_stack
from support.history import patch_ids
from support.standins import standin
from support.waiting import wait_until
from temporalio import activity
from temporalio.client import Client

from aiworker.config.settings import Settings


class PerChunk:
    """Counts the validator calls running, in all and per chunk workflow, until a
    gate opens."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total_peak = 0
        self.gate = asyncio.Event()

    def handler(self) -> Any:
        async def validate(request: dict[str, Any]) -> dict[str, Any]:
            chunk = activity.info().workflow_id or ""
            self.running[chunk] = self.running.get(chunk, 0) + 1
            self.peak[chunk] = max(self.peak.get(chunk, 0), self.running[chunk])
            self.total_peak = max(self.total_peak, sum(self.running.values()))
            try:
                await asyncio.wait_for(self.gate.wait(), 60)
            finally:
                self.running[chunk] -= 1
            return {"valid": True, "errors": []}

        return standin("validator", validate)


async def test_two_chunks_share_a_parallelism_one_chunk_would_hold(
    client: Client, settings: Settings
) -> None:
    pipeline = {
        "name": "pairs",
        "inputs": {"rows": [{"n": i} for i in range(12)]},
        "steps": [
            {
                "id": "each",
                "worker": "validator",
                "for_each": "${{ inputs.rows }}",
                "chunk_size": 4,  # three chunks; max_parallel 4 would fit one
                "max_parallel": 4,
                "input": {"data": "${{ item }}", "schema": {}},
            }
        ],
    }
    seen = PerChunk()
    async with running_stack(
        client, settings, replace_activities={"validator": seen.handler()}
    ) as stack:
        handle = await stack.start(pipeline)

        def two_chunks_of_two() -> bool:
            return sorted(n for n in seen.running.values() if n) == [2, 2]

        # held at the gate: two chunks with two items each, never one with four
        await wait_until(
            two_chunks_of_two,
            lambda: f"two chunks with two items in flight each: {seen.running}",
            timeout=60,
        )
        seen.gate.set()
        result = await asyncio.wait_for(handle.result(), 90)
        history = await handle.fetch_history()
    each = result.steps["each"]
    assert each.status == "succeeded" and each.outputs["succeeded"] == 12, each
    assert seen.total_peak == 4 and max(seen.peak.values()) == 2, (seen.total_peak, seen.peak)
    assert len(seen.peak) == 3  # every chunk ran
    assert patch_ids(history.events) == set()  # pinned: one way to run, no patch
