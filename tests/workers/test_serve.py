"""``aiworker serve``: the HTTP front door, as its own process, against the real
Temporal dev server and a worker stack, driven with httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import pytest_asyncio
from conftest import Stack
from support.front_door import (
    DOCS_SECRET,
    KEYS,
    MAX_BODY,
    Door,
    bearer,
    door_stack,
    github_headers,
    running_door,
    stripe_headers,
    write_config,
)
from support.front_door import (
    api_error as error,
)
from support.pipelines import one_step_pipeline
from support.procs import worker_env
from support.waiting import wait_until
from temporalio.testing import WorkflowEnvironment

GOOD = {"policy": "all", "result": {"title": "fixed by a human"}, "used": [], "failed": []}


def review_pipeline() -> dict[str, Any]:
    """One aggregator step that fails (the stand-in) and escalates to review."""
    return {
        "name": "review",
        "steps": [
            {
                "id": "draft",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "on_failure": "escalate",
                "review_timeout_seconds": 600,
            }
        ],
        "output": {"title": "${{ steps.draft.outputs.result.title }}"},
    }


@pytest_asyncio.fixture(scope="module")
async def stack(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with door_stack(env.client, tmp_path_factory.mktemp("serve-stack")) as s:
        yield s


@pytest_asyncio.fixture(scope="module")
async def door(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Door]:
    tmp = tmp_path_factory.mktemp("serve")
    env = worker_env(stack.client, stack.settings, tmp / "data") | write_config(tmp)
    async with running_door(env, tmp / "serve.log") as d:
        yield d


@pytest_asyncio.fixture
async def http(door: Door) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=door.url, timeout=30) as c:
        yield c


async def test_start_and_an_idempotent_retry(http: httpx.AsyncClient, stack: Stack) -> None:
    pipeline = one_step_pipeline("api-start")
    del pipeline["tenant"]
    headers = bearer("ci") | {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    first = await http.post("/v1/pipelines", json=pipeline, headers=headers)
    assert first.status_code == 201, first.text
    started = first.json()
    wid = started["workflow_id"]
    assert started["tenant"] == "acme" and first.headers["location"] == f"/v1/pipelines/{wid}"

    again = await http.post("/v1/pipelines", json=pipeline, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["workflow_id"] == wid
    assert again.json()["run_id"] == started["run_id"]

    other = {**pipeline, "inputs": {"doc": {"title": "another"}}}
    message = error(
        await http.post("/v1/pipelines", json=other, headers=headers), 409, "invalid_input"
    )
    assert wid in message and "another body" in message

    done = await http.get(f"/v1/pipelines/{wid}/result", params={"timeout": 30}, headers=headers)
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded" and done.json()["output"] == {"valid": True}
    # One run only: the retry started nothing.
    runs = [w async for w in stack.client.list_workflows(f"WorkflowId = '{wid}'")]
    assert len({w.run_id for w in runs}) <= 1
    status = await http.get(f"/v1/pipelines/{wid}", headers=headers)
    assert status.status_code == 200 and status.json()["status"] == "succeeded"


async def test_a_spec_that_fails_its_check_starts_nothing(http: httpx.AsyncClient) -> None:
    pipeline = one_step_pipeline("api-bad")
    pipeline["steps"][0]["worker"] = "validatr"
    del pipeline["tenant"]
    r = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    message = error(r, 400, "invalid_input")
    assert "validatr" in message
    (problem,) = r.json()["error"]["problems"]
    assert problem["step"] == "check" and problem["suggestion"] == "validator"
    not_json = await http.post("/v1/pipelines", content=b"{nope", headers=bearer("ci"))
    assert "not valid JSON" in error(not_json, 400, "invalid_input")
    deep = b"[" * 300 + b"]" * 300
    too_deep = await http.post("/v1/pipelines", content=deep, headers=bearer("ci"))
    assert "nests deeper than" in error(too_deep, 400, "invalid_input")


async def test_keys_decide_the_tenant(http: httpx.AsyncClient) -> None:
    pipeline = one_step_pipeline("api-tenant")
    missing = await http.post("/v1/pipelines", json=pipeline)
    assert "API key" in error(missing, 401, "access_denied")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = {"Authorization": "Bearer aiw_not-a-key-0123456789abcdefghij"}
    error(await http.post("/v1/pipelines", json=pipeline, headers=wrong), 401, "access_denied")

    # one_step_pipeline names tenant "acme": the beta key may not start it.
    refused = await http.post("/v1/pipelines", json=pipeline, headers=bearer("beta"))
    message = error(refused, 403, "access_denied")
    assert '"beta"' in message and '"acme"' in message

    started = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert started.status_code == 201, started.text
    wid = started.json()["workflow_id"]
    # Another tenant's pipeline does not exist for this key.
    for path in (f"/v1/pipelines/{wid}", f"/v1/pipelines/{wid}/result?timeout=0"):
        error(await http.get(path, headers=bearer("beta")), 404, "not_found")
    review = await http.post(
        f"/v1/pipelines/{wid}/review", json={"decision": "approve"}, headers=bearer("beta")
    )
    error(review, 404, "not_found")


async def test_status_result_with_a_timeout_and_review(http: httpx.AsyncClient) -> None:
    started = await http.post("/v1/pipelines", json=review_pipeline(), headers=bearer("ci"))
    assert started.status_code == 201, started.text
    wid = started.json()["workflow_id"]

    async def awaiting() -> dict[str, Any] | None:
        r = await http.get(f"/v1/pipelines/{wid}", headers=bearer("ci"))
        doc: dict[str, Any] = r.json()
        progress = doc.get("progress") or {}
        # describe (the status) and the query (progress) are two calls, and the
        # query waits for a workflow task in flight: the first poll may see the
        # status from before the task that the query then sees. Wait for both.
        waiting = progress.get("awaiting_review") == ["draft"]
        return doc if waiting and doc["status"] == "awaiting_review" else None

    status = await wait_until(awaiting, "the step to await review")
    assert status["status"] == "awaiting_review" and status["execution_status"] == "running"
    assert status["tenant"] == "acme" and status["pipeline"] == "review"

    pending = await http.get(
        f"/v1/pipelines/{wid}/result", params={"timeout": 0.5}, headers=bearer("ci")
    )
    assert pending.status_code == 202, pending.text
    assert pending.json()["status"] == "awaiting_review"
    too_long = await http.get(
        f"/v1/pipelines/{wid}/result", params={"timeout": 3600}, headers=bearer("ci")
    )
    assert "$.timeout" in error(too_long, 400, "invalid_input")

    review = f"/v1/pipelines/{wid}/review"
    bad = await http.post(review, json={"decision": "maybe"}, headers=bearer("ci"))
    assert "$.decision" in error(bad, 400, "invalid_input")
    off_schema = await http.post(
        review, json={"decision": "approve", "outputs": {"result": 1}}, headers=bearer("ci")
    )
    assert "review refused" in error(off_schema, 409, "invalid_input")
    answer = await http.post(
        review, json={"decision": "approve", "outputs": GOOD, "note": "ok"}, headers=bearer("ci")
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"] == "approve"
    assert answer.json()["reviewer"] == "api-key:ci"

    done = await http.get(f"/v1/pipelines/{wid}/result", headers=bearer("ci"))
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded"
    assert done.json()["output"] == {"title": "fixed by a human"}
    ended = await http.post(review, json={"decision": "reject"}, headers=bearer("ci"))
    assert "has ended" in error(ended, 409, "invalid_input")


async def test_github_webhook_signatures_and_redelivery(http: httpx.AsyncClient) -> None:
    body = json.dumps({"action": "opened", "number": 7}).encode()
    delivery = str(uuid.uuid4())
    first = await http.post("/v1/hooks/gh", content=body, headers=github_headers(body, delivery))
    assert first.status_code == 201, first.text
    wid = first.json()["workflow_id"]
    again = await http.post("/v1/hooks/gh", content=body, headers=github_headers(body, delivery))
    assert again.status_code == 200 and again.json()["workflow_id"] == wid

    forged = github_headers(body, str(uuid.uuid4()), secret="not-the-secret-at-all")
    message = error(
        await http.post("/v1/hooks/gh", content=body, headers=forged), 401, "access_denied"
    )
    assert "does not match" in message
    unsigned = {"X-GitHub-Delivery": str(uuid.uuid4()), "Content-Type": "application/json"}
    missing = await http.post("/v1/hooks/gh", content=body, headers=unsigned)
    assert "missing" in error(missing, 401, "access_denied")
    unknown = await http.post("/v1/hooks/nope", content=body, headers=github_headers(body, "x"))
    error(unknown, 404, "not_found")

    done = await http.get(
        f"/v1/pipelines/{wid}/result", params={"timeout": 30}, headers=bearer("ci")
    )
    assert done.status_code == 200, done.text
    assert done.json()["output"] == {"valid": True, "action": "opened", "delivery": delivery}


async def test_stripe_webhook_signatures_and_tolerance(http: httpx.AsyncClient) -> None:
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "action": "paid"}).encode()
    ok = await http.post("/v1/hooks/pay", content=body, headers=stripe_headers(body))
    assert ok.status_code == 201, ok.text
    # The same event again (no delivery header: the body's hash) is the same run.
    again = await http.post("/v1/hooks/pay", content=body, headers=stripe_headers(body))
    assert again.status_code == 200 and again.json()["workflow_id"] == ok.json()["workflow_id"]

    old = stripe_headers(body, at=time.time() - 3600)
    expired = await http.post("/v1/hooks/pay", content=body, headers=old)
    assert "tolerance" in error(expired, 401, "access_denied")
    tampered = body.replace(b"paid", b"free")
    forged = await http.post("/v1/hooks/pay", content=tampered, headers=stripe_headers(body))
    assert "does not match" in error(forged, 401, "access_denied")
    garbled = {"Stripe-Signature": "v1=abc"}
    bad = await http.post("/v1/hooks/pay", content=body, headers=garbled)
    assert "t=<unix time>" in error(bad, 401, "access_denied")


async def test_bodies_over_the_cap_are_refused_unread(http: httpx.AsyncClient) -> None:
    big = b'{"name": "' + b"x" * MAX_BODY + b'"}'
    r = await http.post("/v1/pipelines", content=big, headers=bearer("ci"))
    assert str(MAX_BODY) in error(r, 413, "payload_too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(MAX_BODY // 4096 + 2):
            yield b" " * 4096

    streamed = await http.post("/v1/hooks/gh", content=chunks())
    error(streamed, 413, "payload_too_large")


async def test_rate_limit_per_key(http: httpx.AsyncClient) -> None:
    # The "slow" key may make 3 requests a minute; others are not slowed by it.
    codes = [
        (await http.get("/v1/pipelines/none", headers=bearer("slow"))).status_code for _ in range(3)
    ]
    assert codes == [404, 404, 404]
    limited = await http.get("/v1/pipelines/none", headers=bearer("slow"))
    assert "3/min" in error(limited, 429, "rate_limited")
    assert 1 <= int(limited.headers["retry-after"]) <= 20
    other = await http.get("/v1/pipelines/none", headers=bearer("ci"))
    assert other.status_code == 404


async def test_probes_and_the_openapi_document(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    doc = (await http.get("/openapi.json")).json()
    routes = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert routes == {
        ("/v1/pipelines", "post"),
        ("/v1/pipelines/{workflow_id}", "get"),
        ("/v1/pipelines/{workflow_id}/result", "get"),
        ("/v1/pipelines/{workflow_id}/steps/{step}/items", "get"),
        ("/v1/pipelines/{workflow_id}/review", "post"),
        ("/v1/pipelines/{workflow_id}/redrive", "post"),
        ("/v1/pipelines/{workflow_id}/events", "get"),
        ("/v1/pipelines/{workflow_id}/live", "get"),
        ("/v1/callbacks/{token}", "post"),
        ("/v1/callbacks/{token}/heartbeat", "post"),
        ("/v1/hooks/{name}", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
    }
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    error(await http.get("/v1/nothing"), 404, "not_found")


async def test_temporal_unreachable_is_503(tmp_path: Path, stack: Stack) -> None:
    env = worker_env(stack.client, stack.settings, tmp_path / "data") | write_config(tmp_path)
    env["TEMPORAL_ADDRESS"] = "127.0.0.1:9"  # discard: nothing answers gRPC there
    async with (
        running_door(env, tmp_path / "serve.log") as down,
        httpx.AsyncClient(base_url=down.url, timeout=30) as http,
    ):
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        error(ready, 503, "upstream_error")
        pipeline = one_step_pipeline("api-down")
        r = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
        assert "did not answer" in error(r, 503, "upstream_error")
        assert r.headers["retry-after"] == "5"


def docs_blocks(*needles: str) -> list[str]:
    """The shell blocks of docs/serve.md that hold every one of ``needles``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)
    return [b for b in blocks if all(n in b for n in needles)]


