"""The replay gate: every committed history replays on this code, through
``aiworker replay`` (the CLI, as CI and a deploy pipeline run it) and in process
with the SDK's default sandbox, which passes none of aiworker's modules through.

The histories come from ``record_histories.py`` (``recorded-specs`` from
``test_recorded_specs.py`` with ``AIWORKER_RECORD_HISTORIES=1``: a run that
recorded its workers' specs on a catalog of spec files and a plugin this replay
never installs), every shape recorded on the current code. A pinned workflow
(pipeline, chunk, agent, eval) never meets newer code, so its histories are
re-recorded with each change of its code and guard that change from then on;
they record no patch marker. The auto-upgrade workflows (limiter, breaker,
registry, flow) do meet newer code: their patches stay until their plan removes
them, and ``breaker-20261127`` (a ``SharedBreakerWorkflow`` from before the
``breaker-probe-lease`` patch) guards that patch's old branch until then.
A history's workflow id (permit tickets carry it) is read from its first event.
``agent-limited`` (and its ``-child``) is an agent under a tenant's rate limits,
its turns and tool calls waiting for permits; ``agent-mcp`` (and its ``-child``)
an agent whose tool is an MCP server's, listed and called through ``mcp-call``
activities. ``breaker`` is a ``SharedBreakerWorkflow`` granting and refusing the
half-open probe lease. ``lost-usage`` is a call whose two attempts the server
timed out, booked at their maximum. ``tolerated`` (and ``-chunk``,
``-chunk-cancelled``) is a for_each whose ``tolerated_failures`` was passed: a
chunk that stopped on its own failures, and one the pipeline cancelled, its
activities cancelled in flight. ``flow-*`` are ``PipelineFlowWorkflow``
histories, one per mode (debounce, singleton wait, batch, throttle): the flow
workflow's own history (its updates, timers and child starts); the runs it
started are plain pipelines. ``flow-scheduled`` is a schedule's
``ScheduledFlowStart``: one ``flow-submit`` activity that sends the start
through the key's flow.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from collector_probe import CollectorProbeWorkflow
from conftest import running_stack
from support.standins import fail, standin
from support.waiting import wait_until
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from aiworker.config.settings import Settings
from aiworker.schemas import names
from aiworker.workers.client.temporal_client import data_converter
from aiworker.workers.devstack.devserver import temporal_cli_path
from aiworker.workers.process.replay import MAX_HISTORY_FILE_BYTES, load_history
from aiworker.workers.process.task_queues import WORKFLOWS_BY_QUEUE

FOLDER = Path(__file__).parent / "histories"
HISTORIES = sorted(FOLDER.glob("*.json"))

# Every pipeline shape the recorder covers (record_histories.RECORDINGS).
SHAPES = {
    "dag",
    "recorded-specs",
    "foreach",
    "foreach-chunk",
    "loop",
    "review",
    "review-approve",
    "review-reject",
    "review-timeout",
    "redrive",
    "redrive-failed",
    "foreach-tree",
    "foreach-tree-group",
    "foreach-tree-leaf",
    "items-ref",
    "items-ref-chunk",
    "agent",
    "agent-child",
    "agent-limited",
    "agent-limited-child",
    "agent-mcp",
    "agent-mcp-child",
    "cancel",
    "schedule",
    "registry",
    "limited-blocks",
    "limited-blocks-chunk",
    "limiter-blocks",
    "limited-queued-chunk",
    "limiter-queued",
    "items-per-task",
    "items-per-task-chunk",
    "breaker",
    "lost-usage",
    "wait",
    "wait-review",
    "tolerated",
    "tolerated-chunk",
    "tolerated-chunk-cancelled",
    "flow-debounce",
    "flow-singleton",
    "flow-batch",
    "flow-throttle",
    "flow-scheduled",
    "eval",
}
# Histories of older code kept on purpose: only an auto-upgrade workflow's, while a
# patch of its still has the old branch they take (workflows/breakers.py's plan).
OLDER_CODE = {"breaker-20261127"}
# The workflow types that run pinned: their histories record no patch marker.
PINNED = {
    names.PIPELINE_WORKFLOW,
    names.FOREACH_WORKFLOW,
    names.AGENT_WORKFLOW,
    names.EVAL_WORKFLOW,
    "ScheduledFlowStart",
}


def test_histories_are_committed() -> None:
    assert SHAPES | OLDER_CODE == {p.stem for p in HISTORIES}


def test_no_pinned_history_records_a_patch() -> None:
    """A pinned run never meets newer code: what it records is one way to run."""
    pinned = [p.stem for p in HISTORIES if _workflow_type(p.stem) in PINNED]
    assert len(pinned) > len(HISTORIES) // 2  # the types above name what is recorded
    assert {name: _patches(name) for name in pinned if _patches(name)} == {}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``aiworker replay ARGS`` in a process of its own, as CI runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    return subprocess.run(
        [sys.executable, "-m", "aiworker.workers.cli.main", "replay", *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(300)
def test_the_gate_replays_every_committed_history() -> None:
    proc = cli(str(FOLDER))
    assert proc.returncode == 0, proc.stderr
    replayed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert replayed == [str(p) for p in HISTORIES]
    assert f"replayed {len(HISTORIES)} histories" in proc.stdout


def _swap_activity(history: dict[str, Any], nth: int) -> tuple[str, str]:
    """Rename the ``nth`` scheduled activity (to another worker): the history of
    code that called another worker there. Returns its event id and new name."""
    found = [e for e in history["events"] if "activityTaskScheduledEventAttributes" in e]
    event = found[nth]
    kind = event["activityTaskScheduledEventAttributes"]["activityType"]
    kind["name"] = "aggregator" if kind["name"] != "aggregator" else "validator"
    return event["eventId"], kind["name"]


@pytest.mark.timeout(120)
def test_a_changed_history_stops_the_gate_naming_the_history_and_the_event(
    tmp_path: Path,
) -> None:
    history = json.loads((FOLDER / "agent-child.json").read_text("utf-8"))
    event_id, _ = _swap_activity(history, 1)  # the tool call after the first turn
    broken = tmp_path / "agent-child-changed.json"
    broken.write_text(json.dumps(history), "utf-8")
    good = FOLDER / "dag.json"
    # files replay in the order given: the good one first, the gate stops at the broken one
    proc = cli(str(good), str(broken), str(FOLDER / "cancel.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"ok {good}" in proc.stdout
    assert "cancel.json" not in proc.stdout  # stopped at the first failure
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback, no Core warnings
    assert lines[0].startswith(f"aiworker: {broken}: nondeterminism at event {event_id} ")
    assert "(EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)" in lines[0]
    assert "workflow replay-agent/agent run " in lines[0]
    assert "Activity type" in lines[0]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"events": [1, 2', "not valid JSON"),
        ('{"steps": []}', "not a workflow history"),
        (
            '{"events": [{"eventId": "1", "eventType": "EVENT_TYPE_NOPE"}]}',
            "not a workflow history",
        ),
        (
            '{"events": [{"eventId": "1", "eventType": "EVENT_TYPE_TIMER_FIRED"}]}',
            "no workflow start",
        ),
        (
            '{"events": [{"eventId": "1", "eventType": "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED", '
            '"workflowExecutionStartedEventAttributes": {"workflowType": {"name": "Mine"}}}]}',
            "a 'Mine' workflow is not aiworker's",
        ),
        (b"\xff\xfe{", "not UTF-8"),
        # nested past what anything recursive should read (the JSON decoder answered
        # RecursionError, exit 1 as if the code were nondeterministic)
        ('{"events": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 100"),
        ('{"events": [' + '{"a": ' * 100_000, "nested deeper than 100"),
        # 90 levels: under the cap, read, and named for what it is
        ('{"events": [{"cause": ' * 30 + "1" + "}]}" * 30, "not a workflow history"),
    ],
    ids=[
        "cut",
        "pipeline",
        "bad-enum",
        "no-start",
        "foreign-type",
        "binary",
        "deep",
        "deep-cut",
        "deep-90",
    ],
)
def test_a_malformed_history_file_is_bad_usage(
    content: str | bytes, says: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content, "utf-8")
    proc = cli(str(FOLDER / "dag.json"), str(bad))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # checked before anything replays
    assert proc.stderr.startswith(f"aiworker: {bad}") and says in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_history_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:  # sparse: its size is all there is to it
        f.truncate(MAX_HISTORY_FILE_BYTES + 1)
    proc = cli(str(huge))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"aiworker: {huge}: {MAX_HISTORY_FILE_BYTES + 1} bytes")


def test_nothing_to_replay_is_bad_usage(tmp_path: Path) -> None:
    assert cli().returncode == 2
    proc = cli(str(tmp_path))
    assert proc.returncode == 2 and "no *.json history files" in proc.stderr
    proc = cli(str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr


@pytest.mark.timeout(120)
async def test_query_replays_running_and_closed_workflows_of_the_namespace(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    pipeline = {
        "name": "gate",
        "steps": [{"id": "check", "worker": "validator", "input": {"data": 1, "schema": {}}}],
    }
    review = {
        "name": "gate-review",
        "steps": [
            {
                "id": "draft",
                "worker": "aggregator",
                "input": {"policy": "all", "branches": {}},
                "on_failure": "escalate",
            }
        ],
    }

    async def garbage(req: dict[str, Any]) -> dict[str, Any]:
        raise fail("invalid_output", "garbage")

    acts = {"aggregator": standin("aggregator", garbage)}
    async with running_stack(client, settings, replace_activities=acts) as stack:
        done = await stack.start(pipeline)
        await done.result()
        waiting = await stack.start(review)

        async def awaiting() -> bool:
            p = await waiting.query(names.PROGRESS_QUERY)
            return bool(p["awaiting_review"])

        await wait_until(awaiting, "review")
        # a workflow of another kind in the namespace is named and skipped
        queue = f"other-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=[CollectorProbeWorkflow]):
            other = await client.start_workflow(
                CollectorProbeWorkflow.run, id=f"other-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            await other.result()
        query = f"WorkflowId IN ('{done.id}', '{waiting.id}', '{other.id}')"
        address = client.service_client.config.target_host
        proc = await asyncio.to_thread(cli, "--query", query, TEMPORAL_ADDRESS=address)
        await waiting.terminate()
        # what the temporal CLI writes is a history file as the gate reads it
        show = [str(temporal_cli_path()), "workflow", "show", "--workflow-id", done.id]
        shown = await asyncio.to_thread(
            subprocess.run,
            [*show, "--output", "json", "--address", address, "--namespace", client.namespace],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    assert f"ok workflow {done.id} run {done.result_run_id}" in proc.stdout
    assert f"ok workflow {waiting.id} run " in proc.stdout
    assert "replayed 2 histories" in proc.stdout
    assert f"skip workflow {other.id} run {other.result_run_id} (CollectorProbeWorkflow)" in (
        proc.stdout
    )
    assert shown.returncode == 0, shown.stderr
    file = tmp_path / "shown.json"
    file.write_text(shown.stdout, "utf-8")
    assert load_history(file).history.workflow_id == done.id
    replayed = await asyncio.to_thread(cli, str(file))
    assert replayed.returncode == 0, replayed.stderr


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay_in_the_default_sandbox(path: Path) -> None:
    """The same histories with the SDK's default sandbox (nothing of aiworker passed
    through): the sandbox checks every workflow module, shared ones included."""
    replayer = Replayer(
        workflows=WORKFLOWS_BY_QUEUE[names.PIPELINES_QUEUE], data_converter=data_converter(None)
    )
    result = await replayer.replay_workflow(load_history(path).history)
    assert result.replay_failure is None


def _patches(name: str) -> set[str]:
    """The ``workflow.patched`` ids a committed history recorded."""
    history = json.loads((FOLDER / f"{name}.json").read_text("utf-8"))
    found = set()
    for event in history["events"]:
        marker = event.get("markerRecordedEventAttributes", {})
        if marker.get("markerName") == "core_patch":
            payload = marker["details"]["patch-data"]["payloads"][0]["data"]
            found.add(json.loads(base64.b64decode(payload))["id"])
    return found


def test_the_probe_lease_is_recorded_only_behind_its_patch() -> None:
    """A breaker that granted a probe lease records ``breaker-probe-lease``; one from
    before the lease carries no marker and still replays (the gate above)."""
    from aiworker.workflows.breakers import PROBE_LEASE_PATCH

    assert PROBE_LEASE_PATCH in _patches("breaker")
    assert PROBE_LEASE_PATCH not in _patches("breaker-20261127")


def test_an_agent_under_rate_limits_asks_a_permit_before_each_call() -> None:
    """One permit asked before each of its four calls (two turns, two tool calls);
    an agent without limits asks none."""
    assert _local_activities("agent-limited-child") == [names.LIMITER_ACQUIRE] * 4
    assert _local_activities("agent-child") == []


def _workflow_type(name: str) -> str:
    history = json.loads((FOLDER / f"{name}.json").read_text("utf-8"))
    started = history["events"][0]["workflowExecutionStartedEventAttributes"]
    return str(started["workflowType"]["name"])


def _local_activities(name: str) -> list[str]:
    """The activity types of the local activities a committed history recorded."""
    history = json.loads((FOLDER / f"{name}.json").read_text("utf-8"))
    found = []
    for event in history["events"]:
        marker = event.get("markerRecordedEventAttributes", {})
        if marker.get("markerName") == "core_local_activity":
            payload = marker["details"]["data"]["payloads"][0]["data"]
            found.append(json.loads(base64.b64decode(payload))["activity_type"])
    return found
