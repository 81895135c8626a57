"""Pipeline checks cost bounded time in every process (issue 31, item 3): the
17,000-pattern pipeline is refused naming the cap by ``aiworker check``, ``aiworker
run``, the SDK client and the workflow, and no workflow task fails: what compiles
runs in the ``run-config`` local activity, never in a workflow task."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import Stack
from support.check_load import heavy_under_caps, many_patterns
from support.history import events, patch_ids, workflow_task_failures
from support.pipelines import refused
from temporalio.api.enums.v1 import EventType

from aiworker.config.catalog import load_specs
from aiworker.schemas.pipeline_check import PipelineSpecError, parse_pipeline
from aiworker.workers.client.client import PipelineClient

AIWORKER = str(Path(sys.executable).parent / "aiworker")
CAP = "the cap is 256 (MAX_PIPELINE_PATTERNS)"


def test_the_check_refuses_17000_patterns_naming_the_cap() -> None:
    with pytest.raises(PipelineSpecError) as e:
        parse_pipeline(many_patterns(), load_specs())
    assert any("17000 distinct patterns" in p and CAP in p for p in e.value.problems)


@pytest.mark.parametrize("command", ["check", "run"])
def test_the_cli_refuses_17000_patterns_naming_the_cap(tmp_path: Path, command: str) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(many_patterns()))
    # no Temporal: the file is refused before anything connects
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    proc = subprocess.run(
        [AIWORKER, command, str(f)],
        env={**base, "TEMPORAL_ADDRESS": "127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert CAP in proc.stdout + proc.stderr


async def test_the_client_refuses_17000_patterns_and_starts_nothing(stack: Stack) -> None:
    with pytest.raises(PipelineSpecError) as e:
        await PipelineClient(stack.client, stack.settings).start(many_patterns())
    assert any(CAP in p for p in e.value.problems)


async def test_the_workflow_refuses_17000_patterns_without_a_failed_task(stack: Stack) -> None:
    # Before: the check in the workflow task tripped the deadlock detector and the
    # task was retried for ever, the run queued; the bounded wait fails that.
    cause, handle = await asyncio.wait_for(refused(stack, many_patterns()), timeout=120)
    assert cause.type == "invalid_input"
    assert CAP in cause.message
    assert await workflow_task_failures(handle) == 0


async def test_what_compiles_runs_in_the_run_config_activity(stack: Stack) -> None:
    # under every cap, but as much to compile as the caps allow, and one pattern
    # RE2 refuses: the run-config local activity finds it, the workflow task never
    # compiles it
    pipeline = heavy_under_caps(uuid.uuid4().hex, bad_pattern="(a)\\1")
    cause, handle = await asyncio.wait_for(refused(stack, pipeline), timeout=120)
    assert cause.type == "invalid_input"
    assert "step 'v99': field 'input.schema': pattern \"(a)\\\\1\" is not supported" in (
        cause.message
    )
    history = await events(handle)
    assert not [e for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert patch_ids(history) == set()  # pinned: one way to run, no patch
