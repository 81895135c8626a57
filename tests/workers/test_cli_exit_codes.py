"""Every documented exit code, through the real ``aiworker`` command line.

docs/cli.md has a table of exit codes (0 done, 1 failed, 2 bad request, 3 not
found, 130 Ctrl-C) and per-command rows that name some more paths. ``CASES``
is one table: a command line as a user types it (placeholders for the things
it points at), the code it must end with and a part of what it prints. Each
case runs ``python -m aiworker.workers.cli.main`` as its own process against
the session's real Temporal server, with an in-process worker stack for the
pipelines it starts.

Two tests keep the table whole: every command and subcommand the parser
knows has at least one case (a new command without one fails here), and every
code of the docs' table is run by at least one case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.payloads import stack_settings
from support.procs import run_cli_module
from support.waiting import wait_until
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from aiworker.workers.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
)
from aiworker.workers.cli.parser import build_parser
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.schedules.schedules import create_schedule
from aiworker.workers.schedules.specs import ScheduleOptions, parse_interval

REPO = Path(__file__).resolve().parents[2]
HISTORY = REPO / "tests" / "workflows" / "histories" / "dag.json"

OK = {
    "name": "exit-ok",
    "steps": [{"id": "v", "worker": "validator", "input": {"data": 1, "schema": {}}}],
}
# the gate does not pass: `after` is blocked and the run ends `partial`
FAILING = {
    "name": "exit-failing",
    "steps": [
        {"id": "v", "worker": "validator", "input": {"data": 1, "schema": {"type": "string"}}},
        {"id": "after", "worker": "validator", "gate": "v", "input": {"data": 1, "schema": {}}},
    ],
}
INVALID = {"name": "exit-invalid", "steps": [{"id": "v", "worker": "no-such-worker"}]}
UNREACHABLE = {"TEMPORAL_ADDRESS": "127.0.0.1:9"}


@dataclass(frozen=True)
class Case:
    """One command line and what it must end with.

    ``argv`` may name ``{placeholders}`` the world fills in (see :class:`World`);
    ``env`` adds to the environment (``{nobody}``: a task-queue suffix nobody
    polls); ``interrupt``: send SIGINT once the workflow ``{fresh}`` exists.
    """

    argv: tuple[str, ...]
    code: int
    says: str
    env: dict[str, str] = field(default_factory=dict)
    interrupt: bool = False


def case(*argv: str, code: int, says: str, **kw: object) -> Case:
    return Case(tuple(argv), code, says, **kw)  # type: ignore[arg-type]


CASES: dict[str, Case] = {
    # --- pipelines -------------------------------------------------------------
    "run-succeeded": case("run", "{ok}", code=EXIT_OK, says="succeeded"),
    "run-failed": case("run", "{failing}", code=EXIT_FAILED, says="partial"),
    "run-json-failed": case("run", "{failing}", "--json", code=EXIT_FAILED, says='"partial"'),
    "run-invalid": case("run", "{invalid}", code=EXIT_USAGE, says="unknown worker"),
    "run-id-running": case(
        "run", "{ok}", "--id", "{other}", code=EXIT_USAGE, says="is already running"
    ),
    "run-unreachable": case(
        "run", "{ok}", code=EXIT_FAILED, says="cannot reach Temporal", env=UNREACHABLE
    ),
    "run-ctrl-c": case(
        "run",
        "{ok}",
        "--id",
        "{fresh}",
        code=EXIT_INTERRUPTED,
        says="",
        env={"AIWORKER_TASK_QUEUE_SUFFIX": "{nobody}"},
        interrupt=True,
    ),
    # the tenant's quote threshold (0 USD): accepted, the run starts whatever the quote
    "run-accept-quote": case(
        "run",
        "{ok}",
        "--accept-quote",
        code=EXIT_OK,
        says="succeeded",
        env={"AIWORKER_TENANTS_FILE": "{quote_tenants}"},
    ),
    "check-valid": case("check", "{ok}", "--local", code=EXIT_OK, says="ok: "),
    "check-invalid": case("check", "{invalid}", "--local", code=EXIT_USAGE, says="no-such-worker"),
    "check-quote": case("check", "--quote", "{ok}", "--local", code=EXIT_OK, says="quote for"),
    "check-quote-invalid": case(
        "check", "--quote", "{invalid}", "--local", code=EXIT_USAGE, says="no-such-worker"
    ),
    "list": case("list", "--limit", "1", code=EXIT_OK, says="workflow id"),
    "list-bad-tenant": case("list", "--tenant", "No Such", code=EXIT_USAGE, says="tenant name"),
    "list-unreachable": case("list", code=EXIT_FAILED, says="cannot reach", env=UNREACHABLE),
    "review-unknown-id": case(
        "review", "{missing}", "approve", code=EXIT_NOT_FOUND, says="not found"
    ),
    "review-ended-run": case("review", "{done}", "approve", code=EXIT_FAILED, says="already ended"),
    "review-bad-outputs": case(
        "review", "{done}", "approve", "--outputs", "{{", code=EXIT_USAGE, says="not valid JSON"
    ),
    "callback-unknown-token": case(
        "callback",
        "awt1.bm9uZQ." + "a" * 43,
        "--outputs",
        "{}",
        code=EXIT_NOT_FOUND,
        says="unknown callback token",
    ),
    "callback-not-a-token": case(
        "callback", "{missing}", "--fail", "no", code=EXIT_NOT_FOUND, says="unknown callback token"
    ),
    "callback-bad-outputs": case(
        "callback", "{missing}", "--outputs", "{{", code=EXIT_USAGE, says="not valid JSON"
    ),
    "redrive-unknown-id": case("redrive", "{missing}", code=EXIT_NOT_FOUND, says="not found"),
    "redrive-succeeded": case("redrive", "{done}", code=EXIT_USAGE, says="nothing to redrive"),
    "redrive-from-unknown-step": case(
        "redrive", "{done}", "--from", "nope", code=EXIT_USAGE, says="no top-level step"
    ),
    "redrive-input-not-json": case(
        "redrive", "{done}", "--from", "v", "--input", "v={", code=EXIT_USAGE, says="not JSON"
    ),
    "redrive-input-other-step": case(
        "redrive",
        "{done}",
        "--from",
        "v",
        "--input",
        "w={}",
        code=EXIT_USAGE,
        says="only the --from step",
    ),
    "redrive-input-off-schema": case(
        "redrive",
        "{done}",
        "--from",
        "v",
        "--input",
        'v={"schema": {}}',
        code=EXIT_USAGE,
        says="--input v:",
    ),
    "redrive-new-keys-unknown-id": case(
        "redrive",
        "{missing}",
        "--from",
        "v",
        "--new-idempotency-keys",
        code=EXIT_NOT_FOUND,
        says="not found",
    ),
    "redrive-id-and-query": case(
        "redrive", "{done}", "--query", "x = 'y'", code=EXIT_USAGE, says="not both"
    ),
    "redrive-query-dry-run": case(
        "redrive",
        "--query",
        "AiworkerPipeline = 'none-such'",
        "--dry-run",
        code=EXIT_OK,
        says="0 pipelines match",
    ),
    "cancel-unknown-id": case("cancel", "{missing}", code=EXIT_NOT_FOUND, says="not found"),
    "cancel-ended": case("cancel", "{done}", code=EXIT_FAILED, says="already ended"),
    "cancel-query-refused": case(
        "cancel", "--query", "NoSuchAttribute = 'x'", code=EXIT_USAGE, says="refused the query"
    ),
    "cancel-query-unbalanced": case(
        "cancel", "--query", "a = 'b') OR (1 = 1", code=EXIT_USAGE, says="closes more than"
    ),
    "cancel-query-comment": case(
        "cancel",
        "--query",
        "/*(*/ a = 'b') OR (1 = 1 /*)*/",
        code=EXIT_USAGE,
        says="comments are not allowed",
    ),
    "terminate-not-a-pipeline": case(
        "terminate", "{other}", code=EXIT_USAGE, says="not a pipeline"
    ),
    "terminate-unknown-id": case("terminate", "{missing}", code=EXIT_NOT_FOUND, says="not found"),
    "terminate-query-dry-run": case(
        "terminate",
        "--query",
        "AiworkerPipeline = 'none-such'",
        "--all-tenants",
        "--dry-run",
        code=EXIT_OK,
        says="0 pipelines match",
    ),
    "redrive-fails-again": case("redrive", "{failed}", code=EXIT_FAILED, says="redriving"),
    "artifacts-none": case("artifacts", "{missing}", code=EXIT_NOT_FOUND, says="no artifacts"),
    "artifacts-json": case("artifacts", "{missing}", "--json", code=EXIT_OK, says="[]"),
    "items-unknown-id": case("items", "{missing}", "v", code=EXIT_NOT_FOUND, says="not found"),
    "items-not-for-each": case("items", "{done}", "v", code=EXIT_USAGE, says="not a for_each"),
    # --- schedules -------------------------------------------------------------
    "schedule-create": case(
        "schedule",
        "create",
        "{ok}",
        "-s",
        "{fresh}",
        "--interval",
        "1h",
        "--paused",
        code=EXIT_OK,
        says="created schedule",
    ),
    "schedule-create-exists": case(
        "schedule",
        "create",
        "{ok}",
        "-s",
        "{schedule}",
        "--interval",
        "1h",
        code=EXIT_USAGE,
        says="exists",
    ),
    "schedule-create-bad-cron": case(
        "schedule",
        "create",
        "{ok}",
        "-s",
        "{fresh}",
        "--cron",
        "61 * * * *",
        code=EXIT_USAGE,
        says="invalid schedule",
    ),
    "schedule-create-invalid-pipeline": case(
        "schedule",
        "create",
        "{invalid}",
        "--interval",
        "1h",
        code=EXIT_USAGE,
        says="unknown worker",
    ),
    "schedule-list": case("schedule", "list", code=EXIT_OK, says="schedule id"),
    "schedule-list-bad-tenant": case(
        "schedule", "list", "--tenant", "No Such", code=EXIT_USAGE, says="tenant name"
    ),
    "schedule-describe": case("schedule", "describe", "{schedule}", code=EXIT_OK, says="spec"),
    "schedule-describe-unknown": case(
        "schedule", "describe", "{missing}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-describe-deleted": case(
        "schedule", "describe", "{deleted}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-describe-no-id": case("schedule", "describe", code=EXIT_USAGE, says="schedule id"),
    "schedule-pause": case("schedule", "pause", "{schedule}", code=EXIT_OK, says="paused"),
    "schedule-pause-deleted": case(
        "schedule", "pause", "{deleted}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-unpause": case("schedule", "unpause", "{schedule}", code=EXIT_OK, says="unpaused"),
    "schedule-unpause-deleted": case(
        "schedule", "unpause", "-s", "{deleted}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-trigger": case("schedule", "trigger", "{schedule}", code=EXIT_OK, says="triggered"),
    "schedule-trigger-skipped": case(
        "schedule", "trigger", "{stuck_schedule}", code=EXIT_FAILED, says="skipped"
    ),
    "schedule-trigger-deleted": case(
        "schedule", "trigger", "{deleted}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-delete": case("schedule", "delete", "{schedule}", code=EXIT_OK, says="deleted"),
    "schedule-delete-deleted": case(
        "schedule", "delete", "{deleted}", code=EXIT_NOT_FOUND, says="not found"
    ),
    "schedule-delete-unknown": case(
        "schedule", "delete", "{missing}", code=EXIT_NOT_FOUND, says="not found"
    ),
    # --- the front door --------------------------------------------------------
    "serve-bad-keys-file": case(
        "serve",
        "--port",
        "0",
        code=EXIT_USAGE,
        says="{bad_keys}",
        env={"AIWORKER_API_KEYS_FILE": "{bad_keys}"},
    ),
    "keys-add": case(
        "keys",
        "add",
        "{fresh}",
        "--tenant",
        "acme",
        "--file",
        "{keys}",
        code=EXIT_OK,
        says="shown once",
    ),
    "keys-add-taken": case(
        "keys",
        "add",
        "taken",
        "--tenant",
        "acme",
        "--file",
        "{keys}",
        code=EXIT_USAGE,
        says="exists already",
    ),
    "keys-add-no-file": case(
        "keys", "add", "x", "--tenant", "acme", code=EXIT_USAGE, says="--file"
    ),
    # --- workers and processes -------------------------------------------------
    "worker-unknown-queue": case(
        "worker", "-q", "nosuch", "--wait", "1", code=EXIT_USAGE, says="nosuch"
    ),
    "worker-unreachable": case(
        "worker", "--wait", "1", code=EXIT_FAILED, says="Temporal", env=UNREACHABLE
    ),
    "workers-local": case("workers", "--local", code=EXIT_OK, says="validator"),
    "workers-bad-flag": case("workers", "--bogus", code=EXIT_USAGE, says="unrecognized"),
    "dev-busy-port": case(
        "dev",
        "--port",
        "{busy_port}",
        "--headless",
        "--no-model",
        "--data-dir",
        "{data}",
        code=EXIT_USAGE,
        says="{busy_port}",
    ),
    "demo-missing-pipeline": case(
        "demo", "--pipeline", "/nonexistent.json", code=EXIT_USAGE, says="cannot read"
    ),
    "conformance-passes": case("conformance", "validator", code=EXIT_OK, says="validator"),
    "conformance-nobody-serves": case(
        "conformance",
        "validator",
        "--timeout",
        "2",
        code=EXIT_FAILED,
        says="validator",
        env={"AIWORKER_TASK_QUEUE_SUFFIX": "{nobody}"},
    ),
    "conformance-unknown-worker": case(
        "conformance", "nosuch", code=EXIT_USAGE, says="unknown worker"
    ),
    "conformance-unreachable": case(
        "conformance",
        "validator",
        code=EXIT_FAILED,
        says="cannot reach Temporal",
        env=UNREACHABLE,
    ),
    "deployment-list": case("deployment", "list", code=EXIT_OK, says=""),
    "deployment-versions-unknown": case(
        "deployment",
        "versions",
        "-d",
        "{missing}",
        code=EXIT_NOT_FOUND,
        says="no worker deployment",
    ),
    "deployment-set-current-unknown": case(
        "deployment", "set-current", "b1", "-d", "{missing}", code=EXIT_NOT_FOUND, says="{missing}"
    ),
    "deployment-ramp-unknown": case(
        "deployment", "ramp", "b1", "10", "-d", "{missing}", code=EXIT_NOT_FOUND, says="{missing}"
    ),
    "deployment-ramp-no-build": case(
        "deployment", "ramp", code=EXIT_USAGE, says="give BUILD_ID and PERCENT"
    ),
    "deployment-drain-unknown": case(
        "deployment",
        "drain",
        "b1",
        "-d",
        "{missing}",
        code=EXIT_NOT_FOUND,
        says="no worker deployment",
    ),
    # --- evals ----------------------------------------------------------------
    "eval-dataset-unknown-worker": case(
        "eval",
        "dataset",
        "--worker",
        "no-such-worker",
        "-o",
        "{eval_out}",
        code=EXIT_USAGE,
        says="unknown worker 'no-such-worker'",
    ),
    "eval-dataset-empty": case(
        "eval",
        "dataset",
        "--worker",
        "validator",
        "--pipeline",
        "{fresh}",
        "-o",
        "{eval_out}",
        code=EXIT_NOT_FOUND,
        says="no recorded calls of worker 'validator' match",
    ),
    "eval-run": case(
        "eval",
        "run",
        "{eval_dataset}",
        "--task-queue",
        "aiworker-pipelines",
        "--max-pass-drop",
        "0",
        code=EXIT_OK,
        says="Gate: passed",
    ),
    "eval-run-malformed-dataset": case(
        "eval",
        "run",
        "{eval_malformed}",
        "--model",
        "default",
        code=EXIT_USAGE,
        says="dataset line 2: not valid JSON",
    ),
    "eval-run-invalid-candidate": case(
        "eval",
        "run",
        "{eval_dataset}",
        "--candidate",
        "{invalid}",
        code=EXIT_USAGE,
        says="invalid candidate spec",
    ),
    # a worker with side effects is refused before anything runs, on any queue
    "eval-run-side-effects": case(
        "eval",
        "run",
        "{eval_publish}",
        "--task-queue",
        "sandbox",
        code=EXIT_USAGE,
        says="has side effects",
    ),
    "eval-show-unknown-item": case(
        "eval", "show", "{eval_report}", "nope", code=EXIT_NOT_FOUND, says="has no item 'nope'"
    ),
    "eval-show": case("eval", "show", "{eval_report}", "v1", code=EXIT_OK, says='"id": "v1"'),
    "schemas-check": case("schemas", "check", code=EXIT_OK, says=""),
    "schemas-bad-action": case("schemas", "bogus", code=EXIT_USAGE, says="invalid choice"),
    "replay-history": case("replay", str(HISTORY), code=EXIT_OK, says="replayed"),
    "replay-missing-file": case(
        "replay", "/nonexistent/h.json", code=EXIT_USAGE, says="cannot read"
    ),
    "replay-malformed": case("replay", "{bad_keys}", code=EXIT_USAGE, says="{bad_keys}"),
    "no-command": case(code=EXIT_USAGE, says="required"),
    "bad-setting": case(
        "list", code=EXIT_USAGE, says="AIWORKER_LOG_LEVEL", env={"AIWORKER_LOG_LEVEL": "LOUD"}
    ),
}


# --- the table stays whole ------------------------------------------------------------------


def command_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command the parser knows, as the words that name it (``schedule delete``)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix
    for action in subs:
        for name, sub in action.choices.items():
            yield from command_paths(sub, (*prefix, name))


def command_of(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The command a case's argv runs (its leading words that name subcommands)."""
    known = set(command_paths(build_parser()))
    words: tuple[str, ...] = ()
    for word in argv:
        if any(path[: len(words) + 1] == (*words, word) for path in known):
            words = (*words, word)
        else:
            break
    return words


