"""The embedded dev server stopped and restarted mid-pipeline (same port, same SQLite file).

A worker (in-process, the same workers ``aiworker worker`` builds) keeps
running across the outage and reconnects by itself; the pipeline resumes
from the persisted history and completes. The first step is held in flight
while the server goes down, so its completion races the outage.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from conftest import running_stack
from support import history
from support.standins import SlowPublish, publish_step, read_jsonl, registered
from support.waiting import wait_until

from aiworker.config.settings import Settings
from aiworker.schemas.pipeline import PipelineResult
from aiworker.workers.client.client import start_pipeline
from aiworker.workers.client.temporal_client import connect
from aiworker.workers.devstack.devserver import DevServer, free_port


@pytest.mark.timeout(240)
async def test_dev_server_restart_mid_pipeline_completes(tmp_path: Path) -> None:
    server = DevServer(tmp_path / "dev", port=free_port(), ui_port=None, persistent=True)
    await asyncio.to_thread(server.start, 90)
    try:
        client = await connect(target_host=server.address, namespace="default", wait_seconds=60)
        settings = Settings(
            data_dir=tmp_path / "data",
            task_queue_suffix=f"-r{uuid.uuid4().hex[:8]}",
            metrics_port=0,
            shutdown_grace_seconds=2,
        )
        sink = tmp_path / "data" / "sinks" / "default" / "records.jsonl"
        attempts = tmp_path / "attempts.jsonl"
        worker = SlowPublish(attempts, hold_seconds=2.0)
        pipeline = {
            "name": "server-restart",
            "inputs": {"a": {"n": 1}, "b": {"n": 2}},
            "steps": [
                publish_step("first", "${{ inputs.a }}", "records.jsonl", timeout_seconds=6),
                publish_step(
                    "second",
                    "${{ inputs.b }}",
                    "records.jsonl",
                    depends_on=["first"],
                    timeout_seconds=6,
                ),
            ],
            "output": {
                "first": "${{ steps.first.status }}",
                "second": "${{ steps.second.status }}",
            },
        }
        with registered(worker):
            async with running_stack(client, settings):
                started = await start_pipeline(client, settings, pipeline)
                handle = client.get_workflow_handle(started.id, result_type=PipelineResult)
                await wait_until(
                    lambda: any(a["key"].endswith("/first") for a in read_jsonl(attempts)),
                    "the first step to start",
                    timeout=90,
                )
                await asyncio.to_thread(server.stop)
                assert (tmp_path / "dev" / "temporal.db").exists()
                # Keep the server down past the step's hold, so the completion meets the outage.
                await asyncio.sleep(3)
                await asyncio.to_thread(server.start, 90)
                try:
                    result = await asyncio.wait_for(handle.result(), 150)
                except TimeoutError:
                    raise AssertionError(
                        f"pipeline did not finish after the restart; server log: "
                        f"{server.log_path.read_text(errors='replace')[-3000:]}"
                    ) from None
                task_failures = await history.workflow_task_failures(handle)
    finally:
        await asyncio.to_thread(server.stop)

    assert result.status == "succeeded", result
    assert result.output == {"first": "succeeded", "second": "succeeded"}
    assert task_failures == 0
    lines = read_jsonl(sink)
    assert sorted(r["idempotency_key"] for r in lines) == [
        f"{handle.id}/first",
        f"{handle.id}/second",
    ]
    assert [r["record"] for r in lines] == [{"n": 1}, {"n": 2}]
