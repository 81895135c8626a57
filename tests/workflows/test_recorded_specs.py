"""A run records the specs of the workers it names and decides from them (issue #28).

On the real dev server: a pipeline starts on a worker stack whose catalog has
one set of specs, waits in its first step (an activity this test holds), and
the stack is stopped. A new stack comes up whose catalog changed what the run
still has to call: another task queue, timeout and retries for one worker, the
other ``execution`` for another, and a worker dropped altogether. The run ends
as its recorded specs say, with no workflow-task failure; its history replays
with no catalog installed at all.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from conftest import Stack, installed_workers, running_stack
from support import history
from support.standins import standin
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer
from temporalio.worker import Worker as TemporalWorker

from aiworker.activities.run_config import RunConfigActivities
from aiworker.config import catalog
from aiworker.config.catalog import load_specs
from aiworker.config.settings import Settings
from aiworker.schemas.options import activity_options
from aiworker.schemas.pipeline import PipelineResult
from aiworker.schemas.spec import WorkerSpec
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow

HOLD, ECHO, GONE = "rec-hold", "rec-echo", "rec-gone"
# The first test's run is committed as a history that test_replay.py replays (with
# the built-ins only); AIWORKER_RECORD_HISTORIES=1 writes it again.
HISTORY = Path(__file__).parent / "histories" / "recorded-specs.json"
WORKFLOW_ID = "replay-recorded-specs"  # its for_each chunks' ids derive from it


def external(worker_id: str, queue: str, timeout: float, attempts: int, key: str) -> dict[str, Any]:
    """An external worker's spec whose outputs must hold the integer ``key``."""
    return {
        "worker_id": worker_id,
        "version": "1.0.0",
        "purpose": f"{worker_id}: a worker this test serves",
        "task_queue": queue,
        "implementation": {"kind": "external"},
        "input_schema": {"type": "object"},
        "output_schema": {
            "type": "object",
            "required": [key],
            "properties": {key: {"type": "integer"}},
        },
        "constraints": {"timeout_seconds": timeout},
        "retries": {"max_attempts": attempts},
    }


# Before the deploy: echo on rec-old (30 s, 3 attempts, outputs {"n": int}).
BEFORE = [
    external(HOLD, "rec-hold", 60, 1, "n"),
    external(ECHO, "rec-old", 30, 3, "n"),
    external(GONE, "rec-gone", 20, 1, "n"),
]
# After: echo moved to rec-new with 7 s and one attempt, and its outputs are {"m": int};
# rec-gone is no longer in the catalog.
AFTER = [external(HOLD, "rec-hold", 60, 1, "n"), external(ECHO, "rec-new", 7, 1, "m")]


