"""A user's own workflow and activity (test_plugin): only temporalio, as in the sandbox."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="user_shout")
async def user_shout(text: str) -> str:
    return text.upper() + "!"


@workflow.defn(name="UserGreeting")
class UserGreeting:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            user_shout, f"hello {name}", start_to_close_timeout=timedelta(seconds=10)
        )