def documented_codes() -> set[int]:
    text = (REPO / "docs" / "cli.md").read_text("utf-8")
    table = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}


def test_every_command_has_a_case() -> None:
    covered = {command_of(c.argv) for c in CASES.values()}
    missing = [" ".join(p) for p in command_paths(build_parser()) if p not in covered]
    assert missing == [], f"commands with no exit-code case in CASES: {missing}"


def test_every_documented_code_has_a_case() -> None:
    codes = documented_codes()
    assert {0, 1, 2, 3, 130} <= codes, codes
    missing = codes - {c.code for c in CASES.values()}
    assert not missing, f"documented exit codes with no case in CASES: {sorted(missing)}"


# --- the world the commands point at -----------------------------------------------------------


@dataclass
class World:
    """What the cases point at, on one worker stack for the module."""

    stack: Stack
    env: dict[str, str]
    files: dict[str, str]
    done: str
    failed: str
    other: str
    busy_port: int
    nobody: str  # a task-queue suffix no worker polls

    async def fill(self, text: str, tmp: Path, fixed: dict[str, str]) -> str:
        """``text`` with its placeholders filled (``fixed``: ``fresh`` and ``missing``,
        the same in every part of one case); schedules are made as named."""
        values: dict[str, Callable[[], Awaitable[str]] | str] = {
            **fixed,
            **self.files,
            "done": self.done,
            "failed": self.failed,
            "other": self.other,
            "busy_port": str(self.busy_port),
            "nobody": self.nobody,
            "data": str(tmp / "data"),
            "schedule": lambda: self.schedule(),
            "deleted": lambda: self.schedule(deleted=True),
            "stuck_schedule": lambda: self.stuck_schedule(),
        }
        for name in re.findall(r"\{(\w+)\}", text):
            value = values[name]
            filled = value if isinstance(value, str) else await value()
            text = text.replace("{" + name + "}", filled, 1)
        return text

    async def schedule(self, *, deleted: bool = False) -> str:
        sid = f"exit-{uuid.uuid4().hex[:8]}"
        pipelines = PipelineClient(self.stack.client, self.stack.settings)
        options = ScheduleOptions(intervals=[parse_interval("1h")], paused=True)
        await create_schedule(pipelines, sid, OK, options)
        if deleted:
            await self.stack.client.get_schedule_handle(sid).delete()
        return sid

    async def stuck_schedule(self) -> str:
        """A schedule whose one run stays open (its queue has no worker): the next
        trigger is skipped by the Skip overlap policy."""
        sid = f"stuck-{uuid.uuid4().hex[:8]}"
        nobody = self.stack.settings.model_copy(update={"task_queue_suffix": self.nobody})
        pipelines = PipelineClient(self.stack.client, nobody)
        await create_schedule(
            pipelines, sid, OK, ScheduleOptions(intervals=[parse_interval("1h")], paused=True)
        )
        handle = self.stack.client.get_schedule_handle(sid)
        await handle.trigger()

        async def running() -> bool:
            return len((await handle.describe()).info.running_actions) == 1

        await wait_until(running, "the stuck schedule's first run to be open")
        return sid


