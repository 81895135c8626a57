"""``aiworker serve`` checks a pipeline off its event loop, within the caps (issue 31,
item 3): the 17,000-pattern pipeline is refused naming the cap, and ``/healthz``
answers while the largest check the caps allow runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.check_load import heavy_under_caps, many_patterns
from support.front_door import Door, bearer, running_door, write_config
from support.payloads import stack_settings
from support.procs import worker_env
from temporalio.testing import WorkflowEnvironment

BODY_LIMIT = 4 * 1024 * 1024  # the 1 MiB pipeline must reach the check
# A bound on each wait so the loop ends, not a speed figure (bench/check_caps.py measures
# that): a fresh clone's CI run saw one /healthz take over 1 s on a loaded 2-core machine.
# What shows the loop is free is that /healthz answered while the check ran.
HEALTHZ_WAIT = 15.0


@pytest_asyncio.fixture(scope="module")
async def stack(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    settings = stack_settings(tmp_path_factory.mktemp("serve-checks-stack"))
    async with running_stack(env.client, settings) as s:
        yield s


@pytest_asyncio.fixture(scope="module")
async def door(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Door]:
    tmp = tmp_path_factory.mktemp("serve-checks")
    env = worker_env(stack.client, stack.settings, tmp / "data") | write_config(tmp)
    env["AIWORKER_SERVE_MAX_BODY_BYTES"] = str(BODY_LIMIT)
    async with running_door(env, tmp / "serve.log") as d:
        yield d


async def test_the_front_door_refuses_17000_patterns_naming_the_cap(door: Door) -> None:
    async with httpx.AsyncClient(base_url=door.url, timeout=60) as http:
        r = await http.post(
            "/v1/pipelines", content=json.dumps(many_patterns()), headers=bearer("ci")
        )
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["error"]["code"] == "invalid_input"
    assert "the cap is 256 (MAX_PIPELINE_PATTERNS)" in r.text


async def test_healthz_answers_while_a_large_check_runs(door: Door) -> None:
    # Under every cap, as much to compile as they allow (about a second of CPU),
    # and new to the process's caches. Before, the check held the event loop: a
    # /healthz sent meanwhile waited for the whole check.
    body = json.dumps(heavy_under_caps(uuid.uuid4().hex, bad_pattern="(a)\\1"))
    answered_during = 0
    async with httpx.AsyncClient(base_url=door.url, timeout=60) as http:
        assert (await http.get("/healthz")).status_code == 200
        post = asyncio.create_task(http.post("/v1/pipelines", content=body, headers=bearer("ci")))
        while not post.done():
            r = await asyncio.wait_for(http.get("/healthz"), timeout=HEALTHZ_WAIT)
            assert r.status_code == 200
            if not post.done():
                answered_during += 1
        r = await post
    # the check did run (and found the pattern RE2 refuses), and /healthz kept answering
    assert r.status_code == 400, r.text
    assert "is not supported" in r.text
    assert answered_during >= 3
