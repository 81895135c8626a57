"""The live registry through real worker processes and every client (issue #28):
``aiworker worker`` publishes what it serves; ``check``, ``PipelineClient``,
``serve`` and ``workers`` read it (a plugin worker they lack locally is accepted
with its input checked, an unknown model alias is refused, a spec conflict is
reported); a stopped process leaves the registry (withdrawn on SIGTERM, expired
after SIGKILL) and ``conformance`` then fails in seconds; a registry nobody runs
is a one-line reason and the local fallback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import running_stack
from module_workers import SPEC as WORD_COUNT
from support.front_door import bearer, running_door, write_config
from support.procs import WorkerProcess, worker_env
from support.registry import entry, publish_raw
from support.waiting import wait_until
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.schemas.live_registry import ProcessEntry
from aiworker.schemas.pipeline_check import PipelineSpecError
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.process.deployments import build_id
from aiworker.workers.process.live_registry import read_registry

AIWORKER = str(Path(sys.executable).parent / "aiworker")
HERE = Path(__file__).parent

WORD_COUNT_PIPELINE = {
    "name": "count",
    "inputs": {"text": "three short words"},
    "steps": [{"id": "count", "worker": "word-count", "input": {"text": "${{ inputs.text }}"}}],
    "output": {"words": "${{ steps.count.outputs.words }}"},
}
GPT5_PIPELINE = {
    "name": "ask",
    "steps": [{"id": "ask", "worker": "llm-call", "input": {"prompt": "hi", "model": "gpt5"}}],
}


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIWORKER, *args], env=env, capture_output=True, text=True, timeout=90)


@contextmanager
def worker_process(
    client: Client, settings: Settings, tmp: Path, name: str, *args: str, **env: str
) -> Iterator[WorkerProcess]:
    """``aiworker worker ARGS`` on the test's queue family, stopped by PID."""
    full = worker_env(client, settings, tmp / "data") | env
    proc = WorkerProcess([AIWORKER, "worker", *args], full, tmp / f"{name}.log")
    try:
        yield proc
    finally:
        proc.terminate(timeout=15)
        proc.close()


def identity_of(proc: WorkerProcess) -> str:
    return f"{proc.pid}@{socket.gethostname()}"


async def listed(client: Client, settings: Settings) -> dict[str, ProcessEntry]:
    reg = await read_registry(client, settings.task_queue_suffix, secret=settings.registry_secret)
    return {p.identity: p for p in (reg.processes if reg is not None else ())}


async def wait_listed(
    client: Client, settings: Settings, proc: WorkerProcess, present: bool = True
) -> None:
    async def check() -> bool:
        if present and proc.proc.poll() is not None:
            raise AssertionError(f"worker exited: {proc.output()}")
        try:
            return (identity_of(proc) in await listed(client, settings)) == present
        except Exception:  # the registry's worker is still starting
            return False

    state = "listed" if present else "gone from the registry"
    await wait_until(check, lambda: f"{identity_of(proc)} {state}: {proc.output()}", timeout=60)


