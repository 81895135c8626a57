"""A for_each step's items read back after the run, inline or by reference, on a
real Temporal server: ``PipelineClient.items``, ``aiworker items`` and the front
door's ``GET /v1/pipelines/{id}/steps/{step}/items`` (each as its own process),
their lookups' failures, and a damaged stored part."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from conftest import running_stack
from support.front_door import bearer, running_door, write_config
from support.payloads import client_for, stack_settings
from support.procs import run_cli_module, worker_env
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from aiworker.activities.artifacts import FileArtifactStore
from aiworker.activities.errors import AccessDeniedError, InvalidInputError, NotFoundError
from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import ItemsRef
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.client.step_items import ItemsPartError, StepItemsError
from aiworker.workers.evals.recorded import CallQuery, UnreadableRun, recorded_calls

N = 12
INLINE = 5  # foreach_inline_items: `each` (12 items) by reference, `small` (3) inline

PIPELINE: dict[str, Any] = {
    "name": "items-read",
    "tenant": "acme",
    "inputs": {"items": list(range(N))},
    "steps": [
        {
            "id": "each",
            "worker": "validator",
            "for_each": "${{ inputs.items }}",
            "chunk_size": 3,
            "max_parallel": 4,
            "input": {"data": "${{ item }}", "schema": {}},
        },
        {
            "id": "small",
            "worker": "validator",
            "for_each": [101, 102, 103],
            "input": {"data": "${{ item }}", "schema": {}},
        },
        {
            "id": "after",
            "worker": "validator",
            "depends_on": ["each"],
            "input": {"data": "${{ steps.each.outputs.items }}", "schema": {}},
        },
    ],
    "output": {"items": "${{ steps.each.outputs.items }}"},
}

# every 5th item (0, 5, 10) fails: null in the list
EXPECTED = [None if i % 5 == 0 else {"n": i} for i in range(N)]
SMALL = [{"n": 101}, {"n": 102}, {"n": 103}]


async def _echo(req: dict[str, Any]) -> dict[str, Any]:
    n = req["input"]["data"]
    if isinstance(n, int) and n % 5 == 0:
        raise fail("validation_failed", f"item {n} fails")
    return {"n": n}


async def _run(
    env: WorkflowEnvironment, tmp_path: Path, pipeline: dict[str, Any] = PIPELINE
) -> tuple[Client, Settings, str, Any]:
    settings = stack_settings(tmp_path, foreach_inline_items=INLINE)
    client = client_for(env, settings)
    acts = {"validator": standin("validator", _echo)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        handle = await stack.start(pipeline)
        result = await handle.result()
    return client, settings, handle.id, result


def _cli_env(client: Client, settings: Settings) -> dict[str, str]:
    """The deployment's settings as the environment of an ``aiworker`` process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["TEMPORAL_NAMESPACE"] = client.namespace
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = settings.task_queue_suffix
    env["AIWORKER_DATA_DIR"] = str(settings.data_dir)
    return env


async def _items_cli(env: dict[str, str], *args: str) -> Any:
    return await asyncio.to_thread(run_cli_module, ["items", *args], env)


def _part_file(ref: ItemsRef, n: int) -> Path:
    return Path(unquote(urlsplit(ref.parts[n].uri).path))


