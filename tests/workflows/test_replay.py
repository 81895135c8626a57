"""Replay committed histories: a change that breaks determinism fails here.

The histories come from ``record_histories.py``; re-record them only with a
deliberate, versioned workflow change (``workflow.patched`` or a new type).
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
    assert {"dag", "foreach", "foreach-chunk", "loop", "review"} <= names


def _load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text("utf-8"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path) -> None:
    history = _load(path)
    replayer = Replayer(
        workflows=[PipelineWorkflow, PipelineForEachWorkflow],
        data_converter=data_converter(None),
    )
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
