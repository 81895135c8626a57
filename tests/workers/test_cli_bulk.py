"""``aiworker cancel|terminate|redrive --query Q``: bulk actions by filter, through
the real CLI process against the session's Temporal server (batch operations
and visibility included) and an in-process worker stack."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import uuid
from typing import Any

from conftest import running_stack
from support.pipelines import pipeline_result
from support.procs import run_cli_module, worker_env
from support.registry import entry, publish_raw
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client, WorkflowExecutionStatus

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from aiworker.workers.client.bulk import BULK_CONFIRM_THRESHOLD, scoped_query


def waiting(name: str, tenant: str) -> dict[str, Any]:
    """A pipeline that waits (for a callback) until it is cancelled or terminated."""
    return {
        "name": name,
        "tenant": tenant,
        "steps": [{"id": "w", "wait": {"schema": {"type": "object"}, "timeout_seconds": 600}}],
    }


async def cli(
    args: list[str], client: Client, settings: Settings
) -> subprocess.CompletedProcess[str]:
    env = worker_env(client, settings, settings.data_dir)
    return await asyncio.to_thread(run_cli_module, args, env)


def on_a_terminal(
    args: list[str], client: Client, settings: Settings, answer: str
) -> subprocess.CompletedProcess[str]:
    """The CLI with a pseudo-terminal as stdin (so it asks), ``answer`` typed in."""
    env = worker_env(client, settings, settings.data_dir)
    leader, follower = pty.openpty()
    try:
        os.write(leader, answer.encode())
        return subprocess.run(
            [sys.executable, "-m", "aiworker.workers.cli.main", *args],
            env=env,
            stdin=follower,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        os.close(follower)
        os.close(leader)


async def listed(client: Client, query: str, n: int) -> None:
    """Wait until visibility lists ``n`` runs for ``query`` (it lags the starts)."""

    async def enough() -> bool:
        return (await client.count_workflows(query)).count == n

    await wait_until(enough, f"{n} runs listed for {query}")


async def statuses(client: Client, ids: list[str]) -> list[WorkflowExecutionStatus | None]:
    return [(await client.get_workflow_handle(i).describe()).status for i in ids]


def test_the_scope_is_pipelines_of_one_tenant_and_balanced() -> None:
    q = scoped_query("AiworkerStatus = 'failed'", "acme", "redrive")
    assert q == (
        f"(AiworkerStatus = 'failed') AND WorkflowType IN ('{names.PIPELINE_WORKFLOW}') AND "
        "AiworkerTenant = 'acme' AND NOT (ExecutionStatus = 'Running')"
    )
    assert "AiworkerTenant" not in scoped_query("x = 1", None, "cancel")
    assert "WorkflowType IN" in scoped_query("x = 1", None, "cancel")
    assert scoped_query("x = 1", None, "terminate").endswith("AND ExecutionStatus = 'Running'")
    # quoted parentheses are text; an unbalanced one would step out of the scope
    scoped_query("AiworkerPipeline = 'a) OR (b'", "acme", "cancel")
    for bad in ("a) OR (b", "(a", "x = 'open", "  ", "x = 1 /* c */", "x = 1 -- c"):
        try:
            scoped_query(bad, "acme", "cancel")
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was taken")


async def test_cancel_by_query_keeps_to_the_tenant(client: Client, settings: Settings) -> None:
    name = f"bulk-{uuid.uuid4().hex[:8]}"
    q = f"AiworkerPipeline = '{name}'"
    async with running_stack(client, settings) as stack:
        acme = [(await stack.start(waiting(name, "acme"))).id for _ in range(3)]
        beta = [(await stack.start(waiting(name, "beta"))).id]
        await listed(client, f"{q} AND ExecutionStatus = 'Running'", 4)

        dry = await cli(["cancel", "--query", q, "--tenant", "acme", "--dry-run"], client, settings)
        assert dry.returncode == EXIT_OK, dry.stderr
        assert "3 pipelines match" in dry.stdout
        assert sorted(line.strip() for line in dry.stdout.splitlines()[1:]) == sorted(acme)
        assert "dry run" in dry.stderr

        refused = await cli(["cancel", "--query", "NoSuchAttribute = 'x'"], client, settings)
        assert refused.returncode == EXIT_USAGE, refused.stderr
        assert "refused the query" in refused.stderr
        unbalanced = await cli(["cancel", "--query", f"{q}) OR (1 = 1"], client, settings)
        assert unbalanced.returncode == EXIT_USAGE
        assert "closes more than the query opened" in unbalanced.stderr
        both = await cli(["cancel", acme[0], "--query", q], client, settings)
        assert both.returncode == EXIT_USAGE and "not both" in both.stderr
        # the dry run and the refusals touched nothing
        assert set(await statuses(client, acme + beta)) == {WorkflowExecutionStatus.RUNNING}

        done = await cli(["cancel", "--query", q, "--tenant", "acme"], client, settings)
        assert done.returncode == EXIT_OK, done.stderr
        assert "batch job" in done.stderr and "3/3 done, 0 failed (completed)" in done.stderr

        async def cancelled() -> bool:
            return WorkflowExecutionStatus.RUNNING not in await statuses(client, acme)

        await wait_until(cancelled, "the acme runs to end")
        assert await statuses(client, beta) == [WorkflowExecutionStatus.RUNNING]

        one = await cli(["terminate", beta[0], "--reason", "test"], client, settings)
        assert one.returncode == EXIT_OK, one.stderr
        assert await statuses(client, beta) == [WorkflowExecutionStatus.TERMINATED]


async def test_terminate_above_the_threshold_needs_yes(client: Client, settings: Settings) -> None:
    name = f"bulk-many-{uuid.uuid4().hex[:8]}"
    q = f"AiworkerPipeline = '{name}'"
    n = BULK_CONFIRM_THRESHOLD + 1
    async with running_stack(client, settings) as stack:
        ids = [(await stack.start(waiting(name, "gamma"))).id for _ in range(n)]
        await listed(client, f"{q} AND ExecutionStatus = 'Running'", n)
        args = ["terminate", "--query", q, "--all-tenants"]
        asked = await cli(args, client, settings)
        assert asked.returncode == EXIT_USAGE, asked.stderr
        assert f"{n} pipelines match" in asked.stdout and "--yes" in asked.stderr
        assert set(await statuses(client, ids)) == {WorkflowExecutionStatus.RUNNING}
        # on a terminal it asks; "n" does nothing (exit 1)
        declined = await asyncio.to_thread(on_a_terminal, args, client, settings, "n\n")
        assert declined.returncode == EXIT_FAILED, declined.stderr
        assert f"terminate {n} pipelines of ALL tenants? [y/N]" in declined.stderr
        assert "nothing done" in declined.stderr
        assert set(await statuses(client, ids)) == {WorkflowExecutionStatus.RUNNING}
        done = await cli([*args, "--yes"], client, settings)
        assert done.returncode == EXIT_OK, done.stderr
        assert f"{n}/{n} done, 0 failed (completed)" in done.stderr
        assert set(await statuses(client, ids)) == {WorkflowExecutionStatus.TERMINATED}


async def _broken(_: dict[str, Any]) -> dict[str, Any]:
    raise fail("invalid_output", "the model returned garbage")


async def test_redrive_by_query_one_run_at_a_time(client: Client, settings: Settings) -> None:
    name = f"bulk-redrive-{uuid.uuid4().hex[:8]}"
    # a failed run carries the error code it ended with as a search attribute
    q = f"AiworkerPipeline = '{name}' AND AiworkerErrorCode = 'invalid_output'"
    pipeline = {
        "name": name,
        "steps": [{"id": "a", "worker": "aggregator", "input": {"policy": "all", "branches": {}}}],
    }
    acts = {"aggregator": standin("aggregator", _broken)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        runs = [await stack.start(pipeline) for _ in range(2)]
        for r in runs:
            assert (await pipeline_result(r)).status == "failed"
        ids = sorted(r.id for r in runs)
        await listed(client, q, 2)
        other_code = q.replace("invalid_output", "timeout")
        assert (await client.count_workflows(other_code)).count == 0
        desc = await runs[0].describe()
        assert desc.typed_search_attributes.get(names.ERROR_CODE_KEY) == "invalid_output"
        dry = await cli(["redrive", "--query", q, "--dry-run"], client, settings)
        assert dry.returncode == EXIT_OK and "2 pipelines match" in dry.stdout, dry.stderr
        other = await cli(["redrive", "--query", q, "--tenant", "beta"], client, settings)
        assert other.returncode == EXIT_OK and "0 pipelines match" in other.stdout, other.stderr
        done = await cli(["redrive", "--query", q], client, settings)
        assert done.returncode == EXIT_OK, done.stderr
        pairs = dict(line.split(" -> ") for line in done.stdout.splitlines() if " -> " in line)
        assert sorted(pairs) == ids
        assert all(pairs[i] == f"{i}-redrive-1" for i in ids)
        assert "redrive 2/2" in done.stderr and "2 started, 0 not redriven" in done.stderr
        for new in pairs.values():
            result = await pipeline_result(client.get_workflow_handle(new))
            assert result.status == "failed"


# The attack review's query: comments hide a ')' and a '(' from a parenthesis count,
# and the server drops them, so the OR stood outside the tenant and pipeline scope.
_ESCAPE = "/*(*/ WorkflowId = 'none') OR ({inner} /*)*/"


async def test_a_query_cannot_leave_its_scope(client: Client, settings: Settings) -> None:
    """Against the real server, with two tenants' runs and the registry workflow
    running: a query hiding parentheses in comments is refused before it reaches
    the server, and queries that try to reach another tenant's runs or aiworker's
    own workflows without comments match nothing of them (the scope wraps the
    query: ``(Q) AND WorkflowType IN (...) AND AiworkerTenant = ...``)."""
    name = f"bulk-scope-{uuid.uuid4().hex[:8]}"
    registry_id = names.worker_registry_workflow_id(settings.task_queue_suffix)
    async with running_stack(client, settings) as stack:
        await publish_raw(
            client, settings, "scope@host", entry("scope@host").model_dump(mode="json")
        )
        acme = [(await stack.start(waiting(name, "acme"))).id for _ in range(2)]
        globex = [(await stack.start(waiting(name, "globex"))).id]
        q = f"AiworkerPipeline = '{name}'"
        await listed(client, f"{q} AND ExecutionStatus = 'Running'", 3)
        registry = client.get_workflow_handle(registry_id)
        assert (await registry.describe()).status == WorkflowExecutionStatus.RUNNING

        hostile = [
            ["redrive", "--query", _ESCAPE.format(inner="AiworkerTenant = 'globex'")],
            ["cancel", "--query", _ESCAPE.format(inner="AiworkerTenant = 'globex'")],
            ["terminate", "--query", _ESCAPE.format(inner=f"WorkflowId = '{registry_id}'")],
            ["terminate", "--query", f"WorkflowId = 'none' # ) OR (WorkflowId = '{registry_id}'"],
            ["terminate", "--query", f"WorkflowId = 'none' -- ) OR (WorkflowId = '{registry_id}'"],
        ]
        for args in hostile:
            out = await cli([*args, "--tenant", "acme", "--dry-run"], client, settings)
            assert out.returncode == EXIT_USAGE, (args, out.stdout, out.stderr)
            assert "a comment" in out.stderr and "not allowed" in out.stderr, out.stderr
            assert globex[0] not in out.stdout and registry_id not in out.stdout

        # no comments: the OR stays inside the parentheses, under the scope
        widened = f"{q} OR AiworkerTenant = 'globex' OR WorkflowId = '{registry_id}'"
        dry = await cli(
            ["cancel", "--query", widened, "--tenant", "acme", "--dry-run"], client, settings
        )
        assert dry.returncode == EXIT_OK, dry.stderr
        assert sorted(line.strip() for line in dry.stdout.splitlines()[1:]) == sorted(acme)
        # every tenant, the registry named outright: it is no pipeline, nothing matches
        own = f"WorkflowId = '{registry_id}' OR WorkflowType = '{names.WORKER_REGISTRY_WORKFLOW}'"
        done = await cli(["terminate", "--query", own, "--all-tenants", "--yes"], client, settings)
        assert done.returncode == EXIT_OK and "0 pipelines match" in done.stdout, done.stderr
        # comment marks inside strings are text, and the query runs
        texts = f"{q} AND AiworkerPipeline != 'a /* b -- c # d ) e \\' f'"
        dry = await cli(
            ["cancel", "--query", texts, "--tenant", "acme", "--dry-run"], client, settings
        )
        assert dry.returncode == EXIT_OK and "2 pipelines match" in dry.stdout, dry.stderr

        assert set(await statuses(client, acme + globex)) == {WorkflowExecutionStatus.RUNNING}
        assert (await registry.describe()).status == WorkflowExecutionStatus.RUNNING
        for wid in acme + globex:
            await client.get_workflow_handle(wid).terminate(reason="test over")
