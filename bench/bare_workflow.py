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
    """The floor: the same DAG shape with raw activities and nothing else; local
    activities when the shape says ``local``."""

    @workflow.run
    async def run(self, shape: dict[str, Any]) -> dict[str, Any]:
        opts: dict[str, Any] = {"start_to_close_timeout": timedelta(seconds=10)}
        call = workflow.execute_local_activity if shape.get("local") else workflow.execute_activity
        if shape["kind"] == "fanout":
            await asyncio.gather(*(call("bench-noop", {"i": i}, **opts) for i in range(shape["n"])))
            await call("bench-noop", {"join": True}, **opts)
        else:
            for i in range(shape["n"]):
                await call("bench-noop", {"i": i}, **opts)
        return {"ok": True}
