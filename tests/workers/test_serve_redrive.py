"""``POST /v1/pipelines/{id}/redrive`` on ``aiworker serve`` (its own process, real
HTTP on loopback, the real Temporal dev server and a worker stack)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from conftest import Stack
from support.front_door import MAX_BODY, Door, bearer, door_stack, running_door, write_config
from support.front_door import api_error as error
from support.pipelines import one_step_pipeline
from support.procs import worker_env
from temporalio.testing import WorkflowEnvironment

from aiworker.workers.client.client import PipelineClient


@pytest_asyncio.fixture(scope="module")
async def stack(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with door_stack(env.client, tmp_path_factory.mktemp("redrive-stack")) as s:
        yield s


@pytest_asyncio.fixture(scope="module")
async def door(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Door]:
    tmp = tmp_path_factory.mktemp("redrive-serve")
    env = worker_env(stack.client, stack.settings, tmp / "data") | write_config(tmp)
    async with running_door(env, tmp / "serve.log") as d:
        yield d


@pytest_asyncio.fixture
async def http(door: Door) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=door.url, timeout=60) as c:
        yield c


async def _done_run(http: httpx.AsyncClient, name: str) -> str:
    started = await http.post("/v1/pipelines", json=one_step_pipeline(name), headers=bearer("ci"))
    assert started.status_code == 201, started.text
    wid: str = started.json()["workflow_id"]
    done = await http.get(
        f"/v1/pipelines/{wid}/result", params={"timeout": 30}, headers=bearer("ci")
    )
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    return wid


async def test_redrive_from_a_step_with_a_corrected_input(
    http: httpx.AsyncClient, stack: Stack
) -> None:
    wid = await _done_run(http, "api-redrive")
    url = f"/v1/pipelines/{wid}/redrive"
    fixed = {"data": {"title": "y"}, "schema": {"type": "object", "required": ["title"]}}
    body = {"from": "check", "input": {"check": fixed}, "new_idempotency_keys": True}
    r = await http.post(url, json=body, headers=bearer("ci"))
    assert r.status_code == 201, r.text
    doc = r.json()
    new = doc["workflow_id"]
    assert new == f"{wid}-redrive-1" and doc["redriven_from"] == wid and doc["tenant"] == "acme"
    assert r.headers["location"] == f"/v1/pipelines/{new}"
    done = await http.get(
        f"/v1/pipelines/{new}/result", params={"timeout": 30}, headers=bearer("ci")
    )
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    started = await PipelineClient(stack.client, stack.settings).started_input(new)
    assert started is not None
    assert started["steps"][0]["input"] == fixed
    assert started["resume_from"]["workflow_id"] == wid
    assert started["resume_from"]["new_keys"] is True
    assert "check" not in started["resume_from"]["steps"]


async def test_a_refused_redrive_starts_nothing(http: httpx.AsyncClient, stack: Stack) -> None:
    wid = await _done_run(http, "api-redrive-bad")
    url = f"/v1/pipelines/{wid}/redrive"
    ci = bearer("ci")
    # no key, another tenant's key
    error(await http.post(url, json={}), 401, "access_denied")
    error(await http.post(url, json={"from": "check"}, headers=bearer("beta")), 404, "not_found")
    # a succeeded run without `from`: nothing to redrive (empty body and {} alike)
    assert "nothing to redrive" in error(await http.post(url, headers=ci), 409, "invalid_input")
    error(await http.post(url, json={}, headers=ci), 409, "invalid_input")
    # bad requests: 400, each naming what is wrong
    checks = {
        "no top-level step": {"from": "nope"},
        "only the --from step": {"from": "check", "input": {"other": {}}},
        "--input check:": {"from": "check", "input": {"check": {"schema": {}}}},
        "body $.frm: unknown key": {"frm": "check"},
        "body $.input.check": {"from": "check", "input": {"check": [1]}},
    }
    for says, body in checks.items():
        message = error(await http.post(url, json=body, headers=ci), 400, "invalid_input")
        assert says in message, (says, message)
    not_json = await http.post(url, content=b"{nope", headers=ci)
    assert "not valid JSON" in error(not_json, 400, "invalid_input")
    deep = b'{"from": "check", "input": {"check": ' + b"[" * 300 + b"]" * 300 + b"}}"
    assert "nests deeper" in error(
        await http.post(url, content=deep, headers=ci), 400, "invalid_input"
    )
    big = b'{"from": "' + b"x" * MAX_BODY + b'"}'
    error(await http.post(url, content=big, headers=ci), 413, "payload_too_large")
    # none of them started a run
    runs = [w async for w in stack.client.list_workflows(f"WorkflowId STARTS_WITH '{wid}-'")]
    assert runs == []
    missing = await http.post("/v1/pipelines/no-such-run/redrive", json={}, headers=ci)
    error(missing, 404, "not_found")


async def test_redrive_a_failed_run_and_not_a_running_one(
    http: httpx.AsyncClient, stack: Stack
) -> None:
    ci = bearer("ci")
    # the door's stack has an aggregator that always fails: the run ends failed
    failing = {
        "name": "api-redrive-failed",
        "steps": [{"id": "a", "worker": "aggregator", "input": {"policy": "all", "branches": {}}}],
    }
    started = await http.post("/v1/pipelines", json=failing, headers=ci)
    assert started.status_code == 201, started.text
    wid = started.json()["workflow_id"]
    done = await http.get(f"/v1/pipelines/{wid}/result", params={"timeout": 30}, headers=ci)
    assert done.status_code == 200 and done.json()["status"] == "failed", done.text
    again = await http.post(f"/v1/pipelines/{wid}/redrive", headers=ci)
    assert again.status_code == 201, again.text
    assert again.json()["workflow_id"] == f"{wid}-redrive-1"

    waiting = {
        "name": "api-redrive-running",
        "steps": [{"id": "w", "wait": {"schema": {"type": "object"}, "timeout_seconds": 600}}],
    }
    running = await http.post("/v1/pipelines", json=waiting, headers=ci)
    assert running.status_code == 201, running.text
    rid = running.json()["workflow_id"]
    refused = await http.post(f"/v1/pipelines/{rid}/redrive", json={"from": "w"}, headers=ci)
    assert "still running" in error(refused, 409, "invalid_input")
    await stack.client.get_workflow_handle(rid).terminate(reason="test done")
