"""Helpers for the large-payload tests: settings, a converter-aware client,
reading external references out of a history, and the ``aiworker`` CLI as a
separate process."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from aiworker.config.settings import Settings

# A history whose 5 MB results went out of band: a few KB of events and references.
SMALL_HISTORY_BYTES = 64 * 1024


def stack_settings(tmp: Path, **kw: Any) -> Settings:
    """Settings for an isolated stack: its own queue suffix, data directory and
    registry secret, private networks allowed (loopback test servers); ``kw``
    overrides any field."""
    fields: dict[str, Any] = {
        "data_dir": tmp / "data",
        "task_queue_suffix": f"-t{uuid.uuid4().hex[:10]}",
        "registry_secret": SecretStr(uuid.uuid4().hex),
        "metrics_port": 0,
        "allow_private_networks": True,
        "shutdown_grace_seconds": 5,
    }
    return Settings(**(fields | kw))


def client_for(env: WorkflowEnvironment, settings: Settings) -> Client:
    """A client on the session's server with the converter ``settings`` configure."""
    from aiworker.workers.client.temporal_client import data_converter

    return Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=data_converter(settings),
    )


async def workflow_tree(client: Client, workflow_id: str) -> dict[str, WorkflowHistory]:
    """Every workflow of a run (it and its child workflows at any depth): id -> history."""
    out: dict[str, WorkflowHistory] = {}
    todo = [workflow_id]
    while todo:
        current = todo.pop()
        out[current] = await client.get_workflow_handle(current).fetch_history()
        for e in out[current].events:
            if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
                todo.append(e.start_child_workflow_execution_initiated_event_attributes.workflow_id)
    return out


def history_bytes(history: Any) -> int:
    return sum(e.ByteSize() for e in history.events)


def external_sizes(history: Any) -> list[int]:
    """Sizes of the results that went out of band, as the history's references say."""
    sizes = []
    for e in history.events:
        for attrs in (
            e.activity_task_completed_event_attributes,
            e.workflow_execution_completed_event_attributes,
        ):
            for p in attrs.result.payloads:
                sizes += [x.size_bytes for x in p.external_payloads]
    return sizes


def aiworker(env: dict[str, str], *args: str) -> str:
    """Run ``aiworker ARGS`` as its own process; its stdout (exit status 0 asserted)."""
    proc = subprocess.run(
        [sys.executable, "-m", "aiworker.workers.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
