"""The user's own workflow and activity (imports only temporalio: the sandbox re-imports it)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def shout(text: str) -> str:
    return text.upper() + "!"


@workflow.defn
class Greeting:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            shout, f"hello {name}", start_to_close_timeout=timedelta(seconds=10)
        )
