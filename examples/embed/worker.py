"""A team's own Temporal worker that also runs aiworker's pipelines.

    python examples/embed/worker.py          # Temporal at localhost:7233

Its Worker polls aiworker's pipelines queue with the team's own workflow beside
aiworker's (``AiworkerPlugin`` brings aiworker's workflows, activities, data
converter, sandbox pass-throughs and interceptors). Workers on aiworker's other
queues (llm, scrape) run as usual (``aiworker worker``), or with more plugins
(``AiworkerPlugin(settings, queue="aiworker-llm")``).
"""

from __future__ import annotations

import asyncio

from greeting import Greeting, shout  # the script's folder is on sys.path
from temporalio.client import Client
from temporalio.worker import Worker

import aiworker
from aiworker.config.settings import Settings


async def main() -> None:
    settings = Settings()
    plugin = aiworker.AiworkerPlugin(settings)
    client = await Client.connect("localhost:7233", plugins=[plugin])
    worker = Worker(client, task_queue=plugin.task_queue, workflows=[Greeting], activities=[shout])
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
