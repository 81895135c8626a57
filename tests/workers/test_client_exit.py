"""A script that runs a pipeline with ``PipelineClient`` and ends exits 0.

The script is the snippet of docs/running.md, read from the page, run as its
own process against the session's Temporal server and this test's workers,
whose ``default`` alias is the session's local model (an llm-call step). Each
run must print the result and exit 0: before the exit guard, a Temporal Core
thread still inside ``call_soon_threadsafe`` when the script ended made the
interpreter abort at finalization (``Fatal Python error: PyGILState_Release``,
exit 134) in about a third of the runs on a loaded machine.

The crash needs the race to fall the wrong way (the Core thread not scheduled
again before the script ends), so some runs widen it as a busy machine does:
their ``_write_to_self``, on a thread other than the main one, sleeps after
its byte is sent, as a Core thread that the kernel does not run again for a
while; without the guard every such run aborts. Every run also records what
causes the crash: an ``atexit`` hook registered before aiworker's (so it runs
after it, just before finalization) writes how many threads outside
:mod:`threading` are inside Python code then, which must be 0.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import Stack, running_stack
from support.procs import worker_env
from temporalio.client import Client

from aiworker.activities.llm import LanguageModel, load_registry
from aiworker.config.settings import Settings
from aiworker.workers.devstack.modelserver import ModelServer, with_local_model

RUNNING_MD = Path(__file__).parents[2] / "docs" / "running.md"
RUNS = 3  # as users run it
WIDENED_RUNS = 2
PIPELINE = {
    "name": "exit-check",
    "steps": [
        {
            "id": "say",
            "worker": "llm-call",
            "input": {"prompt": "Say hello in three words.", "max_tokens": 8},
        }
    ],
    "output": {"text": "${{ steps.say.outputs.text }}"},
}
# Registered before the snippet imports aiworker: atexit runs hooks last-in
# first-out, so this one sees what finalization will meet.
PROBE = """\
import atexit, sys, threading

def _native_threads_in_python():
    known = {t.ident for t in threading.enumerate()}
    busy = [i for i in sys._current_frames() if i not in known]
    sys.stderr.write(f"native threads in Python at exit: {len(busy)}\\n")

atexit.register(_native_threads_in_python)
"""
WIDEN = """\
import asyncio.selector_events as _se, time as _time

_write = _se.BaseSelectorEventLoop._write_to_self


def _write_then_stall(self):
    _write(self)
    if threading.get_ident() != threading.main_thread().ident:
        _time.sleep(0.3)  # a Core thread the kernel does not run again for a while


_se.BaseSelectorEventLoop._write_to_self = _write_then_stall
"""


def docs_snippet() -> str:
    """The Python block of docs/running.md that connects a ``PipelineClient``."""
    blocks = re.findall(r"```python\n(.*?)```", RUNNING_MD.read_text(encoding="utf-8"), re.S)
    (snippet,) = [b for b in blocks if "PipelineClient.connect()" in b]
    return str(snippet)


def script(widen: bool = False) -> str:
    """The docs snippet as a script: its ``pipeline_dict`` from argv, its top-level
    awaits in ``main``; with ``widen``, the race made wide (:data:`WIDEN`)."""
    body = textwrap.indent(docs_snippet(), "    ")
    return (
        f"{PROBE}\n{WIDEN if widen else ''}\nimport asyncio, json\n\n"
        f"pipeline_dict = json.loads(sys.argv[1])\n\n\nasync def main():\n{body}\n\n"
        "asyncio.run(main())\n"
    )


@pytest_asyncio.fixture
async def model_stack(
    client: Client, settings: Settings, local_model: ModelServer
) -> AsyncIterator[Stack]:
    # The snippet's client takes Settings(): the queues without a suffix, which
    # these workers poll (tests in one process run one at a time).
    real = with_local_model(settings.model_copy(update={"task_queue_suffix": ""}), local_model)
    lm = LanguageModel(load_registry(real, {}))
    try:
        async with running_stack(client, real, tools={"language_model": lm}) as stack:
            yield stack
    finally:
        await lm.aclose()


@pytest.mark.timeout(600)
async def test_the_docs_snippet_exits_0_after_a_run_with_a_model_step(
    client: Client, model_stack: Stack, tmp_path: Path
) -> None:
    plain, widened = tmp_path / "run_pipeline.py", tmp_path / "run_pipeline_busy.py"
    plain.write_text(script(), encoding="utf-8")
    widened.write_text(script(widen=True), encoding="utf-8")
    env = worker_env(client, model_stack.settings, tmp_path / "data")
    for run, path in enumerate([plain] * RUNS + [widened] * WIDENED_RUNS):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(path), json.dumps(PIPELINE)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
        said = (
            f"run {run + 1} ({path.name}): exit {done.returncode}\n"
            f"{done.stdout}\n{done.stderr[-3000:]}"
        )
        assert done.returncode == 0, said
        assert "Fatal Python error" not in done.stderr, said
        (line,) = done.stdout.splitlines()
        status, _, output = line.partition(" ")
        assert status in ("succeeded", "partial"), said  # max_tokens may cut the reply
        assert output.startswith("{'text': "), said
        assert "native threads in Python at exit: 0\n" in done.stderr, said
