"""A run no worker picks up says so (issue 47, "what a loaded machine shows"):
``aiworker run`` prints one line on stderr naming the queue, the build its work
goes to and the pollers seen; the front door's status carries it as
``waiting_for_worker``; ``aiworker workers`` says per queue whether a poller
serves the current build. Each against the real dev server, with the real
commands as processes; then a worker starts (or its build is made current) and
the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
from conftest import running_stack
from jsonschema import Draft202012Validator
from support.front_door import bearer, running_door, write_config
from support.payloads import stack_settings
from support.pipelines import one_step_pipeline
from support.procs import WorkerProcess, run_cli_module, worker_env
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.pollers import Kind, queue_service
from aiworker.workers.process.deployments import deployment_name, ensure_current, set_current

HINT = "no worker has picked up"
# A hint comes after NOTICE_SECONDS; a loaded machine may take much longer to start
# the command and the server to answer.
HINT_TIMEOUT = 90.0


def run_command(tmp: Path, env: dict[str, str], *flags: str) -> WorkerProcess:
    """``aiworker run pipeline.json FLAGS`` as its own process, output in a log."""
    pipeline = tmp / "pipeline.json"
    pipeline.write_text(json.dumps(one_step_pipeline("unserved")))
    cmd = [sys.executable, "-m", "aiworker.workers.cli.main", "run", str(pipeline), *flags]
    return WorkerProcess(cmd, env, tmp / "run.log", cwd=tmp)


async def ended(proc: WorkerProcess, timeout: float = 120.0) -> int:
    """The exit code of ``proc``, waiting for it (bounded)."""
    await wait_until(lambda: proc.proc.poll() is not None, "aiworker run to end", timeout=timeout)
    code: int = proc.proc.wait()
    return code


async def test_aiworker_run_says_once_that_no_worker_polls_then_goes_on_when_one_starts(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path)
    queue = settings.queue(names.PIPELINES_QUEUE)
    env = worker_env(client, settings, tmp_path / "data")
    run = run_command(tmp_path, env)
    try:
        await wait_until(lambda: HINT in run.output(), "the hint", timeout=HINT_TIMEOUT)
        # the hint names the queue, where its work goes, and that nobody polls it
        [line] = [x for x in run.output().splitlines() if HINT in x]
        assert line.startswith("aiworker: "), line
        assert f"task queue {queue} sends it to unversioned workers" in line, line
        assert "pollers seen: no poller" in line, line
        assert "start a worker on " + queue in line, line
        async with running_stack(client, settings):
            code = await ended(run)
        out = run.output()
        assert code == 0, out
        assert "succeeded" in out, out
        assert out.count(HINT) == 1, out  # said once, not repeated
    finally:
        run.close()


async def test_aiworker_run_json_names_the_build_that_polls_and_the_command_to_make_it_current(
    client: Client, tmp_path: Path
) -> None:
    # a versioned worker of build v2 polls, but its build is not current (the operator
    # decides): a new run goes to the queue's current build, which nobody serves
    settings = stack_settings(tmp_path, versioning=True, local_activities=False)
    v2 = settings.model_copy(update={"build_id": "v2", "deployment_current": "never"})
    env = worker_env(client, settings, tmp_path / "data")
    async with running_stack(client, v2):
        assert await ensure_current(client, v2, wait_seconds=60) is None
        run = run_command(tmp_path, env, "--json")
        try:
            await wait_until(lambda: HINT in run.output(), "the hint", timeout=HINT_TIMEOUT)
            [line] = [x for x in run.output().splitlines() if HINT in x]
            assert "(build v2, " in line, line  # the poller seen, with its build
            assert "aiworker deployment set-current v2" in line, line
            await set_current(client, deployment_name(settings), "v2", wait_seconds=30)
            code = await ended(run)
        finally:
            run.close()
    out = run.output()
    assert code == 0, out
    assert out.count(HINT) == 1, out
    assert '"status": "succeeded"' in out, out


async def status_of(http: httpx.AsyncClient, workflow_id: str) -> dict[str, Any]:
    r = await http.get(f"/v1/pipelines/{workflow_id}", headers=bearer("ci"))
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


async def test_the_front_door_status_says_which_worker_a_waiting_run_needs(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path)
    queue = settings.queue(names.PIPELINES_QUEUE)
    env = worker_env(client, settings, tmp_path / "data") | write_config(tmp_path)
    async with (
        running_door(env, tmp_path / "serve.log") as door,
        httpx.AsyncClient(base_url=door.url, timeout=30) as http,
    ):
        r = await http.post(
            "/v1/pipelines", json=one_step_pipeline("unserved"), headers=bearer("ci")
        )
        assert r.status_code == 201, r.text
        wid = r.json()["workflow_id"]

        async def waiting() -> dict[str, Any] | None:
            doc = await status_of(http, wid)
            found: dict[str, Any] | None = doc["waiting_for_worker"]
            return found

        hint = await wait_until(waiting, "waiting_for_worker", timeout=HINT_TIMEOUT)
        assert hint["task_queue"] == queue, hint
        assert hint["build_id"] is None and hint["current_build"] is None, hint
        assert hint["served"] is False and hint["pollers"] == [], hint
        assert hint["waited_seconds"] >= 5, hint
        assert HINT in hint["message"] and queue in hint["message"], hint
        waiting_doc = await status_of(http, wid)
        assert waiting_doc["progress"] is None, waiting_doc
        # the body is what the OpenAPI document says of the route
        document = (await http.get("/openapi.json")).json()
        ok = document["paths"]["/v1/pipelines/{workflow_id}"]["get"]["responses"]["200"]
        ref = ok["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/PipelineStatus", ok
        status_schema = document["components"]["schemas"]["PipelineStatus"]
        assert "waiting_for_worker" in status_schema["properties"], status_schema
        Draft202012Validator({**document, "$ref": ref}).validate(waiting_doc)

        async with running_stack(client, settings):

            async def moving() -> bool:
                doc = await status_of(http, wid)
                return doc["waiting_for_worker"] is None

            await wait_until(moving, "the run to be picked up", timeout=60)
            done = await http.get(
                f"/v1/pipelines/{wid}/result", params={"timeout": 60}, headers=bearer("ci")
            )
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "succeeded", done.text
        assert (await status_of(http, wid))["waiting_for_worker"] is None


def queue_lines(stdout: str, settings: Settings) -> dict[tuple[str, str], str]:
    """``aiworker workers``' task-queue lines, by queue and kind."""
    return {
        (line.split()[0], line.split()[1]): line
        for line in stdout.splitlines()
        if line.split() and line.split()[0].endswith(settings.task_queue_suffix)
    }


