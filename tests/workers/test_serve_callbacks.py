"""Wait steps answered from outside: ``POST /v1/callbacks/{token}`` on a real
``aiworker serve`` process, and ``aiworker callback`` as its own process, against
the real dev server and a worker stack."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.front_door import MAX_BODY, Door, bearer, running_door, write_config
from support.front_door import api_error as error
from support.payloads import stack_settings
from support.procs import run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.testing import WorkflowEnvironment

from aiworker.schemas import names
from aiworker.workers.cli.common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

SIGNED = {
    "type": "object",
    "required": ["signed_by"],
    "properties": {"signed_by": {"type": "string"}},
}


def sign_pipeline(on_failure: str = "fail") -> dict[str, Any]:
    return {
        "name": "sign-http",
        "steps": [
            {
                "id": "sign",
                "wait": {"schema": SIGNED, "timeout_seconds": 3600},
                "on_failure": on_failure,
            },
            {
                "id": "send",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {"token": "${{ steps.sign.token }}"}},
            },
        ],
        "output": {"signed_by": "${{ steps.sign.outputs.signed_by }}"},
    }


@pytest_asyncio.fixture(scope="module")
async def stack(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(env.client, stack_settings(tmp_path_factory.mktemp("cb"))) as s:
        yield s


@pytest.fixture(scope="module")
def cli_env(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("cb-env")
    return worker_env(stack.client, stack.settings, tmp / "data") | write_config(tmp)


@pytest_asyncio.fixture(scope="module")
async def door(
    cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Door]:
    async with running_door(cli_env, tmp_path_factory.mktemp("cb-log") / "serve.log") as d:
        yield d


@pytest_asyncio.fixture
async def http(door: Door) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=door.url, timeout=30) as c:
        yield c


async def started(http: httpx.AsyncClient, pipeline: dict[str, Any], stack: Stack) -> Any:
    """Start ``pipeline`` through the door (tenant acme); its id and sign's token."""
    r = await http.post("/v1/pipelines", json=pipeline, headers=bearer("ci"))
    assert r.status_code == 201, r.text
    wid = r.json()["workflow_id"]
    handle = stack.client.get_workflow_handle(wid)

    async def token() -> str | None:
        # the test reads what `send` was handed, as the other system would receive it
        p = await handle.query(names.PROGRESS_QUERY, True)
        send = p["steps"]["send"]
        if send["status"] != "succeeded":
            return None
        found: str = send["outputs"]["result"]["token"]
        return found

    return wid, await wait_until(token, "the send step to hand out the token")


async def test_complete_over_http_with_every_refusal(http: httpx.AsyncClient, stack: Stack) -> None:
    wid, token = await started(http, sign_pipeline(), stack)
    url = f"/v1/callbacks/{token}"
    ok = {"outputs": {"signed_by": "ann"}}

    status = (await http.get(f"/v1/pipelines/{wid}", headers=bearer("ci"))).json()
    assert status["progress"]["steps"]["sign"]["status"] == "waiting"
    assert [w["step"] for w in status["progress"]["awaiting_callback"]] == ["sign"]

    unknown = error(
        await http.post("/v1/callbacks/nope", json=ok, headers=bearer("ci")), 404, "not_found"
    )
    foreign = error(await http.post(url, json=ok, headers=bearer("beta")), 404, "not_found")
    assert foreign == unknown  # another tenant's token answers as no token at all
    assert (await http.post(url, json=ok)).status_code == 401

    off = await http.post(url, json={"outputs": {"signed_by": 7}}, headers=bearer("ci"))
    message = error(off, 422, "invalid_input")
    assert "signed_by" in message and off.json()["error"]["field"] == "outputs['signed_by']"
    both = {"outputs": {"signed_by": "a"}, "error": {"message": "b"}}
    assert "either" in error(
        await http.post(url, json=both, headers=bearer("ci")), 422, "invalid_input"
    )
    shape = await http.post(url, json={"output": {}}, headers=bearer("ci"))
    assert "output" in error(shape, 422, "invalid_input")
    big = {"outputs": {"signed_by": "x" * (MAX_BODY + 1)}}
    error(await http.post(url, json=big, headers=bearer("ci")), 413, "payload_too_large")
    deep: Any = "x"
    for _ in range(200):
        deep = {"d": deep}
    too_deep = await http.post(url, json={"outputs": deep}, headers=bearer("ci"))
    assert "nests deeper" in error(too_deep, 400, "invalid_input")

    beat = await http.post(f"{url}/heartbeat", headers=bearer("ci"))
    assert beat.status_code == 200, beat.text
    assert beat.json()["status"] == "waiting" and beat.json()["timeout_at"]
    longer = await http.post(
        f"{url}/heartbeat", json={"extend_seconds": 7200}, headers=bearer("ci")
    )
    assert longer.json()["timeout_at"] > beat.json()["timeout_at"]

    done = await http.post(url, json=ok, headers=bearer("ci"))
    assert done.status_code == 200 and done.json() == {"step": "sign", "status": "completed"}
    again = await http.post(url, json=ok, headers=bearer("ci"))
    assert again.status_code == 200 and again.json()["repeat"] is True
    other = await http.post(url, json={"outputs": {"signed_by": "bob"}}, headers=bearer("ci"))
    error(other, 409, "invalid_input")

    result = await http.get(f"/v1/pipelines/{wid}/result", headers=bearer("ci"))
    assert result.json()["status"] == "succeeded", result.text
    assert result.json()["output"] == {"signed_by": "ann"}
    # after the run ended: the same answer still answers the first reply, another 409
    after = await http.post(url, json=ok, headers=bearer("ci"))
    assert after.status_code == 200 and after.json()["repeat"] is True
    late = await http.post(url, json={"outputs": {"signed_by": "z"}}, headers=bearer("ci"))
    error(late, 409, "invalid_input")
    beat_late = await http.post(f"{url}/heartbeat", headers=bearer("ci"))
    assert "nothing to extend" in error(beat_late, 409, "invalid_input")


