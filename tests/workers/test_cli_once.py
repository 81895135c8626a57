"""A command connects to Temporal once, reads its settings once and checks a
pipeline once (issue: "one check, one connection"): counted in a real ``aiworker``
process, around the real functions, while the command runs against the session's
dev server and a running worker."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import Stack
from support.pipelines import one_step_pipeline

from aiworker.schemas import pipeline_check

# Runs main() once in a fresh interpreter with the three entry points counted: the
# SDK's Client.connect, Settings.from_env and the pipeline check (parse_pipeline,
# which every check of a whole pipeline goes through). Patched before aiworker's
# command modules import them, so every caller gets the counted function.
DRIVER = """
import json, os, sys
from collections import Counter

counts = Counter()

import temporalio.client as tc
_connect = tc.Client.connect.__func__
async def connect(cls, *a, **k):
    counts["connect"] += 1
    return await _connect(cls, *a, **k)
tc.Client.connect = classmethod(connect)

from aiworker.config import settings as st
_from_env = st.Settings.from_env.__func__
def from_env(cls, *a, **k):
    counts["settings"] += 1
    return _from_env(cls, *a, **k)
st.Settings.from_env = classmethod(from_env)

from aiworker.schemas import pipeline_check as pc
_parse = pc.parse_pipeline
def parse_pipeline(*a, **k):
    counts["check"] += 1
    return _parse(*a, **k)
pc.parse_pipeline = parse_pipeline

from aiworker.workers.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
with open(sys.argv[2], "w") as f:
    json.dump({"code": code, **counts}, f)
os._exit(0)  # as exit_process: no interpreter finalization under Core's threads
"""


async def counted(stack: Stack, argv: list[str], tmp_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIWORKER_", "TEMPORAL_"))}
    env["TEMPORAL_ADDRESS"] = stack.client.service_client.config.target_host
    env["AIWORKER_TASK_QUEUE_SUFFIX"] = stack.settings.task_queue_suffix
    env["AIWORKER_DATA_DIR"] = str(tmp_path / "data")
    out = tmp_path / f"counts-{argv[0]}.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        json.dumps(argv),
        str(out),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["stderr"] = err.decode()
    return doc


async def test_run_connects_once_reads_settings_once_and_checks_once(
    stack: Stack, tmp_path: Path
) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(one_step_pipeline("once")))
    doc = await counted(stack, ["run", str(f), "--json"], tmp_path)
    assert doc["code"] == 0, doc["stderr"]
    assert (doc.get("connect"), doc.get("settings"), doc.get("check")) == (1, 1, 1), doc


async def test_check_and_quote_connect_once(stack: Stack, tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(one_step_pipeline("once")))
    for argv in (["check", str(f)], ["check", "--quote", str(f)]):
        doc = await counted(stack, argv, tmp_path)
        assert doc["code"] == 0, doc["stderr"]
        assert (doc.get("connect"), doc.get("settings"), doc.get("check")) == (1, 1, 1), (
            argv,
            doc,
        )


async def test_a_schedule_is_created_over_the_connection_that_checked_it(
    stack: Stack, tmp_path: Path
) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps(one_step_pipeline("once")))
    sid = f"once-{os.getpid()}-{id(tmp_path):x}"
    doc = await counted(
        stack, ["schedule", "create", str(f), "--schedule-id", sid, "--interval", "1h"], tmp_path
    )
    try:
        assert doc["code"] == 0, doc["stderr"]
        assert (doc.get("connect"), doc.get("settings"), doc.get("check")) == (1, 1, 1), doc
    finally:
        await stack.client.get_schedule_handle(sid).delete()


async def test_a_run_checks_its_pipeline_once_in_its_worker(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half of "checked once where it is started and once in its run":
    the worker (in this process) checks a started pipeline only in the run's
    run-config activity, never in its workflow task as well. Counted around
    ``check_pipeline``, which every check of a whole pipeline goes through (the
    workflow imports the module passed through its sandbox: the same function)."""
    checks: list[str] = []
    real = pipeline_check.check_pipeline

    def check_pipeline(spec: Any, *a: Any, **k: Any) -> Any:
        checks.append(spec.name)
        return real(spec, *a, **k)

    monkeypatch.setattr(pipeline_check, "check_pipeline", check_pipeline)
    name = f"once-{uuid.uuid4().hex[:6]}"
    handle = await stack.start(one_step_pipeline(name))
    result = await handle.result()
    assert result.status == "succeeded", result
    assert checks.count(name) == 1, checks