async def test_aiworker_workers_says_per_queue_whether_a_poller_serves_the_current_build(
    client: Client, tmp_path: Path
) -> None:
    settings = stack_settings(tmp_path, versioning=True, local_activities=False)
    pipelines = settings.queue(names.PIPELINES_QUEUE)
    scrape = settings.queue(names.SCRAPE_QUEUE)
    env = worker_env(client, settings, tmp_path / "data")

    nobody = await asyncio.to_thread(run_cli_module, ["workers"], env, cwd=tmp_path)
    assert nobody.returncode == 0, nobody.stderr
    lines = queue_lines(nobody.stdout, settings)
    # the pipelines queue's workflows and activities, each worker's queue's activities
    kinds: list[tuple[str, Kind]] = [
        (pipelines, "workflow"),
        (pipelines, "activity"),
        (scrape, "activity"),
    ]
    assert set(kinds) <= set(lines), nobody.stdout
    for key in kinds:
        assert lines[key].split()[2:6] == ["none", "(unversioned)", "NO", "no"], lines[key]
        assert lines[key].endswith("no poller"), lines[key]

    v1 = settings.model_copy(update={"build_id": "v1"})
    async with running_stack(client, v1):
        assert await ensure_current(client, v1, wait_seconds=60) == "v1"

        async def routed() -> bool:  # the queues learn their current build a moment later
            for queue, kind in kinds:
                q = await queue_service(client, queue, kind)
                if not (q.current_build == "v1" and q.serves_current):
                    return False
            return True

        await wait_until(routed, "the queues to route to v1 and be served", timeout=60)
        served = await asyncio.to_thread(run_cli_module, ["workers"], env, cwd=tmp_path)
        as_json = await asyncio.to_thread(run_cli_module, ["workers", "--json"], env, cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    lines = queue_lines(served.stdout, settings)
    for key in kinds:
        assert lines[key].split()[2:4] == ["v1", "yes"], lines[key]
        assert "(build v1, " in lines[key], lines[key]
    doc = json.loads(as_json.stdout)
    service = doc["web-scrape"]["task_queue_service"]
    assert (service["task_queue"], service["current_build"], service["serves_current"]) == (
        scrape,
        "v1",
        True,
    )
    assert [p["build_id"] for p in service["pollers"]] == ["v1"]
