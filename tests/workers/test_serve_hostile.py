"""``aiworker serve`` against hostile callers (issue #31): slow clients, a connection
flood, replayed webhooks, refused signatures, and what a caller may learn or claim.

Each test drives the real command as its own process (``support.front_door``)
over loopback, against the session's Temporal dev server and a worker stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from conftest import Stack
from support import history
from support.front_door import Door, bearer, door_stack, github_headers, running_door, write_config
from support.pipelines import one_step_pipeline
from support.procs import worker_env
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0


@pytest_asyncio.fixture(scope="module")
async def stack(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with door_stack(env.client, tmp_path_factory.mktemp("hostile-stack")) as s:
        yield s


def door_env(stack: Stack, tmp: Path) -> dict[str, str]:
    tenants = {"tenants": {"acme": {"highest_priority": 3}, "beta": {}}}
    (tmp / "tenants.json").write_text(json.dumps(tenants))
    return (
        worker_env(stack.client, stack.settings, tmp / "data")
        | write_config(tmp)
        | {
            "AIWORKER_TENANTS_FILE": str(tmp / "tenants.json"),
            "AIWORKER_SERVE_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "AIWORKER_SERVE_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        }
    )


@pytest_asyncio.fixture(scope="module")
async def door(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Door]:
    tmp = tmp_path_factory.mktemp("hostile")
    async with running_door(door_env(stack, tmp), tmp / "serve.log") as d:
        yield d


@pytest_asyncio.fixture
async def http(door: Door) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=door.url, timeout=30) as c:
        yield c


def open_fds(door: Door) -> int:
    """The file descriptors the front door's process holds now."""
    return len(os.listdir(f"/proc/{door.proc.pid}/fd"))


def _address(door: Door) -> tuple[str, int]:
    host, port = door.url.removeprefix("http://").split(":")
    return host, int(port)


async def _slow_client(door: Door, first: bytes, drip: bytes) -> bytes:
    """Send ``first``, then ``drip`` every 0.2 s until the server answers; what it
    answered, or ``b"(reset)"`` when the connection was reset before any answer.

    The drip stops at the answer's first byte, and what was read before a reset is
    kept: a drip written after the server closed makes its kernel answer with a
    reset, which would otherwise discard an answer this (loaded) client had not yet
    read whole."""
    reader, writer = await asyncio.open_connection(*_address(door))
    writer.write(first)
    answered = asyncio.Event()

    async def trickle() -> None:
        with contextlib.suppress(OSError):
            while not writer.is_closing() and not answered.is_set():
                await asyncio.sleep(0.2)  # pacing of the attack, not a timing assertion
                if answered.is_set():
                    break
                writer.write(drip)
                await writer.drain()

    dripping = asyncio.create_task(trickle())
    got = b""
    try:
        try:
            while chunk := await reader.read(65536):  # until the server closes
                answered.set()
                got += chunk
        except ConnectionResetError:
            return got or b"(reset)"
        return got
    finally:
        dripping.cancel()
        writer.close()


async def test_slow_headers_and_slow_bodies_are_cut_off(
    door: Door, http: httpx.AsyncClient
) -> None:
    assert (await http.get("/readyz")).status_code == 200  # Temporal connected
    await http.aclose()  # no kept-alive connection of ours in the count
    before = open_fds(door)
    headers = [
        asyncio.create_task(
            _slow_client(door, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
        )
        for _ in range(20)
    ]
    # a body announced, then dripped: never complete
    post = (
        b"POST /v1/hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 60000\r\n\r\n{"
    )
    bodies = [asyncio.create_task(_slow_client(door, post, b" ")) for _ in range(5)]
    answers = await asyncio.wait_for(asyncio.gather(*headers, *bodies), 60)
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers[:20]), answers[:3]
    assert all(b'"timeout"' in a for a in answers[:20])
    # a body read cut off: 408 unless the reset beat it to the client
    assert all(a.startswith(b"HTTP/1.1 408 ") or a == b"(reset)" for a in answers[20:]), answers[
        20:
    ]
    await wait_until(lambda: open_fds(door) <= before + 2, "the front door to drop the sockets")
    log = door.proc.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-2000:]
    async with httpx.AsyncClient(base_url=door.url, timeout=30) as fresh:
        assert (await fresh.get("/healthz")).status_code == 200


async def test_a_connection_past_the_ceiling_is_refused(stack: Stack, tmp_path: Path) -> None:
    env = door_env(stack, tmp_path) | {
        "AIWORKER_SERVE_MAX_CONNECTIONS": "5",
        "AIWORKER_SERVE_HEADER_TIMEOUT_SECONDS": "60",
        "TEMPORAL_ADDRESS": "127.0.0.1:9",  # not needed: nothing here asks Temporal
    }
    async with running_door(env, tmp_path / "serve.log") as small:
        before = open_fds(small)
        held = [await asyncio.open_connection(*_address(small)) for _ in range(5)]
        await wait_until(lambda: open_fds(small) >= before + 5, "five connections accepted")
        reader, writer = await asyncio.open_connection(*_address(small))
        refused = await asyncio.wait_for(reader.read(), 30)  # answered and closed at once
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503 "), refused
        assert b"retry-after: 1" in refused and b"ceiling of 5 connections" in refused
        assert open_fds(small) == before + 5
        # one leaves: a new caller is served
        held[0][1].close()
        await wait_until(lambda: open_fds(small) < before + 5, "a connection to close")
        async with httpx.AsyncClient(base_url=small.url, timeout=30) as http:
            assert (await http.get("/healthz")).status_code == 200
        for _, w in held[1:]:
            w.close()