async def test_a_plugin_worker_published_by_its_process_is_known_to_every_client(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    plugin_env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        "AIWORKER_WORKER_MODULES": "module_workers",
        # the worker's models: the checking shell configures none
        "AIWORKER_LLM_BASE_URL": "http://127.0.0.1:9/v1",
        "AIWORKER_LLM_MODEL": "m",
    }
    queues = ["-q", names.PIPELINES_QUEUE, "-q", names.LLM_QUEUE]
    env = worker_env(client, settings, tmp_path / "data")  # a shell without the plugin
    with worker_process(client, settings, tmp_path, "a", *queues, **plugin_env) as a:
        await wait_listed(client, settings, a)
        entry_a = (await listed(client, settings))[identity_of(a)]
        assert entry_a.build_id == build_id(Settings())
        assert entry_a.task_queues == [settings.queue(q) for q in queues[1::2]]
        assert {w.worker_id for w in entry_a.workers if w.served} == {
            "word-count",
            names.VALIDATOR,
            names.AGGREGATOR,
            names.PUBLISH,
            names.LLM_CALL,
            names.LLM_AGENT,
            names.MCP_CALL,
        }
        # names and provider kinds only: no URL, no key
        assert [m.model_dump() for m in entry_a.models or []] == [
            {"name": "default", "provider": "openai"}
        ]
        assert "127.0.0.1:9" not in json.dumps(entry_a.model_dump(mode="json"))

        # PipelineClient: accepts the worker it lacks, with the same input checks
        pipelines = PipelineClient(client, settings)
        with pytest.raises(PipelineSpecError) as bad:
            await pipelines.check_live(
                {
                    **WORD_COUNT_PIPELINE,
                    "steps": [{"id": "count", "worker": "word-count", "input": {"txt": "a"}}],
                }
            )
        assert "text" in str(bad.value)
        handle = await pipelines.start(WORD_COUNT_PIPELINE)
        result = await handle.result()
        assert (result.status, result.output) == ("succeeded", {"words": 3}), result
        view = await pipelines.worker_view()
        assert view.describe() == "the live registry (1 process)"

        # aiworker check: the live registry, without importing the scraper or the plugin
        f = tmp_path / "count.json"
        f.write_text(json.dumps(WORD_COUNT_PIPELINE))
        probe = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE, str(f)],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert probe.stdout.splitlines()[-1] == "[]", probe.stdout
        assert f"ok: {f} (1 step)" in probe.stdout
        assert "aiworker: checked against the live registry (1 process)" in probe.stderr

        # aiworker run and schedule create, from the same shell: accepted, started
        ran = cli(["run", str(f), "--json"], env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout)["output"] == {"words": 3}
        sid = f"count-{settings.task_queue_suffix}"
        created = cli(
            ["schedule", "create", str(f), "-s", sid, "--interval", "1h", "--paused"], env
        )
        try:
            assert created.returncode == 0, created.stdout + created.stderr
        finally:
            await client.get_schedule_handle(sid).delete()

        # a worker no live process serves: refused at start, naming it and the
        # registry's list, then saying what it was checked against
        n = tmp_path / "nobody.json"
        n.write_text(json.dumps({"name": "n", "steps": [{"id": "x", "worker": "nobody"}]}))
        nobody_run = cli(["run", str(n)], env)
        assert nobody_run.returncode == 2, nobody_run.stdout + nobody_run.stderr
        first, last = nobody_run.stderr.splitlines()
        assert first.startswith(
            f"aiworker: {n}: step 'x': field 'worker': unknown worker 'nobody' (known: "
        )
        assert "word-count" in first
        assert last == "aiworker: checked against the live registry (1 process)"

        g = tmp_path / "gpt5.json"
        g.write_text(json.dumps(GPT5_PIPELINE))
        gpt5 = cli(["check", str(g)], env)
        assert gpt5.returncode == 2, gpt5.stdout + gpt5.stderr
        assert (
            f"{g}: step 'ask': field 'input.model': unknown model alias 'gpt5' (known: default)"
            in gpt5.stdout
        )
        # offline (--local), this shell configures no model: today's answer
        assert cli(["check", "--local", str(g)], env).returncode == 0

        # the front door: the plugin worker passes, an unknown one is refused with the list
        door_env = env | write_config(tmp_path)
        async with running_door(door_env, tmp_path / "serve.log") as door:
            async with httpx.AsyncClient(base_url=door.url, timeout=30) as http:
                ok = await http.post(
                    "/v1/pipelines", json=WORD_COUNT_PIPELINE, headers=bearer("ci")
                )
                nobody = await http.post(
                    "/v1/pipelines",
                    json={
                        **WORD_COUNT_PIPELINE,
                        "steps": [{"id": "x", "worker": "nobody", "input": {}}],
                    },
                    headers=bearer("ci"),
                )
        assert ok.status_code == 201, ok.text
        assert nobody.status_code == 400, nobody.text
        message = nobody.json()["error"]["message"]
        assert "unknown worker 'nobody'" in message and "word-count" in message, message
        assert nobody.json()["error"]["checked_against"].startswith("the live registry (")

        # aiworker workers: the live workers with their processes and build ids, and a
        # conflict when another process serves word-count 1.0.0 with another spec
        other = {**WORD_COUNT, "constraints": {"timeout_seconds": 9}}
        await publish_raw(
            client,
            settings,
            "other@host",
            entry("other@host", specs={"word-count": other}).model_dump(mode="json"),
        )
        workers = cli(["workers"], env)
        assert workers.returncode == 0, workers.stderr
        assert "aiworker: workers from the live registry (2 processes)" in workers.stderr
        # one row per version and spec, with the processes serving it and their build ids
        rows = [line for line in workers.stdout.splitlines() if line.startswith("word-count ")]
        assert len(rows) == 2, workers.stdout
        assert any(f"{identity_of(a)} ({entry_a.build_id})" in r for r in rows), rows
        assert any(r.endswith("other@host (b1)") for r in rows), rows
        conflict = [line for line in workers.stderr.splitlines() if "conflict" in line]
        assert len(conflict) == 1, workers.stderr
        assert "worker 'word-count' version 1.0.0 is served with 2 different specs" in conflict[0]
        as_json = json.loads(cli(["workers", "--json"], env).stdout)
        assert {p["identity"] for p in as_json["word-count"]["processes"]} == {
            identity_of(a),
            "other@host",
        }


