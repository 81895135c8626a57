"""The pipeline commands of the README and docs/running.md, run as written.

The README is the front page (a first pipeline); docs/running.md carries on
from it (review, redrive). Every `aiworker run|check|list|review|redrive` and
`temporal workflow ...` line of their shell blocks is extracted and run by
bash, in reading order (the README, then docs/running.md), from a directory
laid out like a checkout after `make` (`.venv/bin/aiworker`,
`.venv/bin/temporal` on the PATH, `examples/`),
against the session's Temporal server with a worker polling the unsuffixed
queues the README names. Each command has its expectation below; a README
command without one, or an expectation whose command left the README, fails.
Long-running commands (`aiworker dev`, `make demo`, deploy) are no pipeline
commands and stay out.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import running_stack
from support.payloads import stack_settings
from support.waiting import wait_until
from temporalio.client import Client

from aiworker.schemas import names
from aiworker.workers.client.client import PipelineClient
from aiworker.workers.devstack.devserver import temporal_cli_path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# The pages whose pipeline commands run here, in reading order.
PAGES = (README, REPO / "docs" / "running.md")
PIPELINE_COMMANDS = {"run", "check", "list", "review", "redrive"}


def readme_commands(text: str) -> list[str]:
    """The pipeline commands of the README's shell blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"^```(?:sh|bash|console)\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if len(words) < 2:
                continue
            aiworker = words[0].endswith("aiworker") and words[1] in PIPELINE_COMMANDS
            temporal = words[0] == "temporal" and words[1] == "workflow"
            if aiworker or temporal:
                out.append(line.strip())
    return out


def page_commands() -> list[str]:
    """The pipeline commands of every page in PAGES, the README's first."""
    return [line for page in PAGES for line in readme_commands(page.read_text("utf-8"))]


def key(line: str) -> str:
    """A command without its comment and spacing: what an expectation names."""
    return " ".join(shlex.split(line, comments=True))


@dataclass
class Ran:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Check = Callable[[Ran], None]
Before = Callable[[PipelineClient], Awaitable[None]]


def ok_json(check: Callable[[Any], None] | None = None, rc: int = 0) -> Check:
    def run(r: Ran) -> None:
        assert r.rc == rc, (r.out, r.err)
        if check is not None:
            check(r.json())

    return run


def matches(*patterns: str, rc: int = 0) -> Check:
    """Exit code ``rc`` and a line of the output matching each regex pattern."""

    def run(r: Ran) -> None:
        assert r.rc == rc, (r.out, r.err)
        for p in patterns:
            assert re.search(p, r.out + r.err, re.M), (p, r.out, r.err)

    return run


def contains(*parts: str, rc: int = 0) -> Check:
    def run(r: Ran) -> None:
        assert r.rc == rc, (r.out, r.err)
        for p in parts:
            assert p in r.out + r.err, (p, r.out, r.err)

    return run


def _reviewed(doc: Any) -> None:
    assert doc["decision"] == "approve"
    assert doc["step"] == "check"


async def _awaiting_review(pipelines: PipelineClient) -> None:
    """`aiworker list` reads visibility: wait until review-run shows there."""

    async def listed() -> bool:
        query = f"WorkflowId = 'review-run' AND {names.SA_STATUS} = 'awaiting_review'"
        return (await pipelines.temporal.count_workflows(query)).count == 1

    await wait_until(listed, "review-run to be listed as awaiting_review", timeout=30)


def _succeeded_with(doc: Any, output: dict[str, Any]) -> None:
    assert doc["status"] == "succeeded", doc
    assert doc["output"] == output
    assert doc["workflow_id"].startswith("hello-")


