"""``aiworker run`` while a step's model reply streams: the live line on a
terminal and the plain lines in a pipe quote it (tokens so far, the last
words), read from the running attempt's heartbeat details. The model is the
slow SSE fake of ``fixtures/llm_fakes.py``; the workers run the real llm-call."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import running_stack
from fixtures.llm_fakes import FakeProvider, fake  # noqa: F401  (fake: the module fixture)
from temporalio.client import Client
from test_cli_progress import AIWORKER, cli_env, run_on_terminal

from aiworker.activities.llm import LanguageModel, load_registry
from aiworker.config.settings import Settings


def pipeline_file(tmp_path: Path, name: str) -> Path:
    pipeline = {
        "name": name,
        "steps": [
            {
                "id": "summarize",
                "worker": "llm-call",
                "input": {"model": "slow", "prompt": "how do I brew tea?", "stream": True},
            }
        ],
        "output": {"summary": "${{ steps.summarize.outputs.text }}"},
    }
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(pipeline))
    return f


@pytest.mark.timeout(120)
async def test_run_quotes_a_streaming_reply_on_a_terminal_and_in_a_pipe(
    client: Client, settings: Settings, tmp_path: Path, fake: FakeProvider
) -> None:
    models = {"slow": {"provider": "openai", "base_url": fake.root + "/v1", "model": "slow@x"}}
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    lm = LanguageModel(load_registry(settings.model_copy(update={"models_file": path}), {}))
    tty_file, pipe_file = pipeline_file(tmp_path, "tty"), pipeline_file(tmp_path, "pipe")
    try:
        async with running_stack(client, settings, tools={"language_model": lm}) as stack:
            env = cli_env(stack)

            def piped() -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    [AIWORKER, "run", str(pipe_file)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            (code, screen), done = await asyncio.gather(
                asyncio.to_thread(run_on_terminal, ["run", str(tty_file)], env),
                asyncio.to_thread(piped),
            )
    finally:
        await lm.aclose()
    assert code == 0, screen
    frames = re.findall(r"\r([^\r\n\x1b]*)\x1b\[K", screen)
    quoted = [f for f in frames if re.search(r'summarize: \d+ tokens "[^"]+"', f)]
    assert quoted, frames
    assert "running: summarize" not in quoted[-1]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    said = [
        ln for ln in lines if re.fullmatch(r'\[ +\d+\.\ds\] summarize: \d+ tokens? "[^"]+"', ln)
    ]
    assert said, done.stdout
    # one line, or (a long output) one per field
    assert any(
        ln.startswith(("output: ", "output.summary: ")) and "Water boils" in ln for ln in lines
    ), done.stdout
