"""A worker process killed with SIGKILL in the middle of an llm-agent's loop.

Turn 1 calls web-scrape on a loopback page that logs its hits; turn 2 holds
at the scripted model until the test has killed the worker process (the
scrape has finished by then: it is in the agent's history). A fresh process
takes over: Temporal times the lost turn-2 attempt out and retries it, the
agent workflow replays turn 1 and the scrape from history, and the run
completes. The page's hit log proves the finished tool call was not repeated.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest
from fixtures.agent_model import Turn, call, models_file, start_scripted_model
from support.loopback import Exchange, Loopback
from support.procs import WorkerProcess, worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import start_pipeline

TURN_TIMEOUT_SECONDS = 3  # start-to-close = 3 + 5 s grace: how long the lost turn waits


def worker(env: dict[str, str], log: Path) -> WorkerProcess:
    return WorkerProcess([sys.executable, "-m", "aiworker.workers.cli.main", "worker"], env, log)


@pytest.mark.timeout(180)
async def test_worker_sigkilled_mid_loop_completes_without_repeating_a_tool_call(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    hits: Counter[str] = Counter()
    lock = threading.Lock()

    def page(ex: Exchange) -> None:
        with lock:
            hits[ex.path] += 1
        if ex.path == "/kettle":
            ex.send(200, b"<html><body><span class='price'>39.90</span></body></html>")
        else:
            ex.send(404, b"")

    site = Loopback(page).start()
    model = start_scripted_model()
    name = f"agent-{uuid.uuid4().hex[:8]}"
    release = threading.Event()
    scrape = {
        "url": site.base_url + "/kettle",
        "extraction_spec": {"fields": {"price": {"selector": ".price", "type": "number"}}},
    }
    model.script(name, call(("web-scrape", scrape)), Turn(text="39.90", hold=release))
    env = worker_env(client, settings, tmp_path / "data")
    env["AIWORKER_MODELS_FILE"] = str(models_file(model, tmp_path / "models.json", name))
    pipeline = {
        "name": "agent-kill",
        "tenant": "acme",
        "steps": [
            {
                "id": "agent",
                "worker": "llm-agent",
                "input": {
                    "prompt": "What does the kettle cost?",
                    "model": "openai-agent",
                    "tools": ["web-scrape"],
                    "turn_timeout_seconds": TURN_TIMEOUT_SECONDS,
                },
            }
        ],
        "output": {"answer": "${{ steps.agent.outputs.answer }}"},
    }
    first = worker(env, tmp_path / "worker-1.log")
    second: WorkerProcess | None = None
    try:
        started = await start_pipeline(client, settings, pipeline)
        handle = client.get_workflow_handle(started.id, result_type=PipelineResult)
        await wait_until(
            lambda: any(r.turn == 2 for r in model.seen(name)),
            "turn 2 to reach the model (the scrape finished)",
            timeout=90,
        )
        assert hits["/kettle"] == 1
        assert first.kill() == -signal.SIGKILL
        release.set()  # the lost attempt's reply goes nowhere; the retry answers at once
        second = worker(env, tmp_path / "worker-2.log")
        try:
            result = await asyncio.wait_for(handle.result(), 120)
        except TimeoutError:
            raise AssertionError(f"pipeline did not finish:\n{second.output()}") from None
        assert second.terminate() == 0, second.output()
    finally:
        first.close()
        if second is not None:
            second.close()
        model.stop()
        site.stop()

    step = result.steps["agent"]
    assert result.status == "succeeded", step
    assert result.output == {"answer": "39.90"}
    assert step.outputs["calls"] == {"web-scrape": 1}
    # the finished tool call was not repeated: one page fetch in all
    assert hits["/kettle"] == 1
    # turn 2 reached the model twice (the lost attempt and its retry), turn 1 once
    assert [r.turn for r in model.seen(name)] == [1, 2, 2]
    child = client.get_workflow_handle(f"{handle.id}/agent")
    events = (await child.fetch_history()).events
    scheduled = [
        json.loads(e.user_metadata.summary.data)
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == ["agent turn 1", "agent turn 1 web-scrape", "agent turn 2"]
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts == [1, 1, 2]