# README command (comment and spacing dropped) -> (wait before it, what it must do)
EXPECT: dict[str, tuple[Before | None, Check]] = {
    # without --json `aiworker run` shows progress lines and a summary table
    ".venv/bin/aiworker run examples/pipelines/hello.json": (
        None,
        matches(
            r"^hello: started hello-",
            r"^hello succeeded in \d+\.\ds$",
            r"^  check +validator +succeeded +1 +\d+\.\d\ds$",
            r"^  save +publish +succeeded +1 +\d+\.\d\ds$",
            r'^output: \{"valid": true, "published": true\}$',
            r"^workflow: hello-",
        ),
    ),
    ".venv/bin/aiworker run examples/pipelines/hello.json --json": (
        None,
        ok_json(lambda doc: _succeeded_with(doc, {"valid": True, "published": True})),
    ),
    ".venv/bin/aiworker run - --no-wait < examples/pipelines/hello.json": (
        None,
        contains("hello-"),
    ),
    "temporal workflow start --type PipelineWorkflow --task-queue aiworker-pipelines "
    "--workflow-id my-run --input-file examples/pipelines/hello.json": (None, contains("my-run")),
    "temporal workflow result --workflow-id my-run": (None, contains("COMPLETED", "succeeded")),
    ".venv/bin/aiworker run examples/pipelines/review.json --no-wait --id review-run": (
        None,
        contains("review-run"),
    ),
    ".venv/bin/aiworker list --status awaiting_review --tenant demo": (
        _awaiting_review,
        contains("review-run", "awaiting_review"),
    ),
    "temporal workflow query --workflow-id review-run --type progress": (
        None,
        contains("awaiting_review"),
    ),
    ".venv/bin/aiworker review review-run approve --outputs "
    '{"valid": true, "errors": []} --note checked by hand': (None, ok_json(_reviewed)),
    "temporal workflow result --workflow-id review-run": (None, contains("COMPLETED", "succeeded")),
    ".venv/bin/aiworker run examples/pipelines/broken.json --id broken-run": (
        None,
        matches(
            r"^hello-broken failed in ",
            r"^  prices +\S+ +failed +",
            r"^error: validation_failed: ",
            r"^workflow: broken-run$",
            rc=1,
        ),
    ),
    ".venv/bin/aiworker redrive broken-run": (
        None,
        matches(
            r"^  first +\S+ +succeeded \(reused\) +",
            r"^error: validation_failed: ",
            r"^workflow: broken-run-redrive-1$",
            rc=1,
        ),
    ),
    # rerun from the failed step with a corrected input: `first` reused, `prices` passes
    # (the key as shlex splits the line: the shell's quotes are gone)
    ".venv/bin/aiworker redrive broken-run --from prices --input "
    'prices={"data": [{"title": "Toaster", "price": 24}], "gate": true, "schema": '
    '{"type": "array", "items": {"properties": {"price": {"type": "number"}}}}}': (
        None,
        matches(
            r"^  first +\S+ +succeeded \(reused\) +",
            r"^  prices +\S+ +succeeded +",
            r"^workflow: broken-run-redrive-2$",
        ),
    ),
}

# `aiworker check` needs no server: its own test, so that it can be run alone.
EXPECT_CHECK: dict[str, Check] = {
    ".venv/bin/aiworker check examples/pipelines/hello.json": contains(
        "ok: examples/pipelines/hello.json (2 steps)"
    ),
    ".venv/bin/aiworker check examples/pipelines/typo.json": contains(
        "check", "input.data", "prodcut", rc=2
    ),
    # without a server: no history, each step named in what it could not estimate
    ".venv/bin/aiworker check --quote examples/pipelines/hello.json": contains(
        "quote for pipeline hello", "not estimated"
    ),
}


def checkout(tmp: Path) -> Path:
    """A directory laid out as the README assumes: `.venv/bin/` and `examples/`."""
    home = tmp / "checkout"
    bin_dir = home / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "aiworker").symlink_to(Path(sys.executable).parent / "aiworker")
    (bin_dir / "temporal").symlink_to(temporal_cli_path())
    (home / "examples").symlink_to(REPO / "examples")
    return home