async def test_items_by_reference_and_inline_read_back(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client, settings, wid, result = await _run(env, tmp_path)

    # the result holds a reference for `each`, the list for `small`
    ref = ItemsRef.of(result.steps["each"].outputs["items"])
    assert ref is not None
    assert ref.count == N
    assert len(ref.parts) == 4  # one per leaf chunk of 3
    assert result.steps["small"].outputs["items"] == SMALL
    # inside the pipeline the reference was the list
    assert result.output["items"] == EXPECTED

    pipelines = PipelineClient(client, settings)
    assert await pipelines.items(wid, "each") == EXPECTED
    assert await pipelines.items(wid, "small") == SMALL
    assert await pipelines.items(wid, "each", tenant="acme") == EXPECTED

    with pytest.raises(StepItemsError) as no_step:
        await pipelines.items(wid, "nope")
    assert no_step.value.code == "not_found"
    assert "no step 'nope'" in str(no_step.value)
    with pytest.raises(StepItemsError) as not_each:
        await pipelines.items(wid, "after")
    assert not_each.value.code == "invalid_input"
    assert "not a for_each step" in str(not_each.value)
    with pytest.raises(StepItemsError) as other:
        await pipelines.items(wid, "each", tenant="globex")
    assert other.value.code == "access_denied"

    cli_env = _cli_env(client, settings)
    proc = await _items_cli(cli_env, wid, "each")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:3] == ["null", '{"n":1}', '{"n":2}']
    assert [json.loads(line) for line in proc.stdout.splitlines()] == EXPECTED

    proc = await _items_cli(cli_env, wid, "small")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == SMALL

    proc = await _items_cli(cli_env, wid, "nope")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f"aiworker: workflow {wid!r}: the pipeline has no step 'nope' (not_found)"
    )

    proc = await _items_cli(cli_env, wid, "after")
    assert proc.returncode == 2
    assert "step 'after' is not a for_each step" in proc.stderr
    assert "(invalid_input)" in proc.stderr

    proc = await _items_cli(cli_env, "no-such-workflow", "each")
    assert proc.returncode == 3
    assert "workflow 'no-such-workflow' not found" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_a_damaged_part_reads_as_its_code(env: WorkflowEnvironment, tmp_path: Path) -> None:
    client, settings, wid, result = await _run(env, tmp_path)
    ref = ItemsRef.of(result.steps["each"].outputs["items"])
    assert ref is not None
    pipelines = PipelineClient(client, settings)
    cli_env = _cli_env(client, settings)

    # changed bytes, still a valid part: the content address no longer matches
    corrupt = _part_file(ref, 1)
    corrupt.write_bytes(corrupt.read_bytes().replace(b'"n":', b'"n": ', 1))
    with pytest.raises(ItemsPartError) as bad:
        await pipelines.items(wid, "each")
    assert bad.value.code == "invalid_input"
    assert bad.value.part == ref.parts[1].uri
    assert "is corrupt" in str(bad.value)
    proc = await _items_cli(cli_env, wid, "each")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "step 'each': an items part could not be read" in proc.stderr
    assert "(invalid_input)" in proc.stderr
    assert "Traceback" not in proc.stderr

    # a part gone from the store
    _part_file(ref, 2).unlink()
    corrupt.unlink()
    with pytest.raises(ItemsPartError) as gone:
        await pipelines.items(wid, "each")
    assert gone.value.code == "not_found"
    proc = await _items_cli(cli_env, wid, "each")
    assert proc.returncode == 1
    assert "not found (not_found)" in proc.stderr


async def test_the_front_door_serves_a_steps_items(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, foreach_inline_items=INLINE)
    client = client_for(env, settings)
    acts = {"validator": standin("validator", _echo)}
    # the door reads the store the workers write (the same data directory)
    door_env = worker_env(client, settings, settings.data_dir) | write_config(tmp_path)
    async with (
        running_stack(client, settings, replace_activities=acts),
        running_door(door_env, tmp_path / "serve.log") as door,
        httpx.AsyncClient(base_url=door.url, timeout=60, headers=bearer("ci")) as http,
    ):
        started = await http.post("/v1/pipelines", json=PIPELINE)
        assert started.status_code == 201, started.text
        wid = started.json()["workflow_id"]
        done = await http.get(f"/v1/pipelines/{wid}/result", params={"timeout": 60})
        assert done.status_code == 200, done.text
        ref = ItemsRef.of(done.json()["steps"]["each"]["outputs"]["items"])
        assert ref is not None

        url = f"/v1/pipelines/{wid}/steps"
        each = await http.get(f"{url}/each/items")
        assert each.status_code == 200, each.text
        assert each.json() == {"workflow_id": wid, "step": "each", "count": N, "items": EXPECTED}
        small = await http.get(f"{url}/small/items")
        assert small.json()["items"] == SMALL

        nope = await http.get(f"{url}/nope/items")
        assert nope.status_code == 404
        assert nope.json()["error"]["code"] == "not_found"
        after = await http.get(f"{url}/after/items")
        assert after.status_code == 400
        assert after.json()["error"]["code"] == "invalid_input"
        assert "not a for_each step" in after.json()["error"]["message"]
        # another tenant's key: the pipeline does not exist for it
        other = await http.get(f"{url}/each/items", headers=bearer("beta"))
        assert other.status_code == 404
        assert other.json()["error"]["code"] == "not_found"

        _part_file(ref, 0).unlink()
        gone = await http.get(f"{url}/each/items")
        assert gone.status_code == 500
        assert gone.json()["error"]["code"] == "not_found"
        message = gone.json()["error"]["message"]
        assert "step 'each'" in message and str(tmp_path) not in message