@pytest_asyncio.fixture(scope="module")
async def world(
    env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("exit-codes")
    settings = stack_settings(tmp)
    client: Client = env.client
    files = {}
    for name, doc in (("ok", OK), ("failing", FAILING), ("invalid", INVALID)):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(doc))
        files[name] = str(path)
    keys = tmp / "keys.json"
    files["keys"] = str(keys)
    validator_item = {"id": "v1", "worker": "validator", "input": {"data": 1, "schema": {}}}
    (tmp / "eval.jsonl").write_text(json.dumps(validator_item) + "\n")
    files["eval_dataset"] = str(tmp / "eval.jsonl")
    (tmp / "eval-bad.jsonl").write_text(json.dumps(validator_item) + "\n{ nope\n")
    files["eval_malformed"] = str(tmp / "eval-bad.jsonl")
    files["eval_out"] = str(tmp / "eval-out.jsonl")
    publish_item = {"id": "p1", "worker": "publish", "input": {"sink": {"file": "x.jsonl"}}}
    (tmp / "eval-publish.jsonl").write_text(json.dumps(publish_item) + "\n")
    files["eval_publish"] = str(tmp / "eval-publish.jsonl")
    (tmp / "eval-report.json").write_text(json.dumps({"items": [{"id": "v1"}]}))
    files["eval_report"] = str(tmp / "eval-report.json")
    (tmp / "quote-tenants.json").write_text(
        json.dumps({"tenants": {"default": {"quote_accept_above_usd": 0}}})
    )
    files["quote_tenants"] = str(tmp / "quote-tenants.json")
    bad_keys = tmp / "bad.json"
    bad_keys.write_text("{ not json")
    files["bad_keys"] = str(bad_keys)
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    cli_env.update(
        TEMPORAL_ADDRESS=client.service_client.config.target_host,
        AIWORKER_TASK_QUEUE_SUFFIX=settings.task_queue_suffix,
        AIWORKER_DATA_DIR=str(settings.data_dir),
        AIWORKER_METRICS_PORT="0",
    )
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    async with running_stack(client, settings) as stack:
        done = await stack.start(OK)
        await done.result()
        failed = await stack.start(FAILING)
        await failed.result()
        other = await client.start_workflow(
            "NotAPipeline", id=f"other-{uuid.uuid4().hex[:8]}", task_queue="nobody-polls"
        )
        # a key named "taken" in the keys file
        proc = await asyncio.to_thread(
            run_cli, ["keys", "add", "taken", "--tenant", "acme", "--file", str(keys)], cli_env
        )
        assert proc.returncode == 0, proc.stderr
        try:
            yield World(
                stack,
                cli_env,
                files,
                done.id,
                failed.id,
                other.id,
                busy.getsockname()[1],
                f"-nobody{uuid.uuid4().hex[:8]}",
            )
        finally:
            busy.close()
            await other.terminate()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli_module(args, env, timeout=120)


