"""SIGTERM drains a real worker process: a running activity finishes first.

The worker runs in a subprocess built the way ``aiworker worker`` builds it
(``build_workers``, ``install_signal_handlers``, ``run_until_stopped``), with
one extra test activity that sleeps, because no shipped worker is slow on
purpose. The test sends SIGTERM while that activity runs and checks that it
completed on its first attempt, in that process, and that the process exited 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from deploy_probe import DeployProbeWorkflow
from deploy_tools import ROOT
from support.waiting import wait_until
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from aiworker.schemas import names

pytestmark = pytest.mark.timeout(90)

SLOW_ACTIVITY = "deploy-test-slow"

WORKER_SCRIPT = textwrap.dedent(
    f'''
    """A worker process with one extra slow activity (test only)."""
    import asyncio
    import os
    import sys
    from pathlib import Path

    from prometheus_client import CollectorRegistry
    from temporalio import activity

    import aiworker.workers.process.task_queues as registry
    from aiworker.activities.metrics import WorkerMetrics
    from aiworker.schemas import names
    from aiworker.config.settings import Settings
    from aiworker.workers.cli.errors import exit_process
    from aiworker.workers.client.temporal_client import connect
    from aiworker.workers.process.resources import build_runtime
    from aiworker.workers.process.worker import (
        build_workers, install_signal_handlers, run_until_stopped,
    )

    MARKER = Path(sys.argv[1])


    @activity.defn(name="{SLOW_ACTIVITY}")
    async def slow(seconds: float) -> str:
        MARKER.write_text("started")
        await asyncio.sleep(seconds)
        print("activity finished", flush=True)
        return "done"


    async def main() -> int:
        settings = Settings.from_env(os.environ)
        client = await connect()
        runtime = build_runtime(settings, WorkerMetrics(CollectorRegistry()), tools={{}})
        # The queue's activities plus the slow one; everything else as the CLI builds it.
        # (A second Worker on the same client and queue fails in the core, so
        # the activity goes in before build_workers creates the worker.)
        shipped = registry.activities_for
        registry.activities_for = lambda *a, **kw: [*shipped(*a, **kw), slow]
        workers = build_workers(client, settings, runtime, [names.PIPELINES_QUEUE])
        stop = asyncio.Event()
        install_signal_handlers(stop)
        print("polling", flush=True)
        await run_until_stopped(workers, stop)
        print("exiting", flush=True)
        return 0


    # Exit as the console script does (no interpreter finalization, sdk-python#300).
    exit_process(asyncio.run(main()))
    '''
)


async def _wait_for(path: Path, proc: asyncio.subprocess.Process, seconds: float) -> None:
    async def appeared() -> bool:
        if await asyncio.to_thread(path.exists):
            return True
        if proc.returncode is not None:
            output = (await proc.stdout.read()).decode() if proc.stdout else ""
            raise AssertionError(f"worker exited early with {proc.returncode}:\n{output}")
        return False

    await wait_until(appeared, f"{path.name} to appear", timeout=seconds)


async def test_sigterm_lets_the_running_activity_finish(client: Client, tmp_path: Path) -> None:
    suffix = f"-t{uuid.uuid4().hex[:10]}"
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    marker = tmp_path / "started"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml"),
        "AIWORKER_TASK_QUEUE_SUFFIX": suffix,
        "AIWORKER_DATA_DIR": str(tmp_path / "data"),
        "AIWORKER_METRICS_PORT": "0",
        "AIWORKER_SHUTDOWN_GRACE_SECONDS": "20",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(marker),
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        probe_queue = f"deploy-probe{suffix}"
        async with Worker(client, task_queue=probe_queue, workflows=[DeployProbeWorkflow]):
            handle = await client.start_workflow(
                DeployProbeWorkflow.run,
                {
                    "activity": SLOW_ACTIVITY,
                    "request": 3.0,
                    "task_queue": names.PIPELINES_QUEUE + suffix,
                    "timeout_seconds": 30,
                },
                id=f"shutdown-probe{suffix}",
                task_queue=probe_queue,
            )
            await _wait_for(marker, proc, 30)
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout is not None
            # The child writes a few lines only; reading to EOF also waits for its exit.
            output = (await asyncio.wait_for(proc.stdout.read(), 45)).decode()
            code = await asyncio.wait_for(proc.wait(), 10)
            assert code == 0, output
            # Once the process is gone nobody polls its queue: the result must
            # already be there.
            result = await asyncio.wait_for(handle.result(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    assert result == "done"
    assert output.index("activity finished") < output.index("exiting")
    events = [e async for e in handle.fetch_history_events()]
    started = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    completed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    assert len(completed) == 1
    assert started[0].activity_task_started_event_attributes.attempt == 1
    assert started[0].activity_task_started_event_attributes.identity.startswith(f"{proc.pid}@")
