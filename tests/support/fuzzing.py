"""Shared pieces of the fuzz suites: derandomized example generation and one
fuzzed pipeline run against the real server, judged by its terminal status and
its failed workflow tasks (a failed workflow task is retried forever)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from conftest import Stack
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from aiworker.schemas import names
from aiworker.schemas.outcomes import carried_result
from aiworker.schemas.pipeline import PipelineResult
from support import history

MAX_EXAMPLES = 40


def generate(strategy: st.SearchStrategy[Any], n: int = MAX_EXAMPLES) -> list[Any]:
    """``n`` derandomized examples of ``strategy`` (generated, not shrunk)."""
    out: list[Any] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        out.append(value)

    collect()
    return out


async def outcome(stack: Stack, raw: Any) -> tuple[str, PipelineResult | None, int]:
    """(terminal status or ``invalid_input``, result, failed workflow tasks) of one case."""
    handle = await stack.client.start_workflow(
        names.PIPELINE_WORKFLOW,
        raw,
        id=f"fuzz-{uuid.uuid4().hex[:12]}",
        task_queue=stack.pipelines_queue,
        result_type=PipelineResult,
    )
    try:
        result = await asyncio.wait_for(handle.result(), 90)
        status, out = result.status, result
    except WorkflowFailureError as e:
        # a run that did not succeed carries its result; one refused at start does not
        out = carried_result(e)
        cause = e.cause
        if out is not None:
            status = out.status
        elif isinstance(cause, ApplicationError):
            status = cause.type or ""
        else:
            status = type(cause).__name__
    except TimeoutError:
        status, out = "did not finish", None
    return status, out, await history.workflow_task_failures(handle)


def show(raw: Any) -> str:
    return json.dumps(raw, sort_keys=True)[:2000]
