"""Replay committed histories: a change that breaks determinism fails here.

The histories come from ``record_histories.py``; re-record them only with a
deliberate, versioned workflow change (``workflow.patched`` or a new type).
``limited*``, ``review-cancelled`` and ``slot-expired`` were recorded with the
code before the pipeline workflow was split into modules (commit 8a3581a): rate
and concurrency permits for a pipeline, a step and for_each items, a pipeline
slot that expires at the deadline, and a cancellation during review. Their
permit tickets carry the workflow id they ran under, so they replay under it.
``recorded-specs`` is a run that recorded its workers' specs (``Plan.specs``,
the ``pipeline-recorded-specs`` patch) on a catalog of spec files and a plugin
this replay never installs; ``test_recorded_specs.py`` records it
(``AIWORKER_RECORD_HISTORIES=1``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from aiworker.workers.temporal_client import data_converter
from aiworker.workflows.foreach import PipelineForEachWorkflow
from aiworker.workflows.pipeline import PipelineWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_committed() -> None:
    names = {p.stem for p in HISTORIES}
    shapes = {"dag", "foreach", "foreach-chunk", "loop", "review", "recorded-specs"}
    assert shapes | WORKFLOW_IDS.keys() <= names


# Histories whose commands depend on their own workflow id (permit tickets).
WORKFLOW_IDS = {
    "limited": "x-limited",
    "limited-chunk0": "x-limited/each/0",
    "limited-chunk1": "x-limited/each/1",
    "review-cancelled": "x-holder",
    "slot-expired": "x-waiter",
}


def _load(path: Path) -> WorkflowHistory:
    workflow_id = WORKFLOW_IDS.get(path.stem, f"replay-{path.stem}")
    return WorkflowHistory.from_json(workflow_id, path.read_text("utf-8"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    history = _load(path)
    replayer = Replayer(
        workflows=[PipelineWorkflow, PipelineForEachWorkflow],
        data_converter=data_converter(None),
    )
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
