"""A cost quote from recorded history, on the real dev server with the bundled
local model (SmolLM2-135M behind llama-server, fixtures/local_model.py).

Runs of ``examples/prompts/classify-ticket.json`` are recorded for a tenant of
this test alone, its ``default`` model alias priced in a models file; then
``aiworker check --quote`` (its own process) quotes them, a ``for_each`` size
known at check time multiplies, a worker with no history is named in
``unknown``, and the tenant's ``quote_accept_above_usd`` holds a start of the
CLI (exit 2), the front door (422) and the client (``QuoteNotAcceptedError``)
until it is accepted.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import Stack, installed_workers, running_stack
from prometheus_client import CollectorRegistry
from support.front_door import running_door
from support.pipelines import pipeline_result
from support.procs import run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus

from aiworker.activities.llm import LlmMetrics
from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.pipeline import PipelineSpec
from aiworker.schemas.tenants import TenantRegistry
from aiworker.workers.client.client import PipelineClient, QuoteNotAcceptedError
from aiworker.workers.devstack.modelserver import MODEL_NAME, ModelServer
from aiworker.workers.frontdoor.auth import hash_key
from aiworker.workers.process.deployments import build_id
from aiworker.workers.process.live_registry import process_entry, publishing
from aiworker.workers.process.resources import build_language_model
from aiworker.workers.quote import CallSample, step_history

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prompts"
WORKER = "classify-ticket"
PRICES = {"input": 1.0, "output": 2.0}  # US dollars per million tokens
THRESHOLD = 1e-7  # below any recorded call's cost
TICKETS = [
    ("Checkout page returns 500", "None of our customers can pay since 09:10."),
    ("Charged twice for March", "My card was charged two times for invoice INV-2291."),
    ("Dark mode?", "Any plans for a dark theme in the dashboard?"),
]
SECRET = "aiw_quote-key-0123456789abcdefghijkl"


@dataclass
class QuoteStack:
    stack: Stack
    settings: Settings
    env: dict[str, str]
    tenant: str
    tmp: Path
    workers: Any

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        done = await asyncio.to_thread(run_cli_module, list(argv), self.env, timeout=300)
        return done.returncode, done.stdout, done.stderr

    def write(self, doc: dict[str, Any], name: str) -> str:
        path = self.tmp / name
        path.write_text(json.dumps(doc), "utf-8")
        return str(path)


@pytest_asyncio.fixture
async def quoting(
    client: Client, settings: Settings, tmp_path: Path, local_model: ModelServer
) -> AsyncIterator[QuoteStack]:
    tenant = f"q{uuid.uuid4().hex[:10]}"  # no other test's history
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(EXAMPLES / f"{WORKER}.json", specs)
    models = tmp_path / "models.json"
    alias = {"provider": "openai", "base_url": local_model.base_url, "model": MODEL_NAME}
    models.write_text(
        json.dumps({"models": {"default": alias | {"usd_per_million_tokens": PRICES}}})
    )
    tenants_doc = {"tenants": {tenant: {"quote_accept_above_usd": THRESHOLD}}}
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(tenants_doc))
    s = Settings.model_validate(
        settings.model_dump()
        | {
            "worker_specs": (specs,),
            "llm_base_url": None,
            "llm_model": None,
            "models_file": models,
            "tenants_file": tenants,
            "tenants": TenantRegistry.model_validate(tenants_doc),
        }
    )
    env = worker_env(client, s, s.data_dir)
    env.update(
        AIWORKER_WORKER_SPECS=str(specs),
        AIWORKER_MODELS_FILE=str(models),
        AIWORKER_TENANTS_FILE=str(tenants),
    )
    lm = build_language_model(s, {}, llm_metrics=LlmMetrics(CollectorRegistry()))
    try:
        with installed_workers(s, entry_points=()) as ws:
            async with running_stack(client, s, workers=ws, tools={"language_model": lm}) as st:
                yield QuoteStack(st, s, env, tenant, tmp_path, ws)
    finally:
        await lm.aclose()


def triage(tenant: str, **step: Any) -> dict[str, Any]:
    subject, body = TICKETS[0]
    return {
        "name": "quoted-triage",
        "tenant": tenant,
        "inputs": {"subject": subject, "body": body},
        "steps": [
            {
                "id": "triage",
                "worker": WORKER,
                "input": {"subject": "${{ inputs.subject }}", "body": "${{ inputs.body }}"},
                **step,
            }
        ],
        "output": {"category": "${{ steps.triage.outputs.category }}"},
    }


async def record(q: QuoteStack) -> list[CallSample]:
    """Three recorded runs of the worker for the test's tenant; their calls."""
    succeeded, failed = 0, []
    for subject, body in TICKETS * 2:
        if succeeded == 3:
            break
        doc = triage(q.tenant)
        doc["inputs"] = {"subject": subject, "body": body}
        result = await pipeline_result(await q.stack.start(doc))
        # the 135M model now and then answers off the output schema (invalid_output)
        # on a loaded machine: only succeeded calls are history, so record another
        if result.status == "succeeded":
            succeeded += 1
        else:
            failed.append(result.model_dump(mode="json").get("error"))
    assert succeeded == 3, failed
    spec = PipelineSpec.model_validate(triage(q.tenant))

    async def three() -> list[CallSample] | None:
        got = (await step_history(q.stack.client, spec))["triage"]
        return list(got) if len(got) == 3 else None

    calls: list[CallSample] | None = await wait_until(
        three, "three calls in visibility", timeout=60, interval=0.5
    )
    assert calls is not None
    return calls


