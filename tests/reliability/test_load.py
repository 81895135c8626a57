"""1,000 pipelines submitted at once: every one reaches a terminal status, none is lost.

The pipelines are a mix: most succeed, some fail at a validation gate (the
workflow completes with status ``failed``), some have an invalid spec (the
workflow fails with ``invalid_input``). Counts are reconciled three ways:
Temporal's visibility (by the ``AiworkerPipeline`` search attribute and
``ExecutionStatus``), the ids visibility lists, and each workflow's result.

The burst runs on a dev server of its own (same flags as the session's), so
that the thousand histories it leaves behind do not slow the session server
for the tests that run after it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from conftest import running_stack
from support.waiting import wait_until
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.outcomes import carried_result
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import start_pipeline
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import local_server_extra_args, temporal_cli_path

N = 1000


@pytest_asyncio.fixture
async def own_client() -> AsyncIterator[Client]:
    """A client of a fresh in-memory dev server, stopped after the test."""
    env = await WorkflowEnvironment.start_local(
        data_converter=data_converter(None),
        dev_server_existing_path=temporal_cli_path(),
        dev_server_extra_args=local_server_extra_args(),
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


def kind_of(i: int) -> str:
    if i % 20 == 0:
        return "invalid"
    if i % 20 == 1:
        return "gate_fails"
    return "ok"


def pipeline(name: str, i: int) -> dict[str, Any]:
    kind = kind_of(i)
    schema: dict[str, Any] = {"type": "object", "required": ["i"]}
    if kind == "gate_fails":
        schema = {"type": "object", "required": ["missing"]}
    return {
        "name": name,
        "tenant": "load",
        "inputs": {"doc": {"i": i}},
        "steps": [
            {
                "id": "check",
                "worker": "no-such-worker" if kind == "invalid" else names.VALIDATOR,
                "input": {"data": "${{ inputs.doc }}", "schema": schema, "gate": True},
            }
        ],
        "output": {"i": "${{ inputs.doc.i }}"},
    }


async def count(client: Client, query: str) -> int:
    return (await client.count_workflows(query)).count


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_thousand_pipelines_at_once_all_terminal_none_lost(
    own_client: Client, settings: Settings
) -> None:
    async with running_stack(own_client, settings):
        await thousand_at_once(own_client, settings)


async def thousand_at_once(client: Client, settings: Settings) -> None:
    name = f"load-{uuid.uuid4().hex[:10]}"
    sa = f"{names.SA_PIPELINE} = '{name}'"
    handles = await asyncio.gather(
        *(start_pipeline(client, settings, pipeline(name, i), f"{name}-{i}") for i in range(N))
    )
    assert len({h.id for h in handles}) == N

    # Every pipeline leaves Running (bounded; a lost one would stay there).
    running = N

    async def drained() -> bool:
        nonlocal running
        running = await count(client, f"{sa} AND ExecutionStatus = 'Running'")
        return running == 0

    await wait_until(
        drained,
        lambda: f"every pipeline to leave Running ({running} still running)",
        timeout=240,
        interval=1,
    )

    expected = Counter(kind_of(i) for i in range(N))
    # a pipeline that did not succeed fails its workflow, as one refused at start does
    failed = expected["gate_fails"] + expected["invalid"]
    queries = {
        sa: N,
        f"{sa} AND ExecutionStatus = 'Completed'": expected["ok"],
        f"{sa} AND ExecutionStatus = 'Failed'": failed,
        f"{sa} AND {names.SA_STATUS} = 'succeeded'": expected["ok"],
        f"{sa} AND ExecutionStatus = 'Failed' AND {names.SA_STATUS} = 'failed'": failed,
        # An invalid spec fails the workflow and still records a terminal status.
        f"{sa} AND {names.SA_STATUS} = 'failed'": expected["gate_fails"] + expected["invalid"],
    }
    # Visibility is eventually consistent: wait (bounded) until it agrees.
    seen: dict[str, int] = {}

    async def agrees() -> bool:
        for q in queries:
            seen[q] = await count(client, q)
        return seen == queries

    await wait_until(
        agrees,
        lambda: (
            f"visibility to agree (seen, wanted): "
            f"{ {q: (seen.get(q), want) for q, want in queries.items()} }"
        ),
        timeout=60,
        interval=1,
    )

    listed = {wf.id async for wf in client.list_workflows(sa)}
    assert listed == {h.id for h in handles}

    # Each result: the right terminal status and its own output (nothing swapped).
    limit = asyncio.Semaphore(100)

    async def outcome(i: int) -> tuple[str, Any]:
        async with limit:
            h = client.get_workflow_handle(f"{name}-{i}", result_type=PipelineResult)
            try:
                r = await asyncio.wait_for(h.result(), 60)
            except WorkflowFailureError as e:
                assert isinstance(e.cause, ApplicationError)
                # a run that did not succeed carries its result; an invalid one does not
                carried = carried_result(e)
                if carried is None:
                    return "failed:" + str(e.cause.type), None
                r = carried
            return r.status, r.output.get("i")

    outcomes = await asyncio.gather(*(outcome(i) for i in range(N)))
    for i, (status, out) in enumerate(outcomes):
        want = {"ok": "succeeded", "gate_fails": "failed", "invalid": "failed:invalid_input"}
        assert status == want[kind_of(i)], (i, status)
        if kind_of(i) != "invalid":
            assert out == i