async def test_aiworker_items_from_another_folder_reads_the_runs_own_store(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """``aiworker items`` run in a folder beside the stack's (TEMPORAL_ADDRESS set, no
    AIWORKER_DATA_DIR: its own ``./.aiworker``) reads the parts where the run's
    result says they are; when they are not there, the error names the store it
    has and the setting to change, and never blames tenancy."""
    client, settings, wid, result = await _run(env, tmp_path)
    ref = ItemsRef.of(result.steps["each"].outputs["items"])
    assert ref is not None
    beside = tmp_path / "beside"
    beside.mkdir()
    cli_env = _cli_env(client, settings)
    del cli_env["AIWORKER_DATA_DIR"]

    proc = await asyncio.to_thread(run_cli_module, ["items", wid, "each"], cli_env, cwd=beside)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == EXPECTED

    # the stack's store is gone from this machine: a part it names cannot be read
    artifacts = _part_file(ref, 0).parents[2]
    artifacts.rename(artifacts.with_name("moved"))
    proc = await asyncio.to_thread(run_cli_module, ["items", wid, "each"], cli_env, cwd=beside)
    assert proc.returncode == 1, proc.stderr
    assert "is not in this process's artifact store" in proc.stderr
    assert str(beside / ".aiworker" / "artifacts") in proc.stderr
    assert "AIWORKER_DATA_DIR" in proc.stderr and "(not_found)" in proc.stderr
    assert "belong" not in proc.stderr and "access_denied" not in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_a_run_whose_store_is_gone_is_left_out_of_a_quote_not_its_end(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The recorded-call reader meets a run whose payloads are in a store this
    process cannot read: evals get the store's ``not_found``; the quote leaves
    the run out, lists it, and ``aiworker check --quote`` still prints a quote
    (exit 0) and says which run it left out (it ended in ``unexpected error``)."""
    name = f"items-gone-{uuid.uuid4().hex[:8]}"
    client, settings, wid, result = await _run(env, tmp_path, {**PIPELINE, "name": name})
    assert ItemsRef.of(result.steps["each"].outputs["items"]) is not None  # spilled
    query = CallQuery(worker="validator", tenant="acme", pipeline=name, status="succeeded")

    async def listed() -> bool:
        return [w.id async for w in client.list_workflows(query.visibility_query())] == [wid]

    await wait_until(listed, f"{wid} in visibility")
    assert [c async for c in recorded_calls(client, query)]  # readable while the store is here
    # the stack's store is gone from this machine (its spilled payloads with it)
    settings.data_dir.rename(settings.data_dir.with_name("moved"))

    with pytest.raises(NotFoundError):
        _ = [c async for c in recorded_calls(client, query)]
    unreadable: list[UnreadableRun] = []
    assert [c async for c in recorded_calls(client, query, unreadable=unreadable)] == []
    assert [(u.workflow_id, u.code) for u in unreadable] == [(wid, "not_found")]

    spec_file = tmp_path / "quote.json"
    spec_file.write_text(json.dumps({**PIPELINE, "name": name}))
    proc = await asyncio.to_thread(
        run_cli_module, ["check", "--quote", "--json", str(spec_file)], _cli_env(client, settings)
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert "left out" in proc.stderr and "AIWORKER_DATA_DIR" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["pipeline"] == name


async def test_a_workers_store_reads_only_its_own_and_blames_tenancy_only_inside_it(
    tmp_path: Path,
) -> None:
    """The artifact store itself: another tenant's artifact in this store is
    ``access_denied``; one in another data directory is ``not_found`` naming this
    store for a worker (``elsewhere`` off: a step's input could name any path),
    and read where it is by a client that reads results (``elsewhere``), only
    when it is that tenant's and its bytes hash to its name."""
    other = FileArtifactStore(tmp_path / "other-stack")
    mine = FileArtifactStore(tmp_path / "here")
    reader = FileArtifactStore(tmp_path / "here", elsewhere=True)
    theirs = await other.put("acme", b"a part")
    own = await mine.put("acme", b"my part")

    with pytest.raises(AccessDeniedError, match="does not belong to tenant 'globex'"):
        await mine.get("globex", own)
    with pytest.raises(NotFoundError) as foreign:
        await mine.get("acme", theirs)
    assert "not in this process's artifact store" in foreign.value.message
    assert str(tmp_path / "here") in foreign.value.message
    assert await reader.get("acme", theirs) == b"a part"
    with pytest.raises(AccessDeniedError, match="tenant 'acme''s folder of another"):
        await reader.get("globex", theirs)
    not_an_artifact = tmp_path / "secret.txt"
    not_an_artifact.write_text("x")
    with pytest.raises(InvalidInputError):
        await reader.get("acme", not_an_artifact.as_uri())
    await asyncio.to_thread(Path(urlsplit(theirs.uri).path).write_bytes, b"changed")
    with pytest.raises(InvalidInputError, match="corrupt"):
        await reader.get("acme", theirs)
