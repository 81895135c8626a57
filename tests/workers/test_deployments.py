"""Worker Deployment Versioning on the real dev server (workers/process/deployments.py).

Two in-process stacks of one deployment with different build ids stand for two
worker processes (v1 and v2): each serves every queue through ``build_workers``
with versioning on, and the validator is a stand-in that records which build
ran it. Each test's deployment is ``aiworker`` plus its own queue suffix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support.payloads import stack_settings
from support.pipelines import one_step_pipeline
from support.procs import WorkerProcess
from support.standins import standin
from support.waiting import wait_until
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkerDeploymentVersion

from aiworker.config.settings import Settings, SettingsError, parse_rate_limits
from aiworker.schemas import names
from aiworker.workers.devstack.devserver import free_port
from aiworker.workers.process.deployments import (
    DeploymentError,
    OtherBuildRun,
    build_id,
    code_hash,
    deployment_config,
    deployment_name,
    describe_deployment,
    ensure_current,
    other_build_runs,
    running_on,
    set_current,
    terminate_runs,
)

VALID = {"valid": True, "errors": []}
AIWORKER = str(Path(sys.executable).parent / "aiworker")


def versioned(tmp: Path, **kw: Any) -> Settings:
    # Plain activities, so the held stand-in runs on a worker of the run's build.
    return stack_settings(tmp, versioning=True, local_activities=False, **kw)


def built(settings: Settings, build: str, **kw: Any) -> Settings:
    return settings.model_copy(update={"build_id": build, **kw})


async def build_of(handle: WorkflowHandle[Any, Any]) -> str:
    """The build a run is pinned to (its override when it was moved)."""
    info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    if info.versioning_override.HasField("pinned"):
        return info.versioning_override.pinned.version.build_id
    return info.deployment_version.build_id


def recorder(build: str, ran: list[str], hold: asyncio.Event | None = None) -> Any:
    async def validate(request: dict[str, Any]) -> dict[str, Any]:
        ran.append(f"{build}:{request['idempotency_key'].split('/')[0]}")
        if hold is not None:
            await hold.wait()
        return VALID

    return standin(names.VALIDATOR, validate)


def test_settings_turn_versioning_on_for_processes_and_name_the_build() -> None:
    # unset: unversioned where workers are built in code, on in `aiworker worker`/`dev`
    assert Settings.from_env({}).versioning is None
    assert deployment_config(Settings()) is None
    from_env = Settings.from_env(
        {"AIWORKER_TASK_QUEUE_SUFFIX": "-b.1", "AIWORKER_VERSIONING": "true"}
    )
    assert deployment_name(from_env) == "aiworker-b-1"
    default = build_id(from_env)
    assert default.startswith("0.") and default.endswith("-" + code_hash()[:12])
    config = deployment_config(from_env)
    assert config is not None and config.version.build_id == default
    named = Settings.from_env({"AIWORKER_BUILD_ID": "2026.11-abc", "AIWORKER_VERSIONING": "off"})
    assert build_id(named) == "2026.11-abc" and deployment_config(named) is None
    with pytest.raises(SettingsError, match="AIWORKER_DEPLOYMENT_CURRENT"):
        Settings.from_env({"AIWORKER_DEPLOYMENT_CURRENT": "sometimes"})
    with pytest.raises(SettingsError, match="AIWORKER_DEPLOYMENT_NAME"):
        Settings.from_env({"AIWORKER_DEPLOYMENT_NAME": "a.b"})


async def test_runs_finish_on_the_build_they_started_on(client: Client, tmp_path: Path) -> None:
    base = versioned(tmp_path)
    v1, v2 = built(base, "v1"), built(base, "v2", deployment_current="never")
    name = deployment_name(base)
    ran: list[str] = []
    hold = asyncio.Event()
    pipeline = one_step_pipeline("rolling")
    async with contextlib.AsyncExitStack() as v1_process:
        old = await v1_process.enter_async_context(
            running_stack(
                client, v1, replace_activities={names.VALIDATOR: recorder("v1", ran, hold)}
            )
        )
        assert await ensure_current(client, v1) == "v1"  # the first build of a deployment
        first = await old.start(pipeline, id=f"first{base.task_queue_suffix}")
        await wait_until(lambda: ran == [f"v1:{first.id}"], lambda: f"v1 to run, ran {ran}")

        async with running_stack(
            client, v2, replace_activities={names.VALIDATOR: recorder("v2", ran)}
        ) as new:
            # v2 polls but is not current: it says so and takes nothing yet
            assert await ensure_current(client, v2) == "v1"
            await set_current(client, name, "v2")
            second = await new.start(pipeline, id=f"second{base.task_queue_suffix}")
            assert (await second.result()).status == "succeeded"
            assert await build_of(second) == "v2"
            assert ran == [f"v1:{first.id}", f"v2:{second.id}"]

            state = await describe_deployment(client, name)
            assert (state.current, [v.build_id for v in state.versions]) == ("v2", ["v1", "v2"])
            assert await build_of(first) == "v1"  # still open, still on v1
            hold.set()
            assert (await first.result()).status == "succeeded"
            assert ran == [f"v1:{first.id}", f"v2:{second.id}"]  # the step ran on v1 only
            assert await build_of(first) == "v1"  # pinned: it ended on v1 too

            async def v1_drained() -> bool:
                return await running_on(client, WorkerDeploymentVersion(name, "v1")) == 0

            await wait_until(v1_drained, lambda: "v1 to have no open runs")
            old_state = (await describe_deployment(client, name)).version("v1")
            assert old_state is not None and old_state.running == 0
            assert old_state.status in ("draining", "drained")
            await v1_process.aclose()  # v1 stops; new runs go on on v2
            third = await new.start(pipeline, id=f"third{base.task_queue_suffix}")
            assert (await third.result()).status == "succeeded"
            assert ran[-1] == f"v2:{third.id}" and await build_of(third) == "v2"


async def test_runs_of_an_earlier_build_stay_on_it_until_terminated(
    client: Client, tmp_path: Path
) -> None:
    base = versioned(tmp_path, deployment_current="always")
    ran: list[str] = []

    async def until_stopped(request: dict[str, Any]) -> dict[str, Any]:
        ran.append("a")
        await activity.wait_for_worker_shutdown()  # completes while build a stops
        return VALID

    async with running_stack(
        client,
        built(base, "a"),
        replace_activities={names.VALIDATOR: standin(names.VALIDATOR, until_stopped)},
    ) as a:
        await ensure_current(client, built(base, "a"))
        run = await a.start(one_step_pipeline("edited"), id=f"edited{base.task_queue_suffix}")
        await wait_until(lambda: ran == ["a"], lambda: "build a to start the step")
    # build a is gone; the run's next workflow task waits for it (pinned)
    assert await build_of(run) == "a"
    b = built(base, "b")
    async with running_stack(client, b, replace_activities={names.VALIDATOR: recorder("b", ran)}):
        assert await ensure_current(client, b) == "b"
        found: list[OtherBuildRun] = []

        async def listed() -> bool:  # visibility may lag the run's last task
            found[:] = await other_build_runs(client, b)
            return bool(found)

        await wait_until(listed, lambda: "the run of build a to be listed")
        assert [(r.workflow_id, r.build_id) for r in found] == [(run.id, "a")]
        assert found[0].workflow_type == names.PIPELINE_WORKFLOW
        assert await build_of(run) == "a"  # never moved onto b: b never replays it
        assert ran == ["a"]
        assert await terminate_runs(client, found, "test") == 1
        assert (await run.describe()).status == WorkflowExecutionStatus.TERMINATED
        assert await terminate_runs(client, found, "test") == 0  # ended already

        async def none_left() -> bool:
            return await other_build_runs(client, b) == []

        await wait_until(none_left, lambda: "no run of other builds")


async def test_describe_names_an_unknown_deployment(client: Client) -> None:
    with pytest.raises(DeploymentError, match="no worker deployment 'nobody-"):
        await describe_deployment(
            client, "nobody-" + stack_settings(Path("/tmp")).task_queue_suffix
        )


async def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [AIWORKER, "deployment", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_deployment_commands_show_switch_and_drain(client: Client, tmp_path: Path) -> None:
    base = versioned(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = base.task_queue_suffix  # the default deployment
    async with (
        running_stack(client, built(base, "v1")),
        running_stack(client, built(base, "v2")),
    ):
        assert await ensure_current(client, built(base, "v1")) == "v1"
        await wait_until(
            lambda: _has_versions(client, deployment_name(base), {"v1", "v2"}),
            lambda: "both builds to register",
        )
        shown = await _cli("versions", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["deployment"] == deployment_name(base) and doc["current"] == "v1"
        assert {v["build_id"]: v["status"] for v in doc["versions"]}["v1"] == "current"

        busy = await _cli("drain", "v1", env=env)
        assert busy.returncode == 1 and "is current" in busy.stdout

        ramp = await _cli("ramp", "v2", "25", env=env)
        assert ramp.returncode == 0, ramp.stderr
        state = await describe_deployment(client, deployment_name(base))
        assert (state.ramping, state.ramp_percentage) == ("v2", 25)
        assert (await _cli("ramp", "v2", env=env)).returncode == 2

        switched = await _cli("set-current", "v2", env=env)
        assert switched.returncode == 0, switched.stderr
        assert (await describe_deployment(client, deployment_name(base))).current == "v2"
        drained = await _cli("drain", "v1", "--wait", "30", "--json", env=env)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert json.loads(drained.stdout)["running"] == 0

        unknown = await _cli("versions", "-d", f"nobody{base.task_queue_suffix}", env=env)
        assert unknown.returncode == 3 and "no worker deployment" in unknown.stderr
        refused = await _cli("set-current", "v9", env=env)
        # a build that never polled is not found (3), as `drain` of one
        assert refused.returncode == 3 and "cannot make" in refused.stderr


async def _has_versions(client: Client, name: str, builds: set[str]) -> bool:
    try:
        state = await describe_deployment(client, name, count=False)
    except DeploymentError:
        return False
    return builds <= {v.build_id for v in state.versions}


def _dev(tmp_path: Path, port: int, build: str, *flags: str) -> WorkerProcess:
    """``aiworker dev`` of build ``build`` on one data directory (headless, no model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env.update(
        AIWORKER_BUILD_ID=build,
        AIWORKER_METRICS_PORT="0",
        AIWORKER_LOG_LEVEL="WARNING",
        AIWORKER_SHUTDOWN_GRACE_SECONDS="2",
    )
    cmd = [AIWORKER, "dev", "--data-dir", str(tmp_path / "dev"), "--port", str(port)]
    return WorkerProcess(
        [*cmd, "--headless", "--no-model", *flags], env, tmp_path / f"dev-{build}.out"
    )


async def _dev_ready(dev: WorkerProcess) -> None:
    await wait_until(
        lambda: "Press Ctrl-C" in dev.output(),
        lambda: f"the dev stack to start: {dev.output()}",
        timeout=90,
        interval=0.3,
    )


@pytest.mark.timeout(180)
async def test_dev_restarted_on_edited_code_leaves_the_open_run_and_terminates_it_when_asked(
    tmp_path: Path,
) -> None:
    from aiworker.workers.client.temporal_client import data_converter

    port = free_port()
    # a loopback webhook is egress_denied: the step escalates and the run waits for a review
    pipeline = {
        "name": "edited",
        "tenant": "acme",
        "steps": [
            {
                "id": "notify",
                "worker": names.PUBLISH,
                "input": {"sink": {"webhook": "http://127.0.0.1:9/hook"}, "record": {"a": 1}},
                "on_failure": "escalate",
            }
        ],
    }
    before = _dev(tmp_path, port, "a")
    try:
        await _dev_ready(before)
        client = await Client.connect(f"127.0.0.1:{port}", data_converter=data_converter(None))
        run = await client.start_workflow(
            names.PIPELINE_WORKFLOW, pipeline, id="edited-run", task_queue=names.PIPELINES_QUEUE
        )

        seen: list[Any] = []

        async def awaiting() -> bool:
            seen[:] = [await run.query(names.PROGRESS_QUERY)]
            return bool(seen[0]["awaiting_review"])

        await wait_until(awaiting, lambda: f"the run to await its review: {seen}")
        assert await build_of(run) == "a"
        await asyncio.to_thread(before.terminate)  # stopped: the run stays open, on build a
    finally:
        before.close()
    after = _dev(tmp_path, port, "b")  # the code changed: another build
    try:
        await _dev_ready(after)
        said = "1 running run(s) belong to other builds"
        await wait_until(lambda: said in after.output(), lambda: f"{said!r} in {after.output()}")
        assert "edited-run (PipelineWorkflow, build a)" in after.output()
        assert "--terminate-other-builds" in after.output()
        client = await Client.connect(f"127.0.0.1:{port}", data_converter=data_converter(None))
        handle = client.get_workflow_handle("edited-run")
        assert await build_of(handle) == "a"  # left on its build: b never replays it
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        await asyncio.to_thread(after.terminate)
    finally:
        after.close()
    again = _dev(tmp_path, port, "c", "--terminate-other-builds")
    try:
        await _dev_ready(again)
        said = "terminated 1 run(s) of other builds: edited-run (PipelineWorkflow, build a)"
        await wait_until(lambda: said in again.output(), lambda: f"{said!r} in {again.output()}")
        client = await Client.connect(f"127.0.0.1:{port}", data_converter=data_converter(None))
        handle = client.get_workflow_handle("edited-run")
        assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
        await asyncio.to_thread(again.terminate)  # graceful: it stops its server too
    finally:
        again.close()


async def test_the_limiter_follows_the_current_build(client: Client, tmp_path: Path) -> None:
    # a tight limit: each step asks the limiter itself (queued), never a leased block
    # its process already holds, so every run gives the limiter a workflow task
    base = versioned(tmp_path, rate_limits=tuple(parse_rate_limits("validator:acme=60/min")))
    name = deployment_name(base)
    ran: list[str] = []
    queue = base.queue(names.PIPELINES_QUEUE)
    query = f"WorkflowType = '{names.LIMITER_WORKFLOW}' AND TaskQueue = '{queue}'"

    async def limiter() -> WorkflowHandle[Any, Any] | None:
        found = [wf async for wf in client.list_workflows(query)]
        return client.get_workflow_handle(found[0].id) if found else None

    pipeline = one_step_pipeline("limited")
    async with running_stack(
        client, built(base, "v1"), replace_activities={names.VALIDATOR: recorder("v1", ran)}
    ) as old:
        await ensure_current(client, built(base, "v1"))
        first = await old.start(pipeline)
        assert (await first.result()).status == "succeeded"
        handle = await wait_until(limiter, "the limiter to be listed")
        info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
        assert info.versioning_override.auto_upgrade  # started to follow the current build
        assert info.deployment_version.build_id == "v1"
        async with running_stack(
            client, built(base, "v2"), replace_activities={names.VALIDATOR: recorder("v2", ran)}
        ) as new:
            await ensure_current(client, built(base, "v2", deployment_current="always"))
            second = await new.start(pipeline)
            assert (await second.result()).status == "succeeded"
            assert await build_of(second) == "v2" and await build_of(first) == "v1"

            async def moved() -> bool:
                desc = (await handle.describe()).raw_description.workflow_execution_info
                if desc.versioning_info.deployment_version.build_id == "v2":
                    return True
                # It moves at its next workflow task on the current build; a task that
                # ran before the server routed to v2 leaves it on v1 until the next one.
                extra = await new.start(pipeline)
                assert (await extra.result()).status == "succeeded"
                return False

            await wait_until(moved, f"the limiter of {name} to move to v2")