async def test_a_replayed_github_body_starts_nothing_new(http: httpx.AsyncClient) -> None:
    body = json.dumps({"action": "opened", "number": int(uuid.uuid4().int % 10**6)}).encode()
    first = await http.post(
        "/v1/hooks/gh", content=body, headers=github_headers(body, str(uuid.uuid4()))
    )
    assert first.status_code == 201, first.text
    # The same signed body, a new delivery id and a forged event: the same delivery.
    replay = github_headers(body, str(uuid.uuid4())) | {"X-GitHub-Event": "release"}
    again = await http.post("/v1/hooks/gh", content=body, headers=replay)
    assert again.status_code == 200, again.text
    assert again.json()["workflow_id"] == first.json()["workflow_id"]
    assert again.json()["run_id"] == first.json()["run_id"]


async def test_refused_webhook_signatures_are_rate_limited(http: httpx.AsyncClient) -> None:
    body = b'{"action": "opened"}'
    forged = github_headers(body, "x", secret="not-the-secret-at-all")
    codes = []
    for _ in range(200):  # the default rate is 120/min
        r = await http.post("/v1/hooks/github-push", content=body, headers=forged)
        codes.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limited"
            assert int(r.headers["retry-after"]) >= 1
            break
    assert codes[-1] == 429 and set(codes[:-1]) == {401}, codes
    # other hooks are not held by this one's refusals
    ok = await http.post(
        "/v1/hooks/gh", content=b'{"action": "x"}', headers=github_headers(b'{"action": "x"}', "y")
    )
    assert ok.status_code in (200, 201), ok.text


async def test_readyz_names_no_address_and_no_cdn_page(stack: Stack, tmp_path: Path) -> None:
    env = door_env(stack, tmp_path) | {"TEMPORAL_ADDRESS": "127.0.0.1:9"}
    async with (
        running_door(env, tmp_path / "serve.log") as down,
        httpx.AsyncClient(base_url=down.url, timeout=30) as http,
    ):
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "upstream_error"
        assert "127.0.0.1" not in ready.text and ":9" not in ready.text
        started = await http.post("/v1/pipelines", json=one_step_pipeline(), headers=bearer("ci"))
        assert started.status_code == 503 and "127.0.0.1" not in started.text
        assert "127.0.0.1:9" in down.proc.log.read_text()  # the operator's log has it
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert (await http.get(page)).status_code == 404, page
        assert (await http.get("/openapi.json")).status_code == 200


async def test_the_reviewer_is_recorded_with_the_key(http: httpx.AsyncClient) -> None:
    pipeline = {
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
    }
    started = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert started.status_code == 201, started.text
    wid = started.json()["workflow_id"]

    async def awaiting() -> bool:
        doc = (await http.get(f"/v1/pipelines/{wid}", headers=bearer("ci"))).json()
        return (doc.get("progress") or {}).get("awaiting_review") == ["draft"]

    await wait_until(awaiting, "the step to await review")
    answer = await http.post(
        f"/v1/pipelines/{wid}/review",
        json={"decision": "reject", "reviewer": "the-ceo"},
        headers=bearer("ci"),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["reviewer"] == "the-ceo (api-key:ci)"


async def test_a_tenant_priority_ceiling_holds(http: httpx.AsyncClient, stack: Stack) -> None:
    async def started_priority(key: str) -> int:
        pipeline = one_step_pipeline("urgent") | {"priority": 1}
        del pipeline["tenant"]
        r = await http.post("/v1/pipelines", json=pipeline, headers=bearer(key))
        assert r.status_code == 201, r.text
        handle = stack.client.get_workflow_handle(r.json()["workflow_id"])
        for e in await history.events(handle):
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                key_: int = e.workflow_execution_started_event_attributes.priority.priority_key
                return key_
        raise AssertionError("no start event")

    assert await started_priority("ci") == 3  # acme: highest_priority 3
    assert await started_priority("beta") == 1  # beta: no ceiling


async def test_resume_from_says_the_same_for_unknown_and_foreign_runs(
    http: httpx.AsyncClient,
) -> None:
    theirs = await http.post("/v1/pipelines", json=one_step_pipeline(), headers=bearer("ci"))
    assert theirs.status_code == 201, theirs.text
    foreign = theirs.json()["workflow_id"]
    ghost = f"api-acme-{uuid.uuid4().hex}"

    async def refusal(workflow_id: str) -> str:
        pipeline = one_step_pipeline("redrive")
        pipeline["tenant"] = "beta"
        pipeline["resume_from"] = {"workflow_id": workflow_id, "steps": {}}
        r = await http.post("/v1/pipelines", json=pipeline, headers=bearer("beta"))
        assert r.status_code == 201, r.text
        wid = r.json()["workflow_id"]
        done = await http.get(
            f"/v1/pipelines/{wid}/result", params={"timeout": 30}, headers=bearer("beta")
        )
        assert done.status_code == 200 and done.json()["status"] == "failed", done.text
        error = done.json()["error"]
        assert error["code"] == "invalid_input", error
        message: str = error["message"]
        return message.replace(workflow_id, "<id>")

    assert await refusal(foreign) == await refusal(ghost)