def spec_dir(folder: Path, docs: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (folder / f"{doc['worker_id']}.json").write_text(json.dumps(doc), "utf-8")
    return folder


PIPELINE: dict[str, Any] = {
    "name": "recorded",
    "tenant": "acme",
    "steps": [
        {"id": "hold", "worker": HOLD, "input": {}},
        {"id": "echo", "worker": ECHO, "depends_on": ["hold"], "input": {"x": 1}},
        {"id": "gone", "worker": GONE, "depends_on": ["hold"], "input": {}},
        {"id": "up", "worker": "upper-local", "depends_on": ["hold"], "input": {"text": "abc"}},
        {
            "id": "each",
            "worker": ECHO,
            "depends_on": ["hold"],
            "for_each": [1, 2],
            "input": {"x": "${{ item }}"},
        },
    ],
    "output": {"up": "${{ steps.up.outputs.text }}"},
}


class Served:
    """The external workers, served by this test on every queue either catalog names:
    each call's worker, task queue and start-to-close timeout, and a held first step."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, timedelta | None]] = []
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    def activity(self, worker_id: str) -> Any:
        async def handle(request: dict[str, Any]) -> dict[str, Any]:
            info = activity.info()
            self.calls.append((worker_id, info.task_queue, info.start_to_close_timeout))
            if worker_id == HOLD:
                self.held.set()
                await self.release.wait()
            return {"n": 1}

        return standin(worker_id, handle)

    @asynccontextmanager
    async def serving(self, client: Client, settings: Settings) -> AsyncIterator[None]:
        queues = {
            "rec-hold": [HOLD],
            "rec-old": [ECHO],
            "rec-new": [ECHO],
            "rec-gone": [GONE],
        }
        workers = [
            TemporalWorker(
                client,
                task_queue=settings.queue(queue),
                activities=[self.activity(w) for w in ids],
            )
            for queue, ids in queues.items()
        ]
        async with AsyncExitStack() as stack:
            for w in workers:
                await stack.enter_async_context(w)
            yield


@asynccontextmanager
async def deployed(
    client: Client, settings: Settings, specs: Path, module: str
) -> AsyncIterator[Stack]:
    """A worker stack whose catalog is the spec files in ``specs`` and ``module``."""
    s = settings.model_copy(update={"worker_specs": (specs,), "worker_modules": (module,)})
    with installed_workers(s, entry_points=()) as ws:
        async with running_stack(client, s, workers=ws) as stack:
            yield stack


async def test_a_run_ends_as_its_recorded_specs_say_after_a_deploy_changed_them(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    before, after = spec_dir(tmp_path / "v1", BEFORE), spec_dir(tmp_path / "v2", AFTER)
    served = Served()
    async with served.serving(client, settings):
        async with deployed(client, settings, before, "support.local_workers") as v1:
            handle = await v1.start(PIPELINE, id=WORKFLOW_ID)
            await asyncio.wait_for(served.held.wait(), 30)
        # v1 is stopped with the run in its first step; v2 knows other specs
        async with deployed(client, settings, after, "support.recorded_workers"):
            assert "rec-gone" not in catalog.current_specs()
            assert catalog.current_specs()["upper-local"].execution == "activity"
            served.release.set()
            result: PipelineResult = await asyncio.wait_for(handle.result(), 60)

    assert result.status == "succeeded", result.steps
    assert await history.workflow_task_failures(handle) == 0
    # echo: the recorded queue, timeout and retries (not rec-new, 7 s, 1 attempt),
    # and its outputs checked against the recorded output schema ({"n": int})
    recorded_echo = WorkerSpec.model_validate(BEFORE[1])
    options = activity_options(recorded_echo, queue_suffix=settings.task_queue_suffix)
    echo_calls = [c for c in served.calls if c[0] == ECHO]
    assert echo_calls == [(ECHO, settings.queue("rec-old"), options["start_to_close_timeout"])] * 3
    assert result.steps["echo"].outputs == {"n": 1}
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in await history.events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    echo = [a for a in scheduled if a.activity_type.name == ECHO]
    assert [a.retry_policy.maximum_attempts for a in echo] == [3]
    # the dropped worker is called as recorded, on its queue
    assert [c[:2] for c in served.calls if c[0] == GONE] == [(GONE, settings.queue("rec-gone"))]
    assert result.steps["gone"].status == "succeeded"
    # upper-local: a local activity, as recorded (v2 says "activity")
    assert result.output == {"up": "ABC"}
    assert await history.local_activities(handle) == ["upper-local"]
    assert "upper-local" not in [a.activity_type.name for a in scheduled]
    # the for_each chunk took the spec from its parent: both items on rec-old
    assert result.steps["each"].items == {"total": 2, "succeeded": 2, "failed": 0}

    # The history replays with no catalog installed (the built-ins only): the run
    # never read the process's catalog.
    catalog.uninstall()
    assert ECHO not in catalog.current_specs()
    replayer = Replayer(
        workflows=[PipelineWorkflow, PipelineForEachWorkflow], data_converter=data_converter(None)
    )
    recorded_history = await handle.fetch_history()
    replayed = await replayer.replay_workflow(recorded_history)
    assert replayed.replay_failure is None
    # and so does its for_each chunk, which took its worker's spec from its input
    chunk = client.get_workflow_handle(f"{WORKFLOW_ID}/each/0")
    replayed = await replayer.replay_workflow(await chunk.fetch_history())
    assert replayed.replay_failure is None
    if os.environ.get("AIWORKER_RECORD_HISTORIES"):
        HISTORY.write_text(recorded_history.to_json(), "utf-8")


async def test_a_pipeline_naming_an_unknown_worker_fails_at_start_naming_it(
    stack: Stack,
) -> None:
    """Started straight through Temporal (no client check): the run's plan knows no
    such worker, so the run fails invalid_input naming it and the known workers,
    before any step."""
    pipeline = {
        "name": "unknown",
        "steps": [
            {"id": "a", "worker": "validator", "input": {"data": 1, "schema": {}}},
            {"id": "b", "worker": "no-such-worker", "depends_on": ["a"], "input": {}},
        ],
    }
    handle = await stack.start(pipeline)
    try:
        await handle.result()
    except WorkflowFailureError as e:
        err = e.cause
    else:
        raise AssertionError("the pipeline ran")
    assert isinstance(err, ApplicationError)
    assert err.type == "invalid_input" and err.non_retryable
    known = ", ".join(sorted(load_specs()))
    assert f"step 'b': field 'worker': unknown worker 'no-such-worker' (known: {known})" in str(
        err.message
    )
    assert await history.workflow_task_failures(handle) == 0
    assert await history.called_workers(handle) == []
    desc = await handle.describe()
    assert desc.status is not None and desc.status.name == "FAILED"


async def test_the_plan_records_only_the_named_specs_without_examples(
    settings: Settings,
) -> None:
    specs = load_specs()
    limiter = RunConfigActivities(settings, specs, local=["validator"])
    found = limiter.specs_for(["validator", "no-such-worker", "validator"])
    assert list(found) == ["validator"]
    assert specs["validator"].examples and found["validator"].examples == []
    assert (
        found["validator"].model_copy(update={"examples": specs["validator"].examples})
        == (specs["validator"])
    )
    assert "no-such-worker" not in limiter.known_workers()
    assert limiter.known_workers() == sorted(specs)
