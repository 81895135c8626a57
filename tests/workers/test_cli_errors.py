"""Every ``aiworker`` command fails with one line on stderr and a documented exit
code, never a traceback (``--debug`` adds it): each command run as a user runs
it, as a subprocess against the session's real Temporal server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import Stack
from support.procs import run_cli_module

from aiworker.workers.cli.common import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE

OK_PIPELINE = {
    "name": "cli-errors",
    "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
}


@dataclass
class World:
    """What the bad commands point at: a finished pipeline, a workflow that is no
    pipeline and still runs, and the environment that reaches them."""

    env: dict[str, str]
    done: str
    running_other: str
    pipeline_file: Path


@pytest_asyncio.fixture
async def world(stack: Stack, tmp_path: Path) -> AsyncIterator[World]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = stack.settings.task_queue_suffix
    env["AIWORKER_DATA_DIR"] = str(tmp_path / "data")
    done = await stack.start(OK_PIPELINE)
    await done.result()
    other = await stack.client.start_workflow(
        "NotAPipeline", id=f"other-{uuid.uuid4().hex[:8]}", task_queue="nobody-polls"
    )
    f = tmp_path / "p.json"
    f.write_text(json.dumps(OK_PIPELINE))
    try:
        yield World(env, done.id, other.id, f)
    finally:
        await other.terminate()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli_module(args, env)


# (arguments with {done}, {other}, {file}, {missing} filled in; exit code; part of the line)
BAD_COMMANDS = {
    "review-unknown-id": (["review", "{missing}", "approve"], EXIT_NOT_FOUND, "not found"),
    "review-ended-run": (["review", "{done}", "approve"], EXIT_FAILED, "has already ended"),
    "review-bad-outputs": (
        ["review", "{done}", "approve", "--outputs", "{{"],
        EXIT_USAGE,
        "--outputs is not valid JSON",
    ),
    "review-bad-decision": (["review", "{done}", "maybe"], EXIT_USAGE, "invalid choice"),
    "redrive-unknown-id": (["redrive", "{missing}"], EXIT_NOT_FOUND, "not found"),
    "redrive-succeeded": (["redrive", "{done}"], EXIT_USAGE, "succeeded; nothing to redrive"),
    "redrive-not-a-pipeline": (["redrive", "{other}"], EXIT_USAGE, "not a pipeline"),
    "items-unknown-id": (["items", "{missing}", "v"], EXIT_NOT_FOUND, "not found"),
    "items-not-a-pipeline": (["items", "{other}", "v"], EXIT_USAGE, "not a pipeline"),
    "items-not-a-for-each": (["items", "{done}", "v"], EXIT_USAGE, "not a for_each step"),
    "items-no-step-id": (["items", "{done}"], EXIT_USAGE, "required: step_id"),
    "run-missing-file": (["run", "/nonexistent/p.json"], EXIT_USAGE, "cannot read"),
    "run-id-taken": (["run", "{file}", "--id", "{other}"], EXIT_USAGE, "is already running"),
    "list-bad-limit": (["list", "--limit", "x"], EXIT_USAGE, "invalid int value"),
    "list-bad-tenant": (["list", "--tenant", "No Such"], EXIT_USAGE, "is not a tenant name"),
    "artifacts-unknown-id": (["artifacts", "{missing}"], EXIT_NOT_FOUND, "no artifacts recorded"),
    "workers-bad-flag": (["workers", "--bogus"], EXIT_USAGE, "unrecognized arguments"),
    "schemas-bad-action": (["schemas", "bogus"], EXIT_USAGE, "invalid choice"),
    "conformance-unknown-worker": (["conformance", "nosuch"], EXIT_USAGE, "unknown worker"),
    "worker-unknown-queue": (["worker", "-q", "nosuch", "--wait", "1"], EXIT_USAGE, "nosuch"),
    "dev-bad-port": (["dev", "--port", "x"], EXIT_USAGE, "invalid int value"),
    "demo-missing-pipeline": (["demo", "--pipeline", "/nonexistent.json"], EXIT_USAGE, "cannot"),
    "replay-missing-file": (["replay", "/nonexistent/h.json"], EXIT_USAGE, "cannot read"),
    "replay-bad-limit": (["replay", "--query", "", "--limit", "0"], EXIT_USAGE, "not at least 1"),
    "replay-nothing": (["replay"], EXIT_USAGE, "needs history files"),
    "no-command": ([], EXIT_USAGE, "required"),
}


@pytest.mark.parametrize("case", BAD_COMMANDS, ids=list(BAD_COMMANDS))
async def test_a_bad_command_fails_with_one_line_and_its_exit_code(world: World, case: str) -> None:
    template, code, part = BAD_COMMANDS[case]
    fill = {
        "done": world.done,
        "other": world.running_other,
        "file": str(world.pipeline_file),
        "missing": f"nope-{uuid.uuid4().hex[:8]}",
    }
    args = [a.format(**fill) for a in template]
    proc = await asyncio.to_thread(run_cli, args, world.env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert part in lines[0], proc.stderr
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == ""


async def test_unreachable_temporal_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = "127.0.0.1:9"
    env["AIWORKER_DATA_DIR"] = str(tmp_path)
    proc = await asyncio.to_thread(run_cli, ["review", "x", "approve"], env)
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot reach Temporal" in proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
async def test_debug_adds_the_traceback(world: World, where: str) -> None:
    missing = f"nope-{uuid.uuid4().hex[:8]}"
    args = ["redrive", missing]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    proc = await asyncio.to_thread(run_cli, args, world.env)
    assert proc.returncode == EXIT_NOT_FOUND
    assert "Traceback" in proc.stderr and "RPCError" in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"aiworker: workflow {missing!r} not found in this namespace "
        f"(workflow not found for ID: {missing})"
    )
