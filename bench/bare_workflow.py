"""The baseline: a bare temporalio workflow with no-op activities."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow


@activity.defn(name="bench-noop")
async def noop(payload: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


@workflow.defn(name="BareBenchWorkflow")
class BareBenchWorkflow:
    """The floor: the same DAG shape with raw activities and nothing else."""

    @workflow.run
    async def run(self, shape: dict[str, Any]) -> dict[str, Any]:
        opts: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=10)}
        if shape["kind"] == "fanout":
            await asyncio.gather(
                *(
                    workflow.execute_activity("bench-noop", {"i": i}, **opts)
                    for i in range(shape["n"])
                )
            )
            await workflow.execute_activity("bench-noop", {"join": True}, **opts)
        else:
            for i in range(shape["n"]):
                await workflow.execute_activity("bench-noop", {"i": i}, **opts)
        return {"ok": True}