# `aiworker check` in a process of its own; prints the modules it must not have
# imported (the scraper, the browser, the content extractor, the plugin).
IMPORT_PROBE = """
import json, sys
from aiworker.workers.cli.main import main
code = main(["check", sys.argv[1]])
bad = ("aiworker.activities.web_scrape", "playwright", "trafilatura", "module_workers")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in bad or m in bad)))
sys.stdout.flush()
from aiworker.workers.cli.errors import exit_process
exit_process(code)
"""


async def test_stopped_processes_leave_the_registry_and_conformance_fails_fast(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    pipelines_q = ["-q", names.PIPELINES_QUEUE]
    scrape_q = ["-q", names.SCRAPE_QUEUE]
    env = worker_env(client, settings, tmp_path / "data")
    with (
        worker_process(client, settings, tmp_path, "a", *pipelines_q) as a,
        worker_process(
            client, settings, tmp_path, "b", *scrape_q, AIWORKER_REGISTRY_TTL_SECONDS="600"
        ) as b,
        worker_process(
            client, settings, tmp_path, "c", *scrape_q, AIWORKER_REGISTRY_TTL_SECONDS="2"
        ) as c,
    ):
        for p in (a, b, c):
            await wait_listed(client, settings, p)
        # SIGTERM: withdrawn at once (its entry would live 10 minutes)
        assert await asyncio.to_thread(b.terminate) == 0, b.output()
        await wait_listed(client, settings, b, present=False)
        # SIGKILL: nobody withdraws it; it expires when not refreshed
        await asyncio.to_thread(c.kill)
        await wait_listed(client, settings, c, present=False)
        assert set(await listed(client, settings)) == {identity_of(a)}

        started = time.monotonic()
        proc = await asyncio.to_thread(
            cli, ["conformance", names.WEB_SCRAPE, "--timeout", "15"], env
        )
        took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        "aiworker: no live worker process serves 'web-scrape' (the live registry lists: "
    )
    assert "validator" in proc.stderr
    assert took < 15, f"conformance took {took:.1f}s"


async def test_check_says_so_when_the_registry_does_not_answer(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
        await publish_raw(client, settings, "p@host", entry("p@host").model_dump(mode="json"))
    # the registry exists, but no worker process runs it now
    f = tmp_path / "p.json"
    f.write_text(
        json.dumps(
            {
                "name": "v",
                "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
            }
        )
    )
    proc = await asyncio.to_thread(cli, ["check", str(f)], worker_env(client, settings, tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == f"ok: {f} (1 step)\n"
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "aiworker: checked against local specs (the live registry (aiworker-registry-"
    )
    assert "did not answer within 3s" in line


async def test_a_process_polls_without_a_registry_and_publishes_once_one_runs(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    scrape = settings.queue(names.SCRAPE_QUEUE)
    with worker_process(
        client, settings, tmp_path, "s", "-q", names.SCRAPE_QUEUE, AIWORKER_REGISTRY_TTL_SECONDS="3"
    ) as s:

        async def polls() -> bool:
            assert s.proc.poll() is None, s.output()
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=scrape),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                )
            )
            return any(p.identity == identity_of(s) for p in resp.pollers)

        # no pipelines worker runs the registry: it polls all the same, and says why
        # it is not listed (once, however many refreshes fail)
        await wait_until(polls, "the scrape process to poll", timeout=60)
        await wait_until(
            lambda: "registry_publish_failed" in s.output(), "the failed publish logged", timeout=30
        )
        # a pipelines worker comes up: the next refresh lists the process
        async with running_stack(client, settings, queues=[names.PIPELINES_QUEUE]):
            await wait_listed(client, settings, s)
            served = {w.worker_id for w in (await listed(client, settings))[identity_of(s)].workers}
        assert served == {names.WEB_SCRAPE}
        assert s.output().count("registry_publish_failed") == 1, s.output()
