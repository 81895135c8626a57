"""Running a pipeline again from the command line says what happened: a second
``aiworker run --id X`` publishes nothing and says so, and ``aiworker redrive``
says what it reuses and what it runs again."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import Stack, running_stack
from support.payloads import stack_settings
from support.procs import run_cli_module
from temporalio.client import Client

from aiworker.config.settings import parse_rate_limits
from aiworker.workers.cli.common import EXIT_FAILED, EXIT_OK


def cli_env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = stack.settings.task_queue_suffix
    env["AIWORKER_DATA_DIR"] = str(stack.settings.data_dir)
    return env


async def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli_module, args, env)


async def test_a_second_run_with_the_same_id_says_it_published_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    f = tmp_path / "p.json"
    record = {"n": 1}
    step = {"id": "notify", "worker": "publish", "input": {"sink": {"file": "rerun.jsonl"}}}
    step["input"]["record"] = record
    f.write_text(json.dumps({"name": "rerun", "steps": [step]}))
    wid = f"rerun-{uuid.uuid4().hex[:8]}"
    env = cli_env(stack)
    first = await run_cli(["run", str(f), "--id", wid, "--json"], env)
    second = await run_cli(["run", str(f), "--id", wid, "--json"], env)
    assert first.returncode == EXIT_OK, first.stderr
    assert first.stderr == ""
    assert json.loads(first.stdout)["steps"]["notify"]["warnings"] == []
    assert second.returncode == EXIT_OK, second.stderr
    notify = json.loads(second.stdout)["steps"]["notify"]
    assert notify["outputs"]["duplicate"] is True and notify["outputs"]["published"] is False
    (warning,) = notify["warnings"]
    assert warning["code"] == "duplicate"
    assert f"idempotency key '{wid}/notify' was already published" in warning["message"]
    assert second.stderr.startswith(f"aiworker: step 'notify': idempotency key '{wid}/notify'")
    assert "a new workflow id publishes again" in second.stderr
    lines = (stack.settings.data_dir / "sinks" / "default" / "rerun.jsonl").read_text()
    assert len(lines.splitlines()) == 1


async def test_redrive_says_what_it_reuses_and_runs_again(stack: Stack) -> None:
    pipeline = {
        "name": "cli-redrive",
        "steps": [
            {"id": "ok", "worker": "validator", "input": {"data": 1, "schema": {}}},
            {
                "id": "check",
                "worker": "validator",
                "input": {"data": 1, "schema": {"type": "string"}},
            },
            {
                "id": "after",
                "worker": "validator",
                "gate": "check",
                "input": {"data": "${{ steps.ok.outputs }}", "schema": {}},
            },
        ],
    }
    first = await stack.start(pipeline)
    before = await first.result()
    proc = await run_cli(["redrive", first.id, "--json"], cli_env(stack))
    assert before.status == "partial"  # the gate did not pass: `after` is blocked
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"aiworker: redriving {first.id} as {first.id}-redrive-1: "
        "reusing ok, check; running again after"
    )
    doc = json.loads(proc.stdout)
    assert doc["workflow_id"] == f"{first.id}-redrive-1"
    assert doc["redrive"] == {
        "from": first.id,
        "reused": ["ok", "check"],
        "rerun": ["after"],
        "items_rerun": {},
    }


async def test_run_says_when_a_step_waits_at_a_rate_limit(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = f"w-{uuid.uuid4().hex[:8]}"
    # one validator call per 12 s for this tenant: each call after the first waits.
    # The items of `each` start waiting about a second after b's permit and are
    # told of 5 s later; the first item's permit comes 12 s after b's, so the
    # notice sees both items waiting with seconds to spare on a loaded machine
    # (at 7 s per call the margin was under a second, and a busy CI lost it).
    rules = tuple(parse_rate_limits(f"validator:{tenant}=1/12s"))
    settings = stack_settings(tmp_path, rate_limits=rules)
    check = {"worker": "validator", "input": {"data": 1, "schema": {}}}
    pipeline = {
        "name": "waits",
        "tenant": tenant,
        "steps": [
            {"id": "a", **check},
            {"id": "b", "depends_on": ["a"], **check},
            {"id": "each", "depends_on": ["b"], "for_each": [1, 2], **check},
        ],
    }
    f = tmp_path / "p.json"
    f.write_text(json.dumps(pipeline))
    caplog.set_level(logging.INFO, logger="temporalio.workflow")
    async with running_stack(client, settings) as stack:
        proc = await run_cli(["run", str(f)], cli_env(stack))
    assert proc.returncode == EXIT_OK, proc.stderr
    # piped: plain lines on stdout, `[ elapsed] <what changed>`, no escape codes
    lines = [line.split("] ", 1)[-1] for line in proc.stdout.splitlines()]
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    assert any(
        line.startswith("step 'b' has waited ") and "at its worker's rate limit" in line
        for line in lines
    ), proc.stdout
    # which limit, at its configured rate
    assert any(
        line.startswith("step 'b' has waited ") and f"rate:validator:{tenant} (1 per 12s)" in line
        for line in lines
    ), proc.stdout
    assert any(
        line.startswith("step 'each' has waited") and "2 of its for_each items" in line
        for line in lines
    ), proc.stdout
    # one line per step status change the polls saw (a ended before b's 12 s wait)
    assert lines.count("b: waiting") == 1, proc.stdout
    assert len([x for x in lines if x.startswith("a: succeeded (1 attempt, ")]) == 1, proc.stdout
    # then the summary table has every step
    summary = lines[lines.index(next(x for x in lines if x.startswith("waits succeeded in "))) :]
    assert [row.split()[:3] for row in summary[1:5]] == [
        ["step", "worker", "status"],
        ["a", "validator", "succeeded"],
        ["b", "validator", "succeeded"],
        ["each", "validator", "succeeded"],
    ], proc.stdout
    assert proc.stderr == ""
    # the worker says it once per step
    logged = [r.getMessage() for r in caplog.records if "for a rate permit of" in r.getMessage()]
    assert [m.split(" waited")[0] for m in logged] == ["step 'b'", "step 'each' (for_each items)"]