async def accepted(client: Client, workflow_id: str) -> None:
    """The start was accepted: its run exists. The run is cancelled then, and its end
    awaited: its model call is not the quote's business, and waiting for three more
    calls of the local model is what made this test outlast its timeout beside a
    CPU hog."""
    handle = client.get_workflow_handle(workflow_id)
    assert (await handle.describe()).workflow_type == names.PIPELINE_WORKFLOW
    await handle.cancel()

    async def closed() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    await wait_until(closed, f"run {workflow_id} to end", timeout=120, interval=0.5)


async def test_quote_from_history_multiplies_and_names_what_it_cannot_estimate(
    quoting: QuoteStack,
) -> None:
    q = quoting
    calls = await record(q)
    tokens = [c.tokens for c in calls]
    assert all(t > 0 for t in tokens)
    # one model call each, or two when the local model timed out once on a loaded
    # machine and the step's retry answered: the quote stands on what was recorded
    external = [c.external_calls for c in calls]
    assert all(e >= 1 for e in external), external

    code, out, errs = await q.cli(
        "check", "--quote", "--json", q.write(triage(q.tenant), "one.json")
    )
    assert code == 0, errs
    doc = json.loads(out)
    assert doc["unknown"] == [] and doc["items"] == {"triage": 1}
    for key in ("tokens", "cost_usd", "duration_s"):
        assert 0 < doc[key]["p50"] <= doc[key]["p95"], (key, doc[key])
    assert min(tokens) <= doc["tokens"]["p50"] <= doc["tokens"]["p95"] <= max(tokens)
    ext = doc["external_calls"]
    assert min(external) <= ext["p50"] <= ext["p95"] <= max(external), (ext, external)

    # a for_each size known at check time multiplies; a worker with no history is named
    many = triage(q.tenant, for_each=[t[0] for t in TICKETS])
    many["steps"][0]["input"]["subject"] = "${{ item }}"
    many["steps"].append({"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}})
    code, out, errs = await q.cli("check", "--quote", "--json", q.write(many, "many.json"))
    assert code == 0, errs
    doc = json.loads(out)
    assert doc["items"] == {"triage": 3}
    assert 3 * min(tokens) <= doc["tokens"]["p50"] <= doc["tokens"]["p95"] <= 3 * max(tokens)
    ext = doc["external_calls"]
    assert 3 * min(external) <= ext["p50"] <= ext["p95"] <= 3 * max(external), (ext, external)
    (unknown,) = doc["unknown"]
    assert unknown["step"] == "check" and unknown["reason"] == "no_recorded_calls"
    assert "validator" in unknown["detail"]


# Three recorded calls of the local model, five CLI processes and a front door: about
# a minute on a quiet machine, past the suite's 180 s beside a CPU hog on two cores.
@pytest.mark.timeout(480)
async def test_the_tenant_threshold_holds_a_start_until_it_is_accepted(
    quoting: QuoteStack, client: Client
) -> None:
    q = quoting
    await record(q)
    pipeline = triage(q.tenant)
    path = q.write(pipeline, "run.json")

    # the CLI: exit 2 naming the quote's p95 and the threshold; --accept-quote runs it
    code, out, errs = await q.cli("run", path)
    assert code == 2 and "quote_not_accepted" in errs, errs + out
    assert f"{THRESHOLD:.6g} USD" in errs and "(p95)" in errs
    code, out, errs = await q.cli("run", path, "--accept-quote", "--no-wait")
    assert code == 0 and "quote_not_accepted" not in errs, errs + out
    await accepted(client, out.strip())

    # the client: QuoteNotAcceptedError with the quote; accept_quote=True starts
    pipelines = PipelineClient(client, q.settings)
    with pytest.raises(QuoteNotAcceptedError) as refused:
        await pipelines.start(pipeline)
    assert refused.value.code == "quote_not_accepted"
    assert refused.value.quote.cost_usd.p95 > THRESHOLD == refused.value.threshold
    await accepted(client, (await pipelines.start(pipeline, accept_quote=True)).id)

    # the front door: 422 quote_not_accepted; accept_quote: true starts (201)
    keys = q.tmp / "keys.json"
    keys.write_text(
        json.dumps({"keys": [{"name": "q", "tenant": q.tenant, "sha256": hash_key(SECRET)}]})
    )
    env = q.env | {"AIWORKER_API_KEYS_FILE": str(keys)}
    # the door checks against the live registry: the stack's workers, published
    entry = process_entry(
        identity="quote-test",
        build_id=build_id(q.settings),
        task_queues=[q.settings.queue(names.PIPELINES_QUEUE)],
        specs=q.workers.specs,
        served=list(q.workers.specs),
        model_providers={"default": "openai"},
    )
    async with (
        publishing(client, q.settings, entry) as pub,
        running_door(env, q.tmp / "serve.log") as door,
    ):
        await wait_until(pub.published.is_set, "the stack's entry published")
        auth = {"Authorization": f"Bearer {SECRET}"}
        async with httpx.AsyncClient(base_url=door.url, timeout=60) as http:
            r = await http.post("/v1/pipelines", json=pipeline, headers=auth)
            assert r.status_code == 422, r.text
            error = r.json()["error"]
            assert error["code"] == "quote_not_accepted" and error["threshold_usd"] == THRESHOLD
            assert error["quote"]["cost_usd"]["p95"] > THRESHOLD
            bad = await http.post(
                "/v1/pipelines", json=pipeline | {"accept_quote": "yes"}, headers=auth
            )
            assert bad.status_code == 400 and "accept_quote" in bad.text
            ok = await http.post(
                "/v1/pipelines", json=pipeline | {"accept_quote": True}, headers=auth
            )
            assert ok.status_code == 201, ok.text
    await accepted(client, ok.json()["workflow_id"])


async def test_no_history_does_not_hold_a_start_and_run_says_the_quote_is_unknown(
    quoting: QuoteStack,
) -> None:
    q = quoting  # nothing recorded for this tenant
    code, out, errs = await q.cli("run", q.write(triage(q.tenant), "fresh.json"), "--no-wait")
    assert code == 0, errs + out
    assert "the cost quote is unknown" in errs and "triage (no_recorded_calls)" in errs
    await accepted(q.stack.client, out.strip())