async def test_fail_over_http_continues_the_pipeline(http: httpx.AsyncClient, stack: Stack) -> None:
    wid, token = await started(http, sign_pipeline(on_failure="continue"), stack)
    failed = await http.post(
        f"/v1/callbacks/{token}", json={"error": {"message": "declined"}}, headers=bearer("ci")
    )
    assert failed.status_code == 200 and failed.json()["status"] == "failed"
    result = (await http.get(f"/v1/pipelines/{wid}/result", headers=bearer("ci"))).json()
    assert result["status"] == "partial"
    sign = result["steps"]["sign"]
    assert sign["error_code"] == "callback_failed" and "declined" in sign["error_message"]


async def test_the_cli_heartbeats_refuses_and_completes(
    http: httpx.AsyncClient, stack: Stack, cli_env: dict[str, str]
) -> None:
    wid, token = await started(http, sign_pipeline(), stack)

    async def cli(*args: str) -> tuple[int, str, str]:
        # in a thread: the worker stack runs on this event loop
        proc = await asyncio.to_thread(run_cli_module, ["callback", token, *args], cli_env)
        return proc.returncode, proc.stdout, proc.stderr

    code, out, err = await cli("--heartbeat", "--extend", "600")
    assert code == EXIT_OK, err
    assert json.loads(out)["status"] == "waiting"
    code, _, err = await cli("--outputs", '{"signed_by": 1}')
    assert code == EXIT_USAGE and "422" in err and "signed_by" in err
    code, _, err = await cli("--outputs", "{nope")
    assert code == EXIT_USAGE and "not valid JSON" in err
    code, out, _ = await cli("--outputs", '{"signed_by": "cli"}')
    assert code == EXIT_OK and json.loads(out) == {"step": "sign", "status": "completed"}
    code, _, err = await cli("--fail", "too late")
    assert code == EXIT_FAILED and "409" in err
    forged = ["callback", token[:-1] + ("A" if token[-1] != "A" else "B"), "--fail", "x"]
    proc = await asyncio.to_thread(run_cli_module, forged, cli_env)
    assert proc.returncode == EXIT_NOT_FOUND and "unknown callback token" in proc.stderr
    result = (await http.get(f"/v1/pipelines/{wid}/result", headers=bearer("ci"))).json()
    assert result["output"] == {"signed_by": "cli"}


def test_a_path_without_the_serve_public_url(tmp_path: Path) -> None:
    from aiworker.config.settings import Settings, SettingsError
    from aiworker.schemas.callbacks import callback_url

    assert callback_url(None, "t") == "/v1/callbacks/t"
    s = Settings.from_env({"AIWORKER_SERVE_PUBLIC_URL": "https://api.example.com/"})
    assert callback_url(s.serve_public_url, "t") == "https://api.example.com/v1/callbacks/t"
    with pytest.raises(SettingsError, match="SERVE_PUBLIC_URL"):
        Settings.from_env({"AIWORKER_SERVE_PUBLIC_URL": "ftp://x"})