# `python -m aiworker.workers.cli.main ARGS...` with SIGINT raising KeyboardInterrupt
_WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'aiworker'; runpy.run_module('aiworker.workers.cli.main', run_name='__main__')"
)


async def interrupted(
    args: list[str], env: dict[str, str], client: Client, wid: str
) -> tuple[int, str]:
    """Run the command, press Ctrl-C (SIGINT) once workflow ``wid`` exists.

    The command starts with Python's own SIGINT handler whatever this process
    inherited: a test session started in the background of a shell without job
    control ignores SIGINT, and so would the command (as it should, there).
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_SIGINT, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:

        async def started() -> bool:
            try:
                await client.get_workflow_handle(wid).describe()
            except RPCError:
                return False
            return True

        await wait_until(started, f"workflow {wid} to start", timeout=60)
        proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
        return proc.returncode, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaps it and closes its pipes


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
async def test_exit_code(world: World, name: str, tmp_path: Path) -> None:
    c = CASES[name]
    fixed = {"fresh": f"fresh-{uuid.uuid4().hex[:8]}", "missing": f"nope-{uuid.uuid4().hex[:8]}"}
    args = [await world.fill(a, tmp_path, fixed) for a in c.argv]
    env = {**world.env, **{k: await world.fill(v, tmp_path, fixed) for k, v in c.env.items()}}
    says = await world.fill(c.says, tmp_path, fixed)
    fresh = fixed["fresh"]
    if c.interrupt:
        code, stderr = await interrupted(args, env, world.stack.client, fresh)
        await world.stack.client.get_workflow_handle(fresh).terminate()
        assert code == c.code, stderr
        assert "Traceback" not in stderr, stderr
        return
    proc = await asyncio.to_thread(run_cli, args, env)
    shown = proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == c.code, shown
    assert says in shown, shown
    # what goes wrong is said in lines of its own, each `aiworker...: ...`
    assert all(line.startswith("aiworker") for line in proc.stderr.splitlines()), proc.stderr
    if c.code == EXIT_NOT_FOUND:
        assert len(proc.stderr.splitlines()) == 1 and proc.stdout == "", shown