async def test_the_curl_examples_of_the_docs_run_as_written(
    door: Door, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    pipeline = one_step_pipeline("from-the-docs")
    (tmp_path / "pipeline.json").write_text(json.dumps(pipeline))
    env = {"PATH": "/usr/bin:/bin", "KEY": KEYS["ci"][1], "GITHUB_WEBHOOK_SECRET": DOCS_SECRET}
    answers = []
    for needles in (("Idempotency-Key", "--data @pipeline.json"), ("X-Hub-Signature-256",)):
        (block,) = docs_blocks(*needles)
        script = block.replace("http://localhost:8000", door.url)
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    for answer in answers:
        assert answer["tenant"] == "acme" and answer["workflow_id"], answer
        r = await http.get(
            f"/v1/pipelines/{answer['workflow_id']}/result",
            params={"timeout": 30},
            headers=bearer("ci"),
        )
        assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text


async def test_singleton_refuse_answers_409_naming_the_run_that_holds_the_key(
    http: httpx.AsyncClient, stack: Stack
) -> None:
    """Flow control (docs/flow-control.md) at the front door: the held run awaits review."""
    customer = f"c-{uuid.uuid4().hex[:8]}"
    pipeline = {
        **review_pipeline(),
        "inputs": {"customer": customer},
        "flow": {"key": "${{ inputs.customer }}", "singleton": "refuse"},
    }
    first = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert first.status_code == 201, first.text
    wid = first.json()["workflow_id"]
    assert wid.endswith(f"/review/{customer}")
    try:
        again = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
        message = error(again, 409, "flow_refused")
        assert wid in message and "holds flow key" in message
        body = again.json()["error"]
        assert body["flow"] == "refused" and body["workflow_id"] == wid, body
        empty = {**pipeline, "inputs": {"customer": ""}}
        bad = error(
            await http.post("/v1/pipelines", json=empty, headers=bearer("ci")), 400, "invalid_input"
        )
        assert "flow.key" in bad
    finally:
        await stack.client.get_workflow_handle(wid).terminate("test over")


async def test_a_debounced_start_answers_202_with_what_flow_control_did(
    http: httpx.AsyncClient, stack: Stack
) -> None:
    """The front door's answer carries the flow workflow's: queued, then collapsed
    into the same run (a day's quiet period: nothing starts during the test)."""
    customer = f"c-{uuid.uuid4().hex[:8]}"
    pipeline = {
        **one_step_pipeline("api-debounce"),
        "inputs": {"customer": customer, "doc": {"title": "x"}},
        "flow": {"key": "${{ inputs.customer }}", "debounce": {"seconds": 86_400}},
    }
    first = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert first.status_code == 202, first.text
    doc = first.json()
    flow = doc["flow"]
    try:
        assert flow["status"] == "queued" and doc["run_id"] is None
        assert doc["workflow_id"].startswith(flow["flow_workflow_id"] + "/")
        assert "debounce: starts once key" in flow["reason"] and flow["starts"] == 1
        again = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
        assert again.status_code == 202, again.text
        assert again.json()["workflow_id"] == doc["workflow_id"]
        assert again.json()["flow"]["status"] == "collapsed"
        assert again.json()["flow"]["starts"] == 2
        assert again.headers["location"] == "/v1/pipelines/" + quote(doc["workflow_id"], safe="")
        # a retried request with the same Idempotency-Key is the same start, answered once
        keyed = bearer("ci") | {"Idempotency-Key": f"order-{uuid.uuid4()}"}
        once = await http.post("/v1/pipelines", json=pipeline, headers=keyed)
        retry = await http.post("/v1/pipelines", json=pipeline, headers=keyed)
        assert once.status_code == retry.status_code == 202, retry.text
        assert once.json()["flow"]["starts"] == retry.json()["flow"]["starts"] == 3
    finally:
        await stack.client.get_workflow_handle(flow["flow_workflow_id"]).terminate("test over")


async def test_a_flow_run_answers_on_every_route_by_its_encoded_id(
    http: httpx.AsyncClient, stack: Stack
) -> None:
    """A flow run's id holds ``/`` (``flow<suffix>/acme/review/<key>``): each
    ``{workflow_id}`` route reaches it as one percent-encoded segment, starting
    from the ``Location`` header the start answered; the held run awaits review."""
    customer = f"c-{uuid.uuid4().hex[:8]}"
    pipeline = {
        **review_pipeline(),
        "inputs": {"customer": customer},
        "flow": {"key": "${{ inputs.customer }}", "singleton": "refuse"},
    }
    started = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert started.status_code == 201, started.text
    wid = started.json()["workflow_id"]
    assert wid.startswith("flow") and wid.endswith(f"/acme/review/{customer}")
    base = started.headers["location"]
    assert base == "/v1/pipelines/" + quote(wid, safe="") and "%2F" in base
    try:

        async def awaiting() -> dict[str, Any] | None:
            r = await http.get(base, headers=bearer("ci"))
            assert r.status_code == 200, r.text
            doc: dict[str, Any] = r.json()
            waiting = (doc.get("progress") or {}).get("awaiting_review") == ["draft"]
            return doc if waiting and doc["status"] == "awaiting_review" else None

        status = await wait_until(awaiting, "the flow run to await review")
        assert status["workflow_id"] == wid
        pending = await http.get(f"{base}/result", params={"timeout": 0}, headers=bearer("ci"))
        assert pending.status_code == 202 and pending.json()["workflow_id"] == wid, pending.text
        running = await http.get(f"{base}/steps/draft/items", headers=bearer("ci"))
        assert wid in error(running, 409, "invalid_input")
        page = await http.get(f"{base}/live")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # a method the route lacks is 405, not the status of an id ending in "/review"
        assert (await http.get(f"{base}/review", headers=bearer("ci"))).status_code == 405
        error(await http.get(base, headers=bearer("beta")), 404, "not_found")

        answer = await http.post(
            f"{base}/review", json={"decision": "approve", "outputs": GOOD}, headers=bearer("ci")
        )
        assert answer.status_code == 200, answer.text
        done = await http.get(f"{base}/result", params={"timeout": 30}, headers=bearer("ci"))
        assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text

        types = []
        async with http.stream("GET", f"{base}/events", headers=bearer("ci")) as stream:
            assert stream.status_code == 200
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    types.append(line.removeprefix("event: "))
        assert "review_awaited" in types and types[-1] == "run_ended", types

        again = await http.post(f"{base}/redrive", json={}, headers=bearer("ci"))
        assert "succeeded" in error(again, 409, "invalid_input")
    finally:
        with contextlib.suppress(Exception):  # it may have ended already
            await stack.client.get_workflow_handle(wid).terminate("test over")


async def test_a_key_holds_at_most_its_cap_of_event_streams(stack: Stack, tmp_path: Path) -> None:
    """A door of 8 connections, 3 streams per key and 4 per tenant: the key's fourth
    stream and the tenant's fifth are 429 with Retry-After, another tenant's start
    still succeeds, and a closed stream frees its slot. (Before the caps, a key's
    streams took every connection and the other tenant's start answered 503.)"""
    env = worker_env(stack.client, stack.settings, tmp_path / "data") | write_config(tmp_path)
    env |= {
        "AIWORKER_SERVE_MAX_CONNECTIONS": "8",
        "AIWORKER_SERVE_MAX_STREAMS_PER_KEY": "3",
        "AIWORKER_SERVE_MAX_STREAMS_PER_TENANT": "4",
    }
    async with (
        running_door(env, tmp_path / "serve.log") as capped,
        httpx.AsyncClient(base_url=capped.url, timeout=30) as http,
        contextlib.AsyncExitStack() as streams,
    ):
        started = await http.post("/v1/pipelines", json=review_pipeline(), headers=bearer("ci"))
        assert started.status_code == 201, started.text
        events = started.headers["location"] + "/events"
        wid = started.json()["workflow_id"]
        try:
            held = []
            for _ in range(3):
                r = await streams.enter_async_context(
                    http.stream("GET", events, headers=bearer("ci"))
                )
                assert r.status_code == 200, await r.aread()
                held.append(r)
            over = await http.get(events, headers=bearer("ci"))
            assert "this API key holds 3 open event streams" in error(over, 429, "rate_limited")
            assert 1 <= int(over.headers["retry-after"]) <= 600
            # the tenant's cap counts its other keys' streams too
            other_key = await streams.enter_async_context(
                http.stream("GET", events, headers=bearer("slow"))
            )
            assert other_key.status_code == 200
            tenant_over = await http.get(events, headers=bearer("slow"))
            assert "this tenant holds 4" in error(tenant_over, 429, "rate_limited")
            assert int(tenant_over.headers["retry-after"]) >= 1

            pipeline = {**one_step_pipeline("other-tenant"), "tenant": "beta"}
            other = await http.post("/v1/pipelines", json=pipeline, headers=bearer("beta"))
            assert other.status_code == 201, other.text

            await held[0].aclose()  # the client leaves: the door sees it and frees the slot

            async def reopened() -> httpx.Response | None:
                r = await streams.enter_async_context(
                    http.stream("GET", events, headers=bearer("ci"))
                )
                if r.status_code == 429:
                    await r.aclose()
                    return None
                return r

            again = await wait_until(reopened, "a closed stream's slot to free")
            assert again.status_code == 200
        finally:
            await stack.client.get_workflow_handle(wid).terminate("test over")