def shell_env(home: Path, client: Client | None, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["PATH"] = f"{home / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["AIWORKER_DATA_DIR"] = str(data_dir)
    env["USER"] = "readme-test"
    if client is not None:
        env["TEMPORAL_ADDRESS"] = client.service_client.config.target_host
        env["TEMPORAL_NAMESPACE"] = client.namespace
    return env


async def sh(line: str, home: Path, env: dict[str, str]) -> Ran:
    proc = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", line],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def test_every_readme_pipeline_command_has_an_expectation() -> None:
    found = [key(line) for line in page_commands()]
    expected = set(EXPECT) | set(EXPECT_CHECK)
    assert [c for c in found if c not in expected] == [], "README commands without a test"
    assert sorted(expected - set(found)) == [], "tested commands the README no longer has"


async def test_readme_check_commands(tmp_path: Path) -> None:
    home = checkout(tmp_path)
    env = shell_env(home, None, tmp_path / "data")
    lines = [ln for ln in page_commands() if key(ln) in EXPECT_CHECK]
    assert len(lines) == len(EXPECT_CHECK)
    for line in lines:
        EXPECT_CHECK[key(line)](await sh(line, home, env))


async def test_readme_pipeline_commands_run_as_written(client: Client, tmp_path: Path) -> None:
    # The README names the queues without a suffix: this test's worker polls them.
    settings = stack_settings(tmp_path, task_queue_suffix="")
    home = checkout(tmp_path)
    env = shell_env(home, client, settings.data_dir)
    pipelines = PipelineClient(client, settings)
    lines = [ln for ln in page_commands() if key(ln) in EXPECT]
    assert len(lines) == len(EXPECT)
    async with running_stack(client, settings):
        for line in lines:
            before, check = EXPECT[key(line)]
            if before is not None:
                await before(pipelines)
            ran = await sh(line, home, env)
            try:
                check(ran)
            except AssertionError as e:
                raise AssertionError(f"README command failed its expectation: {line}\n{e}") from e
        # The README's note on fixed workflow ids: a second start under my-run
        # runs again, and its publish reports the first one's write as a duplicate.
        again = await sh(
            "temporal workflow start --type PipelineWorkflow --task-queue aiworker-pipelines "
            "--workflow-id my-run --input-file examples/pipelines/hello.json",
            home,
            env,
        )
        assert again.rc == 0, again.err
        result = await pipelines.result("my-run")
        save = result.steps["save"].outputs
        assert save["duplicate"] is True and save["published"] is False, save
        # three `aiworker run`s (ids of their own; the --no-wait one may still be
        # running) and my-run once, not twice
        sink = settings.data_dir / "sinks" / "demo" / "hello.jsonl"

        def records() -> int:
            return len(sink.read_text("utf-8").splitlines()) if sink.exists() else 0

        await wait_until(lambda: records() >= 4, "four hello records", timeout=30)
    assert records() == 4
    reviewed = settings.data_dir / "sinks" / "demo" / "reviewed.jsonl"
    assert len(reviewed.read_text("utf-8").splitlines()) == 1


@pytest.mark.parametrize("name", ["hello", "review", "broken", "scrape"])
def test_example_pipelines_pass_the_spec_check(name: str) -> None:
    from aiworker.config.catalog import load_specs
    from aiworker.schemas.pipeline_check import parse_pipeline

    raw = json.loads((REPO / "examples" / "pipelines" / f"{name}.json").read_text("utf-8"))
    assert parse_pipeline(raw, set(load_specs())).name == raw["name"]


def test_the_front_page_keeps_the_two_commands_and_a_first_pipeline() -> None:
    """The README is a front page: at most 300 lines, the two set-up commands
    (.ci/run runs `make test`), and a first pipeline's commands of its own."""
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 300
    blocks = "".join(re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M))
    assert re.search(r"^make demo\b", blocks, re.M) and re.search(r"^make test\b", blocks, re.M)
    own = {key(line) for line in readme_commands(text)}
    assert ".venv/bin/aiworker run examples/pipelines/hello.json" in own
    assert ".venv/bin/aiworker check examples/pipelines/hello.json" in own
