"""The recorded-call reader of evals (workers/evals/recorded.py) on the real dev
server: runs of ``examples/prompts/classify-ticket.json`` against a loopback
model that answers what the test scripts, one of them escalated and approved
with corrected outputs, one rejected (a failed workflow execution, whose
result is read from its failure), read back by worker, tenant, pipeline,
status and version."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest_asyncio
from conftest import Stack, installed_workers, running_stack
from fixtures.llm_fakes import FakeProvider, fake  # noqa: F401  (module fixture)
from prometheus_client import CollectorRegistry
from support.pipelines import failed_result
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.workers.client.client import send_review
from aiworker.workers.evals.recorded import CallQuery, RecordedCall, recorded_calls
from aiworker.workers.process.resources import build_language_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
WORKER = "classify-ticket"
GOOD = {"category": "bug", "priority": "urgent", "summary": "Checkout fails with 500 for all."}
FIXED = {"category": "billing", "priority": "high", "summary": "Charged twice."}


def triage(subject: str, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": "acme",
        "inputs": {"subject": subject, "body": "It broke."},
        "steps": [
            {
                "id": "triage",
                "worker": WORKER,
                "input": {"subject": "${{ inputs.subject }}", "body": "${{ inputs.body }}"},
                "on_failure": "escalate",
            }
        ],
        "output": {},
    }


@pytest_asyncio.fixture
async def scripted(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> AsyncIterator[tuple[Stack, str]]:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(EXAMPLES / f"{WORKER}.json", specs)
    model = f"scripted@{uuid.uuid4().hex[:10]}"
    s = Settings.model_validate(
        settings.model_dump()
        | {"worker_specs": (specs,), "llm_base_url": fake.root + "/v1", "llm_model": model}
    )
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}) as st:
                yield st, model
    finally:
        await lm.aclose()


async def read(client: Client, query: CallQuery) -> list[RecordedCall]:
    return [c async for c in recorded_calls(client, query, page_size=2)]


async def test_recorded_calls_are_read_back_with_input_output_usage_and_review(
    client: Client, scripted: tuple[Stack, str], fake: FakeProvider
) -> None:
    stack, model = scripted
    name = f"triage-{uuid.uuid4().hex[:8]}"
    # the first reply fits the contract, the second does not (invalid_output, escalated)
    fake.script(model, json.dumps(GOOD), "not json at all")
    first = await stack.start(triage("Checkout is down", name))
    assert (await first.result()).status == "succeeded"
    second = await stack.start(triage("Charged twice", name))

    async def awaiting() -> bool:
        d = await second.describe()
        sa = d.typed_search_attributes
        return any(p.value == "awaiting_review" for p in sa)

    await wait_until(awaiting, "the second run to await review")
    await send_review(client, second.id, "approve", outputs=FIXED, reviewer="qa")
    assert (await second.result()).status == "succeeded"

    query = CallQuery(worker=WORKER, tenant="acme", pipeline=name)

    async def both() -> list[RecordedCall]:
        calls = await read(client, query)
        return calls if len(calls) == 2 else []

    calls = await wait_until(both, "both runs in visibility")
    # newest run first
    failed, ok = calls
    assert (ok.workflow_id, failed.workflow_id) == (first.id, second.id)
    assert ok.input == {"subject": "Checkout is down", "body": "It broke."}
    assert ok.output == GOOD and ok.status == "succeeded" and ok.error_code is None
    assert (ok.pipeline, ok.tenant, ok.step_id, ok.worker) == (name, "acme", "triage", WORKER)
    assert ok.version == "1" and ok.model == "default"
    assert ok.usage["output_tokens"] > 0 and ok.external_calls == 1
    assert ok.cost_usd == 0.0 and ok.duration_ms > 0 and ok.started_at.endswith("Z")
    assert ok.review is None and ok.scheduled_event_id > 0

    assert failed.status == "failed" and failed.error_code == "invalid_output"
    assert failed.output is None and failed.input["subject"] == "Charged twice"
    assert failed.review is not None
    assert failed.review["decision"] == "approve" and failed.review["outputs"] == FIXED
    assert failed.review["reviewer"] == "qa"

    # the filters
    only_failed = await read(client, CallQuery(worker=WORKER, pipeline=name, status="failed"))
    assert [c.workflow_id for c in only_failed] == [second.id]
    by_code = await read(
        client, CallQuery(worker=WORKER, pipeline=name, error_code="invalid_output")
    )
    assert [c.workflow_id for c in by_code] == [second.id]
    assert await read(client, CallQuery(worker=WORKER, pipeline=name, version="2")) == []
    assert await read(client, CallQuery(worker=WORKER, pipeline=name, tenant="other")) == []
    assert await read(client, CallQuery(worker="validator", pipeline=name)) == []
    limited = await read(client, CallQuery(worker=WORKER, pipeline=name, limit=1))
    assert [c.workflow_id for c in limited] == [second.id]
    recent = await read(client, CallQuery(worker=WORKER, pipeline=name, since=timedelta(hours=1)))
    assert len(recent) == 2


async def test_a_run_that_failed_its_workflow_gives_its_review_from_the_failure(
    client: Client, scripted: tuple[Stack, str], fake: FakeProvider
) -> None:
    """A rejected run is a failed workflow execution: its result (the step's review)
    comes from the failure's details, not from a completed event."""
    stack, model = scripted
    name = f"triage-{uuid.uuid4().hex[:8]}"
    fake.script(model, "not json at all")
    run = await stack.start(triage("Charged twice", name))

    async def awaiting() -> bool:
        sa = (await run.describe()).typed_search_attributes
        return any(p.value == "awaiting_review" for p in sa)

    await wait_until(awaiting, "the run to await review")
    await send_review(client, run.id, "reject", reviewer="qa", note="spam")
    result = await failed_result(run)
    assert result.status == "rejected"
    assert (await run.describe()).status == WorkflowExecutionStatus.FAILED

    async def one() -> list[RecordedCall]:
        calls = await read(client, CallQuery(worker=WORKER, tenant="acme", pipeline=name))
        return calls if len(calls) == 1 else []

    (call,) = await wait_until(one, "the rejected run in visibility")
    assert (call.workflow_id, call.status, call.error_code) == (run.id, "failed", "invalid_output")
    assert call.review is not None
    assert (call.review["decision"], call.review["reviewer"]) == ("reject", "qa")
    assert call.review["note"] == "spam" and call.review["outputs"] is None
